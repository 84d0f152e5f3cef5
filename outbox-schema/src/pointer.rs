//! JSON pointers (RFC 6901) and their form inside a `$ref` URI fragment (percent-encoded).

/// Escapes one JSON pointer token: `~` becomes `~0`, `/` becomes `~1`.
///
/// ```
/// use outbox_schema::pointer::escape_token;
///
/// assert_eq!(escape_token("a/b~c"), "a~1b~0c");
/// assert_eq!(format!("/properties/{}", escape_token("x/y")), "/properties/x~1y");
/// ```
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The token an escaped pointer token stands for (`~1` before `~0`, as RFC 6901 says, so
/// `~01` is `~1`).
pub(crate) fn unescape_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// A pointer token ready for a `$ref` URI fragment.
pub(crate) fn encode_token(token: &str) -> String {
    percent_encode(&escape_token(token))
}

/// A whole pointer ready for a `$ref` URI fragment.
pub(crate) fn encode_pointer(pointer: &str) -> String {
    percent_encode(pointer)
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~$!&'()*+,;=:@".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A URI fragment back to the pointer it encodes. A `%` not followed by two hex digits is kept
/// as it is.
///
/// ```
/// use outbox_schema::pointer::percent_decode;
///
/// assert_eq!(percent_decode("/$defs/Prix%20%E2%82%AC"), "/$defs/Prix €");
/// ```
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(byte) = u8::from_str_radix(hex, 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_escape_and_unescape() {
        assert_eq!(escape_token("a/b c"), "a~1b c");
        assert_eq!(escape_token("~/"), "~0~1");
        assert_eq!(unescape_token("~0~1"), "~/");
        // `~01` is an escaped `~` followed by `1`, not an escaped `/`.
        assert_eq!(unescape_token("~01"), "~1");
        for token in ["plain", "a/b", "~", "~1", "x~0y/z"] {
            assert_eq!(unescape_token(&escape_token(token)), token);
        }
    }

    #[test]
    fn fragments_encode_and_decode() {
        assert_eq!(encode_token("a/b c"), "a~1b%20c");
        assert_eq!(encode_pointer("/$defs/Money"), "/$defs/Money");
        assert_eq!(encode_pointer("/$defs/Prix €"), "/$defs/Prix%20%E2%82%AC");
        assert_eq!(percent_decode("/$defs/A%20B"), "/$defs/A B");
        assert_eq!(percent_decode("/$defs/Prix%20%E2%82%AC"), "/$defs/Prix €");
        for pointer in ["/$defs/A B", "/a~1b/ü", "/x%y", ""] {
            assert_eq!(percent_decode(&encode_pointer(pointer)), pointer);
        }
    }

    #[test]
    fn stray_percent_signs_stay() {
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%2"), "%2");
        assert_eq!(percent_decode("%zz/a"), "%zz/a");
        assert_eq!(percent_decode("a%41"), "aA");
    }
}
