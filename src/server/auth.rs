//! Bearer API keys. The configuration stores only the SHA-256 of each key; a presented key is
//! hashed and compared against every stored hash in constant time.

use http::HeaderMap;
use ring::digest;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::error::ApiError;
use crate::config::ApiKeyEntry;

/// The principal used when no API keys are configured (loopback-only serving), and the audit
/// log's name for a caller that presented no key.
pub const ANONYMOUS: &str = "anonymous";

/// The audit log's name for a caller whose key was presented but not accepted (the key itself
/// is never recorded).
pub const INVALID_KEY: &str = "invalid-key";

/// The authenticated caller: the name of its API key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

impl Principal {
    /// The principal's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The prefix-cache salt of this principal: the first 8 bytes of a domain-separated SHA-256
    /// of its name, so different principals never share cached prefixes.
    pub fn cache_salt(&self) -> u64 {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(b"inferno prefix-cache salt\0");
        ctx.update(self.0.as_bytes());
        let hash = ctx.finish();
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&hash.as_ref()[..8]);
        u64::from_le_bytes(bytes)
    }
}

/// Configured keys, decoded once at start.
#[derive(Debug, Clone)]
pub struct Authenticator {
    keys: Vec<(String, [u8; 32])>,
}

/// A configured hash is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("auth.keys: the hash of key {name:?} is not 64 hex digits")]
pub struct BadKeyHash {
    /// The key's name.
    pub name: String,
}

impl Authenticator {
    /// Decodes the configured key hashes.
    pub fn new(entries: &[ApiKeyEntry]) -> Result<Self, BadKeyHash> {
        let keys = entries
            .iter()
            .map(|entry| {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(&entry.sha256, &mut hash).map_err(|_| BadKeyHash {
                    name: entry.name.clone(),
                })?;
                Ok((entry.name.clone(), hash))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { keys })
    }

    /// Whether any key is configured. Without keys every request is [`ANONYMOUS`].
    pub fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Authenticates a request from its `Authorization` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if !self.has_keys() {
            return Ok(Principal(ANONYMOUS.to_owned()));
        }
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::unauthorized("missing API key: send it as `Authorization: Bearer <key>`")
            })?
            .to_str()
            .map_err(|_| ApiError::unauthorized("the Authorization header is not valid text"))?;
        let key = bearer_token(value).ok_or_else(|| {
            ApiError::unauthorized("the Authorization header must be `Bearer <key>`")
        })?;
        self.lookup(key)
            .ok_or_else(|| ApiError::unauthorized("the API key is not valid"))
    }

    /// The caller as the audit log names it, for requests answered without (or refused by)
    /// authentication: the principal of a valid key, [`ANONYMOUS`] without an `Authorization`
    /// header (or without configured keys), [`INVALID_KEY`] otherwise. Never the key.
    pub fn audit_name(&self, headers: &HeaderMap) -> String {
        if !self.has_keys() || !headers.contains_key(http::header::AUTHORIZATION) {
            return ANONYMOUS.to_owned();
        }
        match self.authenticate(headers) {
            Ok(principal) => principal.0,
            Err(_) => INVALID_KEY.to_owned(),
        }
    }

    /// The principal whose key hashes to the SHA-256 of `key`. Every stored hash is compared,
    /// in constant time, whatever matches.
    fn lookup(&self, key: &str) -> Option<Principal> {
        let mut presented = Zeroizing::new([0u8; 32]);
        presented.copy_from_slice(digest::digest(&digest::SHA256, key.as_bytes()).as_ref());
        let mut found = None;
        for (name, hash) in &self.keys {
            if bool::from(hash.ct_eq(&*presented)) {
                found = Some(name);
            }
        }
        found.map(|name| Principal(name.clone()))
    }
}

/// Whether `headers` present, as `Authorization: Bearer <key>`, the key whose SHA-256 is
/// `sha256_hex` (the `/metrics` scrape key). Compared in constant time.
pub fn presents_key(headers: &HeaderMap, sha256_hex: &str) -> bool {
    let mut expected = [0u8; 32];
    if hex::decode_to_slice(sha256_hex, &mut expected).is_err() {
        return false;
    }
    let Some(key) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token)
    else {
        return false;
    };
    let mut presented = Zeroizing::new([0u8; 32]);
    presented.copy_from_slice(digest::digest(&digest::SHA256, key.as_bytes()).as_ref());
    bool::from(expected.ct_eq(&*presented))
}

/// The token of a `Bearer <token>` header value (the scheme is case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, key: &str) -> ApiKeyEntry {
        ApiKeyEntry {
            name: name.to_owned(),
            sha256: hex::encode(digest::digest(&digest::SHA256, key.as_bytes())),
        }
    }

    fn headers(auth: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        headers
    }

    #[test]
    fn accepts_the_right_key_and_names_its_principal() {
        let auth = Authenticator::new(&[entry("alice", "k-alice"), entry("bob", "k-bob")]).unwrap();
        let principal = auth.authenticate(&headers("Bearer k-bob")).unwrap();
        assert_eq!(principal.name(), "bob");
        let principal = auth.authenticate(&headers("bearer  k-alice ")).unwrap();
        assert_eq!(principal.name(), "alice");
    }

    #[test]
    fn refuses_wrong_missing_and_malformed_keys() {
        let auth = Authenticator::new(&[entry("alice", "k-alice")]).unwrap();
        for bad in ["Bearer k-bob", "Basic k-alice", "k-alice", "Bearer "] {
            let err = auth.authenticate(&headers(bad)).unwrap_err();
            assert_eq!(err.status, http::StatusCode::UNAUTHORIZED, "{bad}");
        }
        let err = auth.authenticate(&HeaderMap::new()).unwrap_err();
        assert_eq!(err.status, http::StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn audit_names_never_reveal_the_key() {
        let auth = Authenticator::new(&[entry("alice", "k-alice")]).unwrap();
        assert_eq!(auth.audit_name(&headers("Bearer k-alice")), "alice");
        assert_eq!(auth.audit_name(&headers("Bearer k-bob")), INVALID_KEY);
        assert_eq!(auth.audit_name(&headers("Basic k-bob")), INVALID_KEY);
        assert_eq!(auth.audit_name(&HeaderMap::new()), ANONYMOUS);
        let open = Authenticator::new(&[]).unwrap();
        assert_eq!(open.audit_name(&headers("Bearer whatever")), ANONYMOUS);
    }

    #[test]
    fn without_keys_everyone_is_anonymous() {
        let auth = Authenticator::new(&[]).unwrap();
        assert!(!auth.has_keys());
        assert_eq!(
            auth.authenticate(&HeaderMap::new()).unwrap().name(),
            ANONYMOUS
        );
    }

    #[test]
    fn the_scrape_key_is_matched_by_its_hash() {
        let hash = hex::encode(digest::digest(&digest::SHA256, b"scrape"));
        assert!(presents_key(&headers("Bearer scrape"), &hash));
        assert!(!presents_key(&headers("Bearer other"), &hash));
        assert!(!presents_key(&HeaderMap::new(), &hash));
        assert!(!presents_key(&headers("Bearer scrape"), "not hex"));
    }

    #[test]
    fn bad_hash_is_refused_at_start() {
        let bad = ApiKeyEntry {
            name: "x".into(),
            sha256: "zz".repeat(32),
        };
        assert!(Authenticator::new(&[bad]).is_err());
    }

    #[test]
    fn cache_salts_differ_between_principals() {
        let a = Principal("alice".into()).cache_salt();
        let b = Principal("bob".into()).cache_salt();
        assert_ne!(a, b);
        assert_eq!(a, Principal("alice".into()).cache_salt());
    }
}
