//! Typed access to the fields of a model directory's JSON files, with errors that name the file
//! and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::ModelError;

/// A JSON object read from `path`; accessors report missing or mistyped fields by name.
pub(crate) struct JsonObject<'a> {
    path: &'a Path,
    prefix: String,
    map: &'a Map<String, Value>,
}

/// Parses `bytes` as a JSON document that must be an object.
pub(crate) fn parse_object(path: &Path, bytes: &[u8]) -> Result<Map<String, Value>, ModelError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ModelError::InvalidField {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            reason: "expected a JSON object".into(),
        }),
        Err(source) => Err(ModelError::Json {
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl<'a> JsonObject<'a> {
    /// Wraps the top-level object of `path`.
    pub(crate) fn new(path: &'a Path, map: &'a Map<String, Value>) -> Self {
        Self {
            path,
            prefix: String::new(),
            map,
        }
    }

    /// The file this object came from.
    pub(crate) fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    /// The full dotted name of `field` in this object.
    pub(crate) fn field_name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    /// An error about `field` of this object.
    pub(crate) fn invalid(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::InvalidField {
            path: self.path(),
            field: self.field_name(field),
            reason: reason.into(),
        }
    }

    /// The raw value of `field`, treating JSON `null` as absent.
    pub(crate) fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// A nested object, or `None` when absent or null.
    pub(crate) fn object(&self, field: &str) -> Result<Option<JsonObject<'a>>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(JsonObject {
                path: self.path,
                prefix: format!("{}{field}.", self.prefix),
                map,
            })),
            Some(_) => Err(self.invalid(field, "expected an object")),
        }
    }

    /// An optional non-negative integer.
    pub(crate) fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.invalid(field, format!("expected a non-negative integer, got {v}"))
                }),
        }
    }

    /// A required non-negative integer.
    pub(crate) fn usize(&self, field: &str) -> Result<usize, ModelError> {
        self.opt_usize(field)?
            .ok_or_else(|| self.invalid(field, "missing"))
    }

    /// A required positive integer.
    pub(crate) fn positive(&self, field: &str) -> Result<usize, ModelError> {
        match self.usize(field)? {
            0 => Err(self.invalid(field, "must be positive")),
            n => Ok(n),
        }
    }

    /// An optional number (integers are accepted).
    pub(crate) fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(field, format!("expected a number, got {v}"))),
        }
    }

    /// A required number.
    pub(crate) fn f64(&self, field: &str) -> Result<f64, ModelError> {
        self.opt_f64(field)?
            .ok_or_else(|| self.invalid(field, "missing"))
    }

    /// An optional boolean.
    pub(crate) fn opt_bool(&self, field: &str) -> Result<Option<bool>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.invalid(field, format!("expected a boolean, got {v}"))),
        }
    }

    /// An optional string.
    pub(crate) fn opt_str(&self, field: &str) -> Result<Option<&'a str>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.invalid(field, format!("expected a string, got {v}"))),
        }
    }

    /// An optional token id.
    pub(crate) fn opt_token_id(&self, field: &str) -> Result<Option<u32>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => token_id(v)
                .map(Some)
                .ok_or_else(|| self.invalid(field, format!("expected a token id, got {v}"))),
        }
    }

    /// Token ids given either as one integer or as a list of integers (absent: empty).
    pub(crate) fn token_ids(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        let bad = |v: &Value| {
            self.invalid(
                field,
                format!("expected a token id or a list of them, got {v}"),
            )
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| token_id(item).ok_or_else(|| bad(item)))
                .collect(),
            Some(v) => token_id(v).map(|id| vec![id]).ok_or_else(|| bad(v)),
        }
    }
}

/// A JSON value as a token id.
fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}
