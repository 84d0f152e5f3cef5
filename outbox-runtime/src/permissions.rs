//! The NATS permissions a relay's user needs, and no more (docs/operations.md, *NATS
//! permissions*): publish on the event types' subjects and on the JetStream API subjects the
//! relay uses for its streams, subscribe to its replies and to its streams' election advisories.

use std::fmt;

/// The subject the relay's round trips through the server go to (`<prefix>.<id>`): the relay
/// publishes a message to itself there every second to know that the server answers
/// (docs/relay.md, *Several relays*).
pub const ECHO_PREFIX: &str = "_OUTBOX.echo";

/// A relay user's NATS permissions, for a server's configuration ([`RelayPermissions::new`]).
///
/// ```
/// let permissions = outbox_runtime::RelayPermissions::new("BILLING", ["billing.>"]);
/// assert!(permissions.publish.contains(&"billing.>".to_owned()));
/// assert!(permissions.to_string().starts_with("permissions: {"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayPermissions {
    /// Subjects the relay publishes to.
    pub publish: Vec<String>,
    /// Subjects the relay subscribes to.
    pub subscribe: Vec<String>,
}

impl RelayPermissions {
    /// The permissions of a relay that publishes `event_types` (subjects or wildcards) into
    /// `stream`:
    ///
    /// - publish: the event types; `$JS.API.INFO` (the start-up check of the account);
    ///   `$JS.API.STREAM.NAMES` (which stream captures a type); the stream's
    ///   `$JS.API.STREAM.INFO.<stream>` (its settings and leader) and
    ///   `$JS.API.STREAM.MSG.GET.<stream>` (a duplicate ack checked on servers before 2.11);
    ///   the relay's round trips, `_OUTBOX.echo.>`;
    /// - subscribe: its replies, `_INBOX.>`; its round trips; the streams' leader-election
    ///   advisories (of every stream of the account: the relay listens to them all, they name
    ///   streams and leaders only).
    pub fn new<S: Into<String>>(
        stream: &str,
        event_types: impl IntoIterator<Item = S>,
    ) -> RelayPermissions {
        let mut publish: Vec<String> = event_types.into_iter().map(Into::into).collect();
        publish.extend([
            "$JS.API.INFO".to_owned(),
            "$JS.API.STREAM.NAMES".to_owned(),
            format!("$JS.API.STREAM.INFO.{stream}"),
            format!("$JS.API.STREAM.MSG.GET.{stream}"),
            format!("{ECHO_PREFIX}.>"),
        ]);
        let subscribe = vec![
            "_INBOX.>".to_owned(),
            format!("{ECHO_PREFIX}.>"),
            "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.*".to_owned(),
            "$JS.EVENT.ADVISORY.STREAM.QUORUM_LOST.*".to_owned(),
        ];
        RelayPermissions { publish, subscribe }
    }
}

/// The `permissions` block of a user in a nats-server configuration file.
impl fmt::Display for RelayPermissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |subjects: &[String]| {
            subjects
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(f, "permissions: {{")?;
        writeln!(f, "  publish: {{ allow: [{}] }}", list(&self.publish))?;
        writeln!(f, "  subscribe: {{ allow: [{}] }}", list(&self.subscribe))?;
        write!(f, "}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_may_publish_its_event_types_and_its_streams_api_only() {
        let p = RelayPermissions::new("BILLING", ["billing.>", "payments.invoice.paid"]);
        assert_eq!(
            p.publish,
            [
                "billing.>",
                "payments.invoice.paid",
                "$JS.API.INFO",
                "$JS.API.STREAM.NAMES",
                "$JS.API.STREAM.INFO.BILLING",
                "$JS.API.STREAM.MSG.GET.BILLING",
                "_OUTBOX.echo.>",
            ]
        );
        assert!(!p
            .publish
            .iter()
            .any(|s| s == ">" || s.starts_with("$JS.API.>")));
        assert!(p
            .to_string()
            .contains(r#"subscribe: { allow: ["_INBOX.>", "_OUTBOX.echo.>""#));
    }
}
