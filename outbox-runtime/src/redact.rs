//! Secrets and payload values out of messages: the one redaction of connection URLs used by
//! every error and log line of this crate, of the `outbox` command and of the example service,
//! and the one way a payload's decoding error is worded (the rule broken, not the value).
//!
//! What of a payload may appear in a log line, an error or a header is written down in
//! `docs/payloads-in-logs.md`: the event's id, type, source and subject, the JSON pointer of a
//! field and the rule it breaks, never a value from `data`.

/// `url` with every secret replaced by `***`: the password of its user part, and the value of
/// every query parameter whose name ends in `password` (`password=`, `sslpassword=`, any
/// case). A NATS URL's lone user part is a token, so it is replaced too. A comma-separated list
/// of URLs (a NATS cluster's) has each of its URLs redacted.
///
/// A user part ends at the last `@` before the query, so a password with an unescaped `/` or
/// `@` is still hidden whole.
///
/// ```
/// use outbox_runtime::redact;
///
/// assert_eq!(
///     redact::url("postgres://app:s3cret@db:5432/billing?sslmode=require"),
///     "postgres://app:***@db:5432/billing?sslmode=require"
/// );
/// assert_eq!(
///     redact::url("postgres://app@db/billing?password=s3cret&sslmode=verify-full&sslpassword=k3y"),
///     "postgres://app@db/billing?password=***&sslmode=verify-full&sslpassword=***"
/// );
/// assert_eq!(redact::url("nats://tok3n@127.0.0.1:4222"), "nats://***@127.0.0.1:4222");
/// assert_eq!(
///     redact::url("nats://a:p1@n1:4222,nats://b:p2@n2:4222"),
///     "nats://a:***@n1:4222,nats://b:***@n2:4222"
/// );
/// ```
pub fn url(url: &str) -> String {
    if url.matches("://").count() > 1 {
        return url.split(',').map(one_url).collect::<Vec<_>>().join(",");
    }
    one_url(url)
}

fn one_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.find('?') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (authority, path) = match before_query.rsplit_once('@') {
        // the user part ends at the last `@` before the query
        Some((userinfo, host_and_path)) => {
            let userinfo = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None if scheme.starts_with("nats") || scheme == "tls" => "***".to_owned(),
                None => userinfo.to_owned(),
            };
            (format!("{userinfo}@"), host_and_path)
        }
        None => (String::new(), before_query),
    };
    let query = match query.strip_prefix('?') {
        Some(pairs) => {
            let pairs = pairs
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if is_secret_key(key) => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect::<Vec<_>>()
                .join("&");
            format!("?{pairs}")
        }
        None => String::new(),
    };
    format!("{scheme}://{authority}{path}{query}")
}

/// A query parameter that carries a secret: `password`, `sslpassword`, and any other name
/// ending in `password`.
fn is_secret_key(key: &str) -> bool {
    key.to_ascii_lowercase().ends_with("password")
}

/// The secrets of `url` (see [`url`]), as written and percent-decoded.
fn secrets(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    for one in url.split(',') {
        let Some((_, rest)) = one.split_once("://") else {
            continue;
        };
        let (before_query, query) = match rest.find('?') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if let Some((userinfo, _)) = before_query.rsplit_once('@') {
            match userinfo.split_once(':') {
                Some((_, password)) => found.push(password.to_owned()),
                None if one.starts_with("nats") || one.starts_with("tls") => {
                    found.push(userinfo.to_owned())
                }
                None => {}
            }
        }
        for pair in query.trim_start_matches('?').split('&') {
            if let Some((key, value)) = pair.split_once('=') {
                if is_secret_key(key) {
                    found.push(value.to_owned());
                }
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
    found.extend(decoded);
    found.retain(|s| !s.is_empty());
    // longest first, so that a secret containing another is replaced whole
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found.dedup();
    found
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` (an error message that may quote it) without the secrets of `url`: its user part's
/// password and every `…password=` query value, as written or percent-decoded.
///
/// ```
/// assert_eq!(
///     outbox_runtime::redact::password_in("auth failed: s3cret", "postgres://a:s3cret@h/db"),
///     "auth failed: ***"
/// );
/// assert_eq!(
///     outbox_runtime::redact::password_in("bad key p@ss", "postgres://a@h/db?sslpassword=p%40ss"),
///     "bad key ***"
/// );
/// ```
pub fn password_in(text: &str, url: &str) -> String {
    let mut text = text.to_owned();
    for secret in secrets(url) {
        text = text.replace(&secret, "***");
    }
    text
}

/// A `serde_json` error from decoding a payload, without the value it quotes: serde words a
/// type or value mismatch as ``invalid type: string "4111 1111 1111 1111", expected u64``; this
/// keeps what was expected and where (line and column), and drops the value. A type's own
/// message (a `Uuid` or a date that does not parse) may quote the value too, so it is replaced
/// by a sentence saying so; serde's messages about fields (missing, unknown, duplicate) name
/// only fields and are kept, as are syntax errors, which quote nothing.
///
/// ```
/// let e = serde_json::from_str::<u64>(r#""4111 1111 1111 1111""#).unwrap_err();
/// let text = outbox_runtime::redact::decode_error(&e);
/// assert!(!text.contains("4111"), "{text}");
/// assert!(text.contains("expected u64"), "{text}");
/// ```
pub fn decode_error(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if error.classify() != serde_json::error::Category::Data {
        return text;
    }
    let at = if error.line() > 0 {
        format!(" at line {} column {}", error.line(), error.column())
    } else {
        String::new()
    };
    for prefix in [
        "invalid type: ",
        "invalid value: ",
        "unknown variant ",
        "invalid length ",
    ] {
        if let Some(rest) = text.strip_prefix(prefix) {
            // the value comes first; what was expected is serde's own words, after the last
            // ", expected" (a value could contain the phrase, the expectation does not)
            return match rest.rfind(", expected") {
                Some(i) => format!("{prefix}(value not shown){}", &rest[i..]),
                None => format!("{prefix}(value not shown){at}"),
            };
        }
    }
    if ["missing field ", "unknown field ", "duplicate field "]
        .iter()
        .any(|p| text.starts_with(p))
    {
        return text;
    }
    format!(
        "a value does not parse as its field's type (the type's own message is not shown, as it \
         may quote the value){at}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_everything_but_the_secrets() {
        for (given, expected) in [
            ("nats://u:p@127.0.0.1:4222", "nats://u:***@127.0.0.1:4222"),
            (
                "postgres://root@127.0.0.1/test",
                "postgres://root@127.0.0.1/test",
            ),
            ("not a url", "not a url"),
            (
                "postgres://h/db?sslmode=require&password=x&user=a",
                "postgres://h/db?sslmode=require&password=***&user=a",
            ),
            (
                "postgres://h/db?PASSWORD=x&sslpassword=y&sslkey=/k.pem",
                "postgres://h/db?PASSWORD=***&sslpassword=***&sslkey=/k.pem",
            ),
            // a password with an unescaped `/` or `@` is hidden whole
            ("postgres://u:pa/ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p@ss@h:5432/db", "postgres://u:***@h:5432/db"),
            ("nats://tok3n@h", "nats://***@h"),
            (
                "nats://a:p1@n1:4222,nats://b:p2@n2:4222,nats://n3:4222",
                "nats://a:***@n1:4222,nats://b:***@n2:4222,nats://n3:4222",
            ),
            ("postgres://h?password=", "postgres://h?password=***"),
        ] {
            assert_eq!(url(given), expected, "{given}");
        }
    }

    #[test]
    fn error_texts_lose_the_password_wherever_the_url_had_it() {
        for (text, from, expected) in [
            (
                "password authentication failed: s3cret",
                "postgres://a:s3cret@h/db",
                "password authentication failed: ***",
            ),
            (
                "bad password hunter2",
                "postgres://a@h/db?sslmode=require&password=hunter2",
                "bad password ***",
            ),
            ("no secret here", "postgres://a@h/db", "no secret here"),
            // percent-encoded in the URL, decoded in the message
            (
                "rejected p@ss w",
                "postgres://a:p%40ss+w@h/db",
                "rejected ***",
            ),
            ("token t0k", "nats://t0k@h:4222", "token ***"),
        ] {
            assert_eq!(password_in(text, from), expected, "{from}");
        }
    }

    #[test]
    fn decoding_errors_keep_the_expectation_and_drop_the_value() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        enum Plan {
            Pro,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Payload {
            seats: u8,
            plan: Option<Plan>,
        }
        for (json, kept) in [
            (r#"{"seats": "s3cret, expected nothing"}"#, "expected u8"),
            (r#"{"seats": 4242}"#, "expected u8"),
            (r#"{"seats": 1, "plan": "s3cret"}"#, "expected `Pro`"),
            (r#"{"plan": null}"#, "missing field `seats`"),
            (r#"{"seats": 1, "plan": "Pro", "#, "EOF while parsing"),
        ] {
            let e = serde_json::from_str::<Payload>(json).unwrap_err();
            let text = decode_error(&e);
            assert!(!text.contains("s3cret") && !text.contains("4242"), "{text}");
            assert!(text.contains(kept), "{json}: {text}");
        }
        // a type's own message quotes the value: replaced whole
        let e = serde_json::from_str::<std::net::IpAddr>(r#""s3cret""#).unwrap_err();
        let text = decode_error(&e);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("does not parse as its field's type"),
            "{text}"
        );
    }
}
