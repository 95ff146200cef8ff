//! The parts of the server policy that the server enforces itself, beside the appraisal of its
//! evidence: what the audit log keeps of prompts and completions (`[audit] content`), whether
//! they may appear in diagnostic logs (`[audit] content_in_logs`), and whether API keys are
//! required (`[auth] require_api_key`).

use inferno_attestation::policy::{AuditContent, LoadedPolicy};

use crate::attest::{AttestationError, load_policy};
use crate::config::AttestationConfig;
use inferno_audit::ContentMode;

/// The server-side settings of the policy in force, with the digest of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPolicy {
    /// The policy's name.
    pub name: String,
    /// Hex SHA-256 of the policy file's exact bytes.
    pub digest: String,
    /// What the audit log keeps of prompts and completions.
    pub audit_content: ContentMode,
    /// Whether prompts and completions may appear in debug-level logs.
    pub content_in_logs: bool,
    /// Whether the server must have API keys to start.
    pub require_api_key: bool,
}

impl ServerPolicy {
    /// Reads the policy that start-up attestation will appraise with: the configured file, or
    /// the profile's embedded policy.
    pub fn load(config: &AttestationConfig) -> Result<Self, AttestationError> {
        load_policy(config).map(|loaded| Self::of(&loaded))
    }

    /// The server-side settings of `loaded`.
    pub fn of(loaded: &LoadedPolicy) -> Self {
        let policy = &loaded.policy;
        Self {
            name: policy.name.clone(),
            digest: loaded.digest_hex(),
            audit_content: content_mode(policy.audit.content),
            content_in_logs: policy.audit.content_in_logs,
            require_api_key: policy.auth.require_api_key,
        }
    }
}

/// The audit log's content mode for the policy's `[audit] content`.
fn content_mode(content: AuditContent) -> ContentMode {
    match content {
        AuditContent::None => ContentMode::None,
        AuditContent::Hmac => ContentMode::Hmac,
        AuditContent::Encrypted => ContentMode::Encrypted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_policies_keep_no_content_and_production_requires_keys() {
        let development = ServerPolicy::load(&AttestationConfig::development()).unwrap();
        assert_eq!(development.audit_content, ContentMode::None);
        assert!(!development.content_in_logs);
        assert!(!development.require_api_key);
        let production = ServerPolicy::load(&AttestationConfig::default()).unwrap();
        assert_eq!(production.name, "production");
        assert!(production.require_api_key);
        assert!(!production.content_in_logs);
        assert_ne!(production.digest, development.digest);
    }

    #[test]
    fn a_missing_policy_file_names_the_file() {
        let config = AttestationConfig {
            policy: Some("/nonexistent/policy.toml".into()),
            ..AttestationConfig::development()
        };
        let err = ServerPolicy::load(&config).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/policy.toml"), "{err}");
    }
}
