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
                message: e.to_string(),
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
