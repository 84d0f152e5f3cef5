//! The naming rules of docs/event-naming.md (`outbox_schema::naming`) that make an event type
//! publishable, for what the compiler cannot check: rows written by hand, which the relay
//! reads, and the event types `emit_raw` takes.

use std::borrow::Cow;

pub(crate) use outbox_schema::naming::check_publishable as check_event_type;

/// `value` cut to a length that fits a log line, a metric label or an error message.
pub(crate) fn shorten(value: &str) -> Cow<'_, str> {
    const SHOWN: usize = 80;
    if value.len() <= SHOWN {
        return Cow::Borrowed(value);
    }
    let mut end = SHOWN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_relay_must_not_publish_is_refused() {
        assert!(check_event_type("billing.invoice.paid").is_ok());
        assert!(
            check_event_type("t1f2e3.billing.invoice.paid").is_ok(),
            "a prefixed type is a subject"
        );
        for bad in [
            "acme.order.*",
            "acme.>",
            "$JS.API.INFO",
            "a b.c.d",
            "",
            "a..b",
            ".a",
            "a\u{7}b",
        ] {
            assert!(check_event_type(bad).is_err(), "{bad}");
        }
        let why = check_event_type(&format!("a.b.{}", "c".repeat(5_000))).unwrap_err();
        assert!(why.contains("5004 bytes"), "{why}");
    }

    #[test]
    fn long_values_are_shortened_for_messages() {
        assert_eq!(shorten("short"), "short");
        let long = "é".repeat(100);
        let shown = shorten(&long);
        assert!(
            shown.ends_with("(200 bytes)") && shown.len() < 200,
            "{shown}"
        );
    }
}
