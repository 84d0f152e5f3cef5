//! Runtime validation of payloads against their JSON Schema, with validators compiled once.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::Value;

use crate::error::{Error, Result, SchemaViolation};
use crate::OutboxEvent;

/// A compiled schema for one event type.
#[derive(Clone)]
pub(crate) struct Compiled(Arc<jsonschema::Validator>);

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled(..)")
    }
}

impl Compiled {
    pub(crate) fn new(event_type: &str, schema: &Value) -> Result<Self> {
        Self::with_formats(event_type, schema, true)
    }

    /// A validator that asserts `format` keywords (`formats`) or treats them as annotations.
    pub(crate) fn with_formats(event_type: &str, schema: &Value, formats: bool) -> Result<Self> {
        jsonschema::options()
            .should_validate_formats(formats)
            .build(schema)
            .map(|v| Compiled(Arc::new(v)))
            .map_err(|e| Error::InvalidSchema {
                event_type: event_type.to_owned(),
                reason: e.to_string(),
            })
    }

    pub(crate) fn check(&self, event_type: &str, data: &Value) -> Result<()> {
        let violations: Vec<SchemaViolation> = self
            .0
            .iter_errors(data)
            .map(|e| SchemaViolation {
                pointer: e.instance_path().as_str().to_owned(),
                keyword: e.kind().keyword().to_owned(),
                // the rule, never the payload's value (docs/payloads-in-logs.md)
                message: rule(e.kind()),
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidPayload {
                event_type: event_type.to_owned(),
                violations,
            })
        }
    }
}

/// One validator per event type (and format setting) for the life of the process.
type Cache = RwLock<HashMap<(&'static str, bool), Compiled>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

pub(crate) fn compiled_for<E: OutboxEvent>() -> Result<Compiled> {
    compiled_with_formats::<E>(true)
}

/// The validator of `E`'s schema, asserting `format` keywords or not (`formats`).
pub(crate) fn compiled_with_formats<E: OutboxEvent>(formats: bool) -> Result<Compiled> {
    if let Some(c) = cache()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(E::EVENT_TYPE, formats))
    {
        return Ok(c.clone());
    }
    let schema: Value = serde_json::from_str(E::SCHEMA).map_err(|e| Error::InvalidSchema {
        event_type: E::EVENT_TYPE.to_owned(),
        reason: e.to_string(),
    })?;
    let compiled = Compiled::with_formats(E::EVENT_TYPE, &schema, formats)?;
    cache()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert((E::EVENT_TYPE, formats), compiled.clone());
    Ok(compiled)
}

/// Validates a typed event's payload against its schema; returns the payload as JSON.
pub(crate) fn validated_data<E: OutboxEvent>(event: &E) -> Result<Value> {
    let data = serde_json::to_value(event)?;
    compiled_for::<E>()?.check(E::EVENT_TYPE, &data)?;
    Ok(data)
}

/// Schemas known to the untyped emit path and to decoders: event type -> compiled validator.
///
/// Build it from generated types ([`Schemas::with`]), from `(event_type, schema)` pairs (the
/// generated `EVENT_SCHEMAS` constant), or from a schema folder at runtime with
/// [`Schemas::from_pairs`] after resolving it with `outbox-codegen`.
///
/// ```
/// use outbox_runtime::Schemas;
///
/// let schemas = Schemas::from_pairs([(
///     "billing.invoice.paid",
///     r#"{"type":"object","required":["invoice_id"],"properties":{"invoice_id":{"type":"string"}}}"#,
/// )])?;
/// assert!(schemas.validate("billing.invoice.paid", &serde_json::json!({"invoice_id": "7"})).is_ok());
/// assert!(schemas.validate("billing.invoice.paid", &serde_json::json!({})).is_err());
/// assert!(schemas.validate("billing.invoice.void", &serde_json::json!({})).is_err());
/// # Ok::<(), outbox_runtime::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    by_type: HashMap<String, Compiled>,
}

impl Schemas {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a typed event's schema.
    pub fn with<E: OutboxEvent>(mut self) -> Result<Self> {
        self.by_type
            .insert(E::EVENT_TYPE.to_owned(), compiled_for::<E>()?);
        Ok(self)
    }

    /// Builds a registry from `(event_type, schema JSON text)` pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let mut by_type = HashMap::new();
        for (event_type, text) in pairs {
            let schema: Value = serde_json::from_str(text).map_err(|e| Error::InvalidSchema {
                event_type: event_type.to_owned(),
                reason: e.to_string(),
            })?;
            by_type.insert(event_type.to_owned(), Compiled::new(event_type, &schema)?);
        }
        Ok(Self { by_type })
    }

    /// Whether a schema is registered for `event_type`.
    pub fn contains(&self, event_type: &str) -> bool {
        self.by_type.contains_key(event_type)
    }

    /// The registered event types, sorted.
    pub fn event_types(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.by_type.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Validates `data` against the schema of `event_type`.
    ///
    /// Fails with [`Error::UnknownEventType`] when no schema is registered for it, and
    /// [`Error::InvalidPayload`] (every violation, each with its JSON pointer) when it does not
    /// match.
    pub fn validate(&self, event_type: &str, data: &Value) -> Result<()> {
        match self.by_type.get(event_type) {
            Some(c) => c.check(event_type, data),
            None => Err(Error::UnknownEventType {
                event_type: event_type.to_owned(),
                known: self.event_types().join(", "),
            }),
        }
    }
}

/// What a failed keyword requires, in words, from the schema alone: the limit, format,
/// pattern, type or allowed values the schema states, and names of properties (which are the
/// payload's structure), but never the value the payload had there, which may be personal
/// data or a secret and ends up in logs and dead-letter headers.
pub(crate) fn rule(kind: &jsonschema::error::ValidationErrorKind) -> String {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let names = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match kind {
        K::AdditionalItems { limit } => format!("has more than the {limit} items the schema lists"),
        K::AdditionalProperties { unexpected } => {
            format!(
                "has properties the schema does not allow: {}",
                names(unexpected)
            )
        }
        K::AnyOf { .. } => "matches none of the `anyOf` alternatives".to_owned(),
        K::BacktrackLimitExceeded { .. } | K::RegexEngineFailure { .. } => {
            "could not be checked against the schema's pattern".to_owned()
        }
        K::Constant { expected_value } => format!("must be {expected_value}"),
        K::Contains => "has no item that matches `contains`".to_owned(),
        K::ContentEncoding { content_encoding } => format!("is not {content_encoding}-encoded"),
        K::ContentMediaType { content_media_type } => format!("is not {content_media_type}"),
        K::Custom { keyword, .. } => format!("breaks the `{keyword}` rule"),
        K::Enum { options } => format!("must be one of {options}"),
        K::ExclusiveMaximum { limit } => format!("must be less than {limit}"),
        K::ExclusiveMinimum { limit } => format!("must be greater than {limit}"),
        K::FalseSchema => "is not allowed here (the schema is `false`)".to_owned(),
        K::Format { format } => format!("is not a valid `{format}`"),
        K::FromUtf8 { .. } => "is not valid UTF-8".to_owned(),
        K::MaxItems { limit } => format!("has more than {limit} items"),
        K::Maximum { limit } => format!("must be at most {limit}"),
        K::MaxLength { limit } => format!("is longer than {limit} characters"),
        K::MaxProperties { limit } => format!("has more than {limit} properties"),
        K::MinItems { limit } => format!("has fewer than {limit} items"),
        K::Minimum { limit } => format!("must be at least {limit}"),
        K::MinLength { limit } => format!("is shorter than {limit} characters"),
        K::MinProperties { limit } => format!("has fewer than {limit} properties"),
        K::MultipleOf { multiple_of } => format!("must be a multiple of {multiple_of}"),
        K::Not { .. } => "matches the schema under `not`".to_owned(),
        K::OneOfMultipleValid { .. } => "matches more than one `oneOf` alternative".to_owned(),
        K::OneOfNotValid { .. } => "matches none of the `oneOf` alternatives".to_owned(),
        K::Pattern { pattern } => format!("does not match the pattern `{pattern}`"),
        K::PropertyNames { error } => {
            format!("has a property name that {}", rule(error.kind()))
        }
        K::Required { property } => match property.as_str() {
            Some(name) => format!("lacks the required property `{name}`"),
            None => format!("lacks the required property {property}"),
        },
        K::Type { kind } => match kind {
            TypeKind::Single(t) => format!("must be of type {t}"),
            TypeKind::Multiple(set) => format!(
                "must be of type {}",
                set.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        },
        K::UnevaluatedItems { .. } => "has items the schema does not allow".to_owned(),
        K::UnevaluatedProperties { unexpected } => {
            format!(
                "has properties the schema does not allow: {}",
                names(unexpected)
            )
        }
        K::UniqueItems => "has duplicate items".to_owned(),
        K::Referencing(e) => format!("could not be checked: the schema's `$ref` fails: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Compiled;
    use crate::Error;

    #[test]
    fn violations_name_the_pointer_and_the_rule_never_the_value() {
        let schema = json!({
            "type": "object",
            "required": ["card", "seats", "plan", "email", "code"],
            "additionalProperties": false,
            "properties": {
                "card": { "type": "integer" },
                "seats": { "type": "integer", "minimum": 1, "maximum": 10 },
                "plan": { "enum": ["free", "pro"] },
                "email": { "type": "string", "format": "email" },
                "code": { "type": "string", "pattern": "^[A-Z]{3}$", "maxLength": 3 },
                "tags": { "type": "array", "uniqueItems": true, "maxItems": 1 }
            }
        });
        let compiled = Compiled::new("a.b.created", &schema).unwrap();
        let secret = "s3cret-4111111111111111";
        let data = json!({
            "card": secret,
            "seats": 4_111_111,
            "plan": secret,
            "email": secret,
            "code": secret,
            "tags": [secret, secret],
            "extra": secret,
        });
        let Err(Error::InvalidPayload { violations, .. }) = compiled.check("a.b.created", &data)
        else {
            panic!("the payload breaks its schema");
        };
        let text = Error::InvalidPayload {
            event_type: "a.b.created".into(),
            violations: violations.clone(),
        }
        .to_string();
        assert!(
            !text.contains("s3cret") && !text.contains("4111"),
            "a payload value in the message: {text}"
        );
        for expected in [
            "at `/card` (type): must be of type integer",
            "at `/seats` (maximum): must be at most 10",
            "at `/plan` (enum): must be one of [\"free\",\"pro\"]",
            "at `/email` (format): is not a valid `email`",
            "at `/code` (pattern): does not match the pattern `^[A-Z]{3}$`",
            "at `/code` (maxLength): is longer than 3 characters",
            "at `/tags` (uniqueItems): has duplicate items",
            "at `/tags` (maxItems): has more than 1 items",
            "at `/` (additionalProperties): has properties the schema does not allow: `extra`",
        ] {
            assert!(text.contains(expected), "missing `{expected}` in: {text}");
        }
        let Err(Error::InvalidPayload { violations, .. }) =
            compiled.check("a.b.created", &json!({}))
        else {
            panic!("the payload lacks required properties");
        };
        assert!(violations
            .iter()
            .any(|v| v.message == "lacks the required property `card`"));
    }
}
