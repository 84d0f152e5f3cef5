//! What a `$ref` string says: the file it names (relative to the file it is written in) and the
//! JSON pointer in that file. Remote references and anchors are refused; inside data keywords
//! (`enum`, `const`, ...) a `$ref` key is data, not a reference.

use crate::pointer::percent_decode;

/// A `$ref` split into its file part (empty for the same document) and its decoded JSON
/// pointer (empty for the whole document). Remote references and anchors are refused.
pub(crate) fn split_reference(reference: &str) -> Result<(&str, String), String> {
    if has_scheme(reference) {
        return Err(format!(
            "remote reference `{reference}` is not supported; copy the definition into a `.json` file under the schema folder and refer to it by relative path (like `defs/common.json#/$defs/Name`)"
        ));
    }
    let (file_part, fragment) = reference.split_once('#').unwrap_or((reference, ""));
    let pointer = percent_decode(fragment);
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(format!(
            "`$ref` fragment `#{fragment}` is an anchor; use a JSON pointer like `#/$defs/Name`"
        ));
    }
    Ok((file_part, pointer))
}

/// Keywords whose values are data, not schemas: a `$ref` key inside them is not a reference.
pub(crate) fn is_data_keyword(key: &str) -> bool {
    matches!(key, "enum" | "const" | "default" | "examples")
}

/// Whether `reference` starts with a URI scheme (`https:`, `urn:`, ...).
fn has_scheme(reference: &str) -> bool {
    match reference.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && !scheme.contains(['/', '#', '?'])
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_file_and_pointer() {
        assert_eq!(
            split_reference("#/$defs/A"),
            Ok(("", "/$defs/A".to_owned()))
        );
        assert_eq!(split_reference("#"), Ok(("", String::new())));
        assert_eq!(
            split_reference("defs/a.json#/$defs/A%20B"),
            Ok(("defs/a.json", "/$defs/A B".to_owned()))
        );
        assert_eq!(
            split_reference("defs/a.json"),
            Ok(("defs/a.json", String::new()))
        );
        assert!(split_reference("#anchor")
            .unwrap_err()
            .contains("is an anchor"));
        assert!(split_reference("urn:x")
            .unwrap_err()
            .starts_with("remote reference `urn:x`"));
    }

    #[test]
    fn schemes() {
        assert!(has_scheme("https://x"));
        assert!(has_scheme("urn:x"));
        assert!(!has_scheme("defs/a.json#/x:y"));
        assert!(!has_scheme(":x"));
    }

    #[test]
    fn data_keywords() {
        for key in ["enum", "const", "default", "examples"] {
            assert!(is_data_keyword(key), "{key}");
        }
        assert!(!is_data_keyword("items"));
        assert!(!is_data_keyword("$defs"));
    }
}
