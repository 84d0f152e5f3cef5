//! `.consumes(..)` patterns: NATS-style subject patterns over event types (`*` one token,
//! a final `>` one or more).

/// Checks a `.consumes` pattern: tokens of `[a-z0-9_]`, `*`, or a final `>`.
pub(crate) fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("it is empty; use a pattern like `payments.*.*` or `payments.>`".into());
    }
    let tokens: Vec<&str> = pattern.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        match *token {
            "*" => {}
            ">" if i + 1 == tokens.len() => {}
            ">" => {
                return Err(
                    "`>` matches the rest of the event type, so it must be the last token".into(),
                )
            }
            "" => {
                return Err(
                    "it has an empty token (two dots in a row, or a leading or trailing dot)"
                        .into(),
                )
            }
            t if t.starts_with(|c: char| c.is_ascii_lowercase())
                && t.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') => {}
            t => {
                return Err(format!(
                    "the token `{t}` is neither `*`, `>` nor a lowercase token `[a-z][a-z0-9_]*`"
                ))
            }
        }
    }
    Ok(())
}

/// Whether the NATS-style `pattern` matches `event_type`.
pub(crate) fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    let mut tokens = event_type.split('.');
    for p in pattern.split('.') {
        if p == ">" {
            return tokens.next().is_some();
        }
        match tokens.next() {
            Some(t) if p == "*" || p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_like_nats() {
        assert!(pattern_matches("payments.*.*", "payments.invoice.paid"));
        assert!(pattern_matches("payments.>", "payments.invoice.paid"));
        assert!(pattern_matches("payments.>", "payments.invoice.paid.v2"));
        assert!(pattern_matches("*.invoice.paid", "payments.invoice.paid"));
        assert!(pattern_matches(
            "payments.invoice.paid",
            "payments.invoice.paid"
        ));
        assert!(!pattern_matches("payments.*", "payments.invoice.paid"));
        assert!(!pattern_matches("payments.*.*", "payments.invoice.paid.v2"));
        assert!(!pattern_matches("billing.>", "payments.invoice.paid"));
        assert!(!pattern_matches(
            "payments.invoice.paid.>",
            "payments.invoice.paid"
        ));
    }

    #[test]
    fn patterns_are_checked() {
        assert_eq!(check_pattern("payments.*.*"), Ok(()));
        assert_eq!(check_pattern("payments.>"), Ok(()));
        for (bad, says) in [
            ("", "empty"),
            ("payments.>.x", "last token"),
            ("payments..x", "empty token"),
            ("Payments.*", "`Payments`"),
            ("payments.inv*", "`inv*`"),
        ] {
            let err = check_pattern(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
