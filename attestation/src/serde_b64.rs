//! Serde adapter that writes byte strings as standard base64 (with padding) in JSON evidence,
//! collateral bundles and reports: the crate's one base64 codec for serde.
//!
//! Use it as `#[serde(with = "crate::serde_b64")]` on a `Vec<u8>` field, `serde_b64::option`
//! on `Option<Vec<u8>>` and `serde_b64::vec` on `Vec<Vec<u8>>`;
//! [`crate::evidence::Base64Bytes`] is a newtype over it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serializer};

/// Decodes one base64 string, as a serde error on failure.
fn decode<E: serde::de::Error>(text: &str) -> Result<Vec<u8>, E> {
    STANDARD
        .decode(text.as_bytes())
        .map_err(|e| E::custom(format!("invalid base64: {e}")))
}

/// Serialises bytes as a base64 string.
pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&STANDARD.encode(bytes))
}

/// Deserialises a base64 string into bytes.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    decode(&String::deserialize(deserializer)?)
}

/// The same adapter for `Option<Vec<u8>>` fields (`null` or absent means `None`).
pub mod option {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises optional bytes as a base64 string or `null`.
    pub fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => super::serialize(b, serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Deserialises an optional base64 string.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|t| super::decode(&t))
            .transpose()
    }
}

/// The same adapter for `Vec<Vec<u8>>` fields (a JSON array of base64 strings).
pub mod vec {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises a list of byte strings as base64 strings.
    pub fn serialize<S: Serializer>(items: &[Vec<u8>], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(items.iter().map(|item| super::STANDARD.encode(item)))
    }

    /// Deserialises a list of base64 strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Vec<u8>>, D::Error> {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|t| super::decode(t))
            .collect()
    }
}
