//! Serde adapter that writes byte strings as standard base64 (with padding) in JSON evidence.
//!
//! Use it as `#[serde(with = "crate::serde_b64")]` on a `Vec<u8>` field.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serializer};

/// Serialises bytes as a base64 string.
pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&STANDARD.encode(bytes))
}

/// Deserialises a base64 string into bytes.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    STANDARD
        .decode(text.as_bytes())
        .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
}

/// The same adapter for `Option<Vec<u8>>` fields (`null` or absent means `None`).
pub mod option {
    use super::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises optional bytes as a base64 string or `null`.
    pub fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => serializer.serialize_str(&STANDARD.encode(b)),
            None => serializer.serialize_none(),
        }
    }

    /// Deserialises an optional base64 string.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|t| {
            STANDARD
                .decode(t.as_bytes())
                .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
        })
        .transpose()
    }
}

/// The same adapter for `Vec<Vec<u8>>` fields (a JSON array of base64 strings).
pub mod vec {
    use super::STANDARD;
    use base64::Engine as _;
    use serde::ser::SerializeSeq as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises a list of byte strings as base64 strings.
    pub fn serialize<S: Serializer>(items: &[Vec<u8>], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(items.len()))?;
        for item in items {
            seq.serialize_element(&STANDARD.encode(item))?;
        }
        seq.end()
    }

    /// Deserialises a list of base64 strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Vec<u8>>, D::Error> {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|t| {
                STANDARD
                    .decode(t.as_bytes())
                    .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
            })
            .collect()
    }
}
