//! The naming rules of `docs/event-naming.md`, in one place: the codegen, the derive and the
//! CLI all call these.

/// The suffix of an event schema file: `<event_type>.schema.json`.
pub const SCHEMA_SUFFIX: &str = ".schema.json";

/// The schema keyword that names the subject property.
pub const SUBJECT_KEYWORD: &str = "x-outbox-subject";

/// The longest event type, in bytes: a NATS subject must fit the server's control line
/// (4 KiB) with room to spare, and no sensible type comes near it.
pub const MAX_EVENT_TYPE_LEN: usize = 255;

/// Checks the part of the rules that makes an event type publishable at all: one NATS subject
/// the relay may send to and a subscriber's filter can match. Non-empty, at most
/// [`MAX_EVENT_TYPE_LEN`] bytes, no wildcards (`*`, `>`), no `$`, no whitespace or control
/// characters, no empty tokens. The relay holds a row that breaks these (rows are written by
/// hand too), and `emit_raw` refuses it; the full rules ([`check_event_type`]) are for the
/// contract's schema files, checked at build time.
///
/// The error says what is wrong in words that fit after "invalid event type `x`: ".
///
/// ```
/// use outbox_schema::naming::check_publishable;
///
/// assert!(check_publishable("billing.subscription.created").is_ok());
/// assert!(check_publishable("tenant7.billing.subscription.created").is_ok());
/// assert!(check_publishable("acme.order.*").is_err());
/// assert!(check_publishable("acme..order").is_err());
/// ```
pub fn check_publishable(event_type: &str) -> Result<(), String> {
    if event_type.len() > MAX_EVENT_TYPE_LEN {
        return Err(format!(
            "it has {} bytes; an event type has at most {MAX_EVENT_TYPE_LEN}",
            event_type.len()
        ));
    }
    if event_type.is_empty() {
        return Err("it is empty; expected `<domain>.<entity>.<action>`".into());
    }
    if let Some(c) = event_type
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '*' | '>' | '$'))
    {
        let what = match c {
            '*' | '>' => format!("`{c}` is a NATS wildcard"),
            '$' => "`$` is reserved for NATS system subjects".to_owned(),
            c if c.is_whitespace() => "whitespace is not allowed".to_owned(),
            _ => "control characters are not allowed".to_owned(),
        };
        return Err(format!(
            "{what}; an event type names exactly one subject, like `billing.subscription.created`"
        ));
    }
    if event_type.split('.').any(str::is_empty) {
        return Err(
            "it has an empty token (two dots in a row, or a leading or trailing dot)".into(),
        );
    }
    Ok(())
}

/// The old name of [`check_publishable`], which goes in the next release: a subject is an
/// event's entity key (`x-outbox-subject`), and this checks an event type.
///
/// ```
/// #![allow(deprecated)]
/// assert!(outbox_schema::naming::check_subject("acme.order.*").is_err());
/// ```
#[deprecated(
    since = "0.1.0",
    note = "renamed `check_publishable` (a subject is an event's entity key); this name goes in the next release"
)]
pub fn check_subject(event_type: &str) -> Result<(), String> {
    check_publishable(event_type)
}

/// Checks an event type: `<domain>.<entity>.<action>` with an optional `.v<N>` (N >= 2) suffix;
/// tokens are lowercase ASCII `[a-z][a-z0-9_]*`; at most [`MAX_EVENT_TYPE_LEN`] bytes.
///
/// The error says what is wrong in words that fit after "invalid event type `x`: ".
///
/// ```
/// use outbox_schema::naming::check_event_type;
///
/// assert!(check_event_type("billing.subscription.created").is_ok());
/// assert!(check_event_type("billing.subscription.created.v2").is_ok());
/// assert!(check_event_type("billing.subscription").is_err());
/// assert!(check_event_type("billing.*.created").is_err());
/// assert!(check_event_type(&format!("a.b.{}", "c".repeat(300))).is_err());
/// ```
pub fn check_event_type(event_type: &str) -> Result<(), String> {
    check_publishable(event_type)?;
    let tokens: Vec<&str> = event_type.split('.').collect();
    let versioned = tokens.len() == 4 && is_version(tokens[3]);
    let names = if versioned { &tokens[..3] } else { &tokens[..] };
    if tokens.len() == 4 && !versioned {
        return Err(format!(
            "the fourth token `{}` must be a major version `v<N>` with N >= 2 (like `v2`)",
            tokens[3]
        ));
    }
    if names.len() != 3 {
        return Err(format!(
            "it has {} token{}; expected `<domain>.<entity>.<action>` with an optional `.v<N>` suffix",
            tokens.len(),
            if tokens.len() == 1 { "" } else { "s" }
        ));
    }
    for (token, role) in names.iter().zip(["domain", "entity", "action"]) {
        check_token(token).map_err(|why| format!("the {role} token `{token}` {why}"))?;
    }
    Ok(())
}

fn is_version(token: &str) -> bool {
    token
        .strip_prefix('v')
        .and_then(|n| {
            (!n.starts_with('0') && n.chars().all(|c| c.is_ascii_digit()))
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
        .is_some_and(|n| n >= 2)
}

fn check_token(token: &str) -> Result<(), &'static str> {
    let mut chars = token.chars();
    match chars.next() {
        None => Err("is empty (two dots in a row, or a leading or trailing dot)"),
        Some(c) if c.is_ascii_uppercase() => {
            Err("has an uppercase letter; tokens are lowercase ASCII `[a-z][a-z0-9_]*`")
        }
        Some(c) if !c.is_ascii_lowercase() => {
            Err("must start with a lowercase ASCII letter (`[a-z][a-z0-9_]*`)")
        }
        Some(_) => {
            if chars.clone().any(|c| c.is_ascii_uppercase()) {
                Err("has an uppercase letter; tokens are lowercase ASCII `[a-z][a-z0-9_]*`")
            } else if chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
                Ok(())
            } else {
                Err("has a character outside `[a-z0-9_]`")
            }
        }
    }
}

/// Checks a schema `title` as a Rust type name: an ASCII identifier in UpperCamelCase that is
/// not a keyword.
///
/// ```
/// use outbox_schema::naming::check_type_name;
///
/// assert!(check_type_name("SubscriptionCreated").is_ok());
/// assert!(check_type_name("subscription created").is_err());
/// ```
pub fn check_type_name(title: &str) -> Result<(), String> {
    let mut chars = title.chars();
    match chars.next() {
        None => return Err("it is empty".into()),
        Some(c) if !c.is_ascii_uppercase() => {
            return Err("a Rust type name starts with an uppercase ASCII letter (UpperCamelCase, like `SubscriptionCreated`)".into())
        }
        _ => {}
    }
    if let Some(c) = chars.find(|c| !c.is_ascii_alphanumeric()) {
        return Err(format!(
            "`{c}` is not allowed; use an UpperCamelCase ASCII identifier like `SubscriptionCreated`"
        ));
    }
    if matches!(title, "Self") {
        return Err("`Self` is a Rust keyword".into());
    }
    Ok(())
}

/// The schema file name of an event type: `<event_type>.schema.json`.
pub fn schema_file_name(event_type: &str) -> String {
    format!("{event_type}{SCHEMA_SUFFIX}")
}

/// The next major version of an event type: `.v2` appended to an unversioned type, `.v<N+1>`
/// in place of `.v<N>`. A breaking change to a released type is published under this name,
/// beside the old one.
///
/// ```
/// use outbox_schema::naming::next_major;
///
/// assert_eq!(next_major("billing.invoice.paid"), "billing.invoice.paid.v2");
/// assert_eq!(next_major("billing.invoice.paid.v2"), "billing.invoice.paid.v3");
/// ```
pub fn next_major(event_type: &str) -> String {
    let tokens: Vec<&str> = event_type.split('.').collect();
    if tokens.len() == 4 && is_version(tokens[3]) {
        if let Some(n) = tokens[3][1..]
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_add(1))
        {
            return format!("{}.v{n}", tokens[..3].join("."));
        }
    }
    format!("{event_type}.v2")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types() {
        for ok in [
            "billing.subscription.created",
            "billing.subscription.plan_changed",
            "a.b.c",
            "id2.x_1.y9.v2",
            "billing.subscription.created.v10",
        ] {
            assert_eq!(check_event_type(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("", "empty"),
            ("Billing.subscription.created", "uppercase"),
            ("billing.subscriptionCreated.x", "uppercase"),
            ("billing.*.created", "wildcard"),
            ("billing.subscription.>", "wildcard"),
            ("billing.$sys.created", "reserved"),
            ("billing.subscription created.x", "whitespace"),
            ("billing.subscription", "2 tokens"),
            ("billing", "1 token;"),
            ("billing.subscription.created.v1", "N >= 2"),
            ("billing.subscription.created.v02", "N >= 2"),
            ("billing.subscription.created.extra", "major version"),
            ("a.b.c.d.e", "5 tokens"),
            ("billing..created", "empty"),
            ("billing.1sub.created", "start with a lowercase"),
            ("billing.sub-x.created", "outside"),
        ] {
            let err = check_event_type(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn next_majors_are_valid_types() {
        for (from, to) in [
            ("a.b.c", "a.b.c.v2"),
            ("a.b.c.v2", "a.b.c.v3"),
            ("a.b.c.v9", "a.b.c.v10"),
        ] {
            assert_eq!(next_major(from), to);
            assert_eq!(check_event_type(to), Ok(()), "{to}");
        }
    }

    #[test]
    fn type_names() {
        assert_eq!(check_type_name("PlanChanged2"), Ok(()));
        for (bad, says) in [
            ("", "empty"),
            ("planChanged", "uppercase"),
            ("Plan Changed", "` `"),
            ("Plan_Changed", "`_`"),
            ("Self", "keyword"),
        ] {
            let err = check_type_name(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
