//! The operator's TOML configuration file. Every option has a default.
//!
//! `docs/configuration.md` documents each table and `inferno.example.toml` shows every option with
//! its default value. Unknown keys are rejected so that a misspelt option fails loudly instead of
//! silently falling back to its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::engine::EngineConfig;

pub mod ranges;

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Scheduling and KV-cache settings of the engine.
    pub engine: EngineConfig,
    /// Listening address and request handling.
    pub server: ServerConfig,
    /// The server's TLS certificate.
    pub tls: TlsConfig,
    /// API keys.
    pub auth: AuthConfig,
    /// Limits that protect the server from oversized or slow clients.
    pub limits: LimitsConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// The audit log; without this table nothing is audited (a warning says so at start).
    pub audit: Option<inferno_audit::AuditConfig>,
    /// Start-up attestation; production unless a config selects development (`inferno serve`
    /// without `--config` runs the development profile).
    pub attestation: AttestationConfig,
    /// The model: where the key of a sealed model comes from.
    pub model: ModelSection,
    /// Speculative decoding (`docs/engine.md`, "Speculative decoding"); off without `method`.
    pub speculative: crate::engine::SpeculativeConfig,
}

/// The `[model]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `[model.key]`: the key source of a sealed model (`--model-key-file` overrides it).
    pub key: Option<ModelKeySource>,
    /// `quantization = "fp8"`: serve a 16-bit checkpoint's projections in FP8, quantized at
    /// load (`--quantization` overrides it); a checkpoint already in FP8 keeps its own scheme.
    pub quantization: Option<crate::model::QuantizeAtLoad>,
}

/// Where the key of a sealed model comes from (`docs/sealed-model.md`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "source", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelKeySource {
    /// A 32-byte key file (mode 0600). Development only: the production profile refuses it.
    File {
        /// The key file.
        path: PathBuf,
    },
    /// A key broker (`inferno keybroker`) that releases the key to this appliance's evidence
    /// (`docs/sealed-model.md`, "Key broker").
    Broker {
        /// The broker's base URL, e.g. `http://10.0.0.5:8443`.
        url: String,
        /// How many times an unreachable or failing broker is retried before start-up is
        /// refused (default 3).
        #[serde(default = "default_broker_retries")]
        retries: u32,
    },
    /// The key sealed to this machine's (v)TPM under a PCR policy (`inferno seal --tpm-seal`).
    Tpm {
        /// The sealed-key blob file.
        blob: PathBuf,
        /// The TPM (a tss-esapi TCTI string; default `device:/dev/tpmrm0`).
        #[serde(default)]
        tcti: Option<String>,
    },
    /// The key wrapped under an SEV-SNP derived key (`inferno seal --snp-seal`); never run on
    /// hardware.
    Snp {
        /// The sealed-key blob file.
        blob: PathBuf,
    },
}

/// The default number of retries of an unreachable key broker.
pub const DEFAULT_BROKER_RETRIES: u32 = 3;

fn default_broker_retries() -> u32 {
    DEFAULT_BROKER_RETRIES
}

/// Which evidence source and default policy the server uses at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttestationProfile {
    /// The simulated TEE and the development policy: no hardware protection.
    Development,
    /// Hardware evidence only, appraised by the production policy; failing evidence refuses
    /// to serve.
    #[default]
    Production,
}

/// The `[attestation]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttestationConfig {
    /// `development` (simulated TEE allowed) or `production` (hardware evidence required).
    pub profile: AttestationProfile,
    /// The server policy file; without it the profile's embedded policy
    /// (`policy/development.toml` or `policy/production.toml`).
    pub policy: Option<PathBuf>,
    /// The TCTI of the vTPM to quote (e.g. `device:/dev/tpmrm0`,
    /// `swtpm:host=127.0.0.1,port=2321`). Absent: `/dev/tpmrm0` when that device exists.
    pub tpm_tcti: Option<String>,
    /// The offline collateral bundle (`inferno attest bundle`) used to appraise the server's own
    /// evidence at start-up. A policy that requires the GPU's reference values or OCSP needs it.
    pub collateral: Option<PathBuf>,
    /// How many `POST /v1/attestation` challenges may arrive at once before the rate limit
    /// (HTTP 429) applies.
    pub fresh_evidence_burst: u32,
    /// How many `POST /v1/attestation` challenges per minute are admitted in the long run.
    pub fresh_evidence_per_minute: u32,
    /// Whether the selected backend is CUDA (set by `inferno serve` from `--device`, never
    /// from the file): start-up attestation then reads and attests the GPU.
    #[serde(skip)]
    pub cuda: bool,
}

impl Default for AttestationConfig {
    fn default() -> Self {
        Self {
            profile: AttestationProfile::default(),
            policy: None,
            tpm_tcti: None,
            collateral: None,
            fresh_evidence_burst: 16,
            fresh_evidence_per_minute: 60,
            cuda: false,
        }
    }
}

impl AttestationConfig {
    /// The development profile with the embedded development policy (the embedded default of
    /// `inferno serve` without `--config`, and tests).
    pub fn development() -> Self {
        Self {
            profile: AttestationProfile::Development,
            ..Self::default()
        }
    }
}

/// The `[server]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port to listen on (`--listen` overrides it).
    pub listen: SocketAddr,
    /// The model id served in `/v1/models` and expected in requests; the model's own name when
    /// absent.
    pub served_model_name: Option<String>,
    /// The longest context (prompt plus completion) served, in tokens; the model's own when
    /// absent or larger.
    pub max_model_len: Option<usize>,
    /// Seconds that in-flight requests get to finish after SIGTERM or SIGINT.
    pub shutdown_grace_secs: u64,
    /// The model's tool-call format (`llama3_json`, `hermes` or `mistral`); detected from the
    /// chat template when absent.
    pub tool_call_parser: Option<crate::server::openai::tools::ToolCallFormat>,
    /// The model's reasoning format (`qwen3` or `deepseek_r1`): its `<think>` block is returned
    /// as `reasoning_content`; detected from the chat template when absent.
    pub reasoning_parser: Option<crate::server::openai::reasoning::ReasoningFormat>,
    /// Tokenize special-token text inside chat messages (`<|eot_id|>` typed by a user) as the
    /// control token it spells. Off by default: such text is tokenized as plain text, so a
    /// message cannot forge the conversation's structure.
    pub chat_special_tokens_in_content: bool,
    /// Accept any message role. Off by default: roles are limited to those the chat template
    /// knows.
    pub chat_any_role: bool,
    /// The unprivileged user to switch to once the socket, keys and audit log are open
    /// (`--user` overrides it); absent: keep the starting user.
    pub user: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8443)),
            served_model_name: None,
            max_model_len: None,
            shutdown_grace_secs: 30,
            tool_call_parser: None,
            reasoning_parser: None,
            chat_special_tokens_in_content: false,
            chat_any_role: false,
            user: None,
        }
    }
}

impl ServerConfig {
    /// The shutdown grace period.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

/// The `[tls]` table. Its keys are refused: the TLS key is generated in memory at every start
/// and the self-signed certificate carries the start-up evidence, which a certificate and key
/// from files cannot (`docs/attestation-protocol.md`). The table is kept so that an old
/// configuration naming them gets that explanation rather than "unknown field".
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file holding the certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM file holding the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// The `[auth]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Accepted API keys. With none, the server only listens on loopback.
    pub keys: Vec<ApiKeyEntry>,
}

/// One accepted API key, stored as the SHA-256 of the key so the file holds no secret.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyEntry {
    /// The principal this key authenticates (metrics, logs, audit log, prefix-cache salt).
    pub name: String,
    /// Lowercase or uppercase hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
}

/// The `[limits]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest accepted request body in bytes (HTTP 413 beyond).
    pub max_body_bytes: usize,
    /// Seconds a client has to complete the TLS handshake and send a request's headers.
    pub header_read_timeout_secs: u64,
    /// Seconds a client has to send a request's body once its headers arrived.
    pub body_read_timeout_secs: u64,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// The most tokens one choice may generate (`max_tokens` above it is refused).
    pub max_completion_tokens: usize,
    /// The most choices (`n`) per request.
    pub max_n: usize,
    /// Seconds sent in `Retry-After` when the queue is full.
    pub retry_after_secs: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 30,
            max_connections: 512,
            max_completion_tokens: 8192,
            max_n: 16,
            retry_after_secs: 1,
        }
    }
}

impl LimitsConfig {
    /// The handshake and header timeout.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_secs)
    }

    /// The body timeout.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_secs(self.body_read_timeout_secs)
    }
}

/// The `[metrics]` table: who may read `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` without any key (its per-principal series excepted).
    pub public: bool,
    /// Hex SHA-256 of the scrape key (`printf %s "$KEY" | sha256sum`): a bearer token that reads
    /// every series, the per-principal ones included. Absent: in the production profile only
    /// `public` opens `/metrics`; in the development profile API keys read it too (without the
    /// per-principal series).
    pub key_sha256: Option<String>,
}

/// The configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, naming the key.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid config{}: {field}: {message}", in_file(path.as_deref()))]
    Invalid {
        /// The file, when the configuration was read from one.
        path: Option<PathBuf>,
        /// The dotted key, e.g. `auth.keys[1].sha256`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config = Self::parse(&text).map_err(|err| match err {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            ConfigError::Invalid { field, message, .. } => ConfigError::Invalid {
                path: Some(path.to_path_buf()),
                field,
                message,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let parse_error = |err: toml::de::Error, path: Option<String>| {
            let key = path.map_or_else(String::new, |path| format!("{path}: "));
            ConfigError::Parse {
                path: PathBuf::from("<inline>"),
                message: key + err.message() + &span_suffix(text, err.span()),
            }
        };
        let deserializer = toml::Deserializer::parse(text).map_err(|err| parse_error(err, None))?;
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            // The dotted key whose value is wrong (`.` when the error is the document's).
            let path = err.path().to_string();
            let path = (path != ".").then_some(path);
            parse_error(err.into_inner(), path)
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and cross-field consistency.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: &str| ConfigError::Invalid {
            path: None,
            field: field.to_owned(),
            message: message.to_owned(),
        };
        if self.tls.cert.is_some() || self.tls.key.is_some() {
            return Err(invalid(
                "tls",
                "`cert` and `key` are not supported: the server generates its TLS key in memory and presents a certificate carrying its start-up evidence (docs/attestation-protocol.md); remove them",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, key) in self.auth.keys.iter().enumerate() {
            if key.name.trim().is_empty() {
                return Err(invalid(
                    &format!("auth.keys[{i}].name"),
                    "must not be empty",
                ));
            }
            if !names.insert(key.name.as_str()) {
                return Err(invalid(
                    &format!("auth.keys[{i}].name"),
                    &format!("duplicate key name {:?}", key.name),
                ));
            }
            if key.sha256.len() != 64 || !key.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(
                    &format!("auth.keys[{i}].sha256"),
                    "must be 64 hex digits (the SHA-256 of the key)",
                ));
            }
        }
        if let Some(hash) = &self.metrics.key_sha256
            && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(invalid(
                "metrics.key_sha256",
                "must be 64 hex digits (the SHA-256 of the scrape key)",
            ));
        }
        ranges::check(self)?;
        // A benchmark's test mode: its output is not the model's, so a server never takes it.
        if self.speculative.forced_acceptance.is_some() {
            return Err(invalid(
                "speculative.forced_acceptance",
                "is a benchmark test mode whose output is not the model's (`inferno bench offline --forced-acceptance`); a server refuses it",
            ));
        }
        if self.speculative.enabled()
            && let Err(err) = self.speculative.validate()
        {
            return Err(invalid("speculative", &err.to_string()));
        }
        if let Some(name) = &self.server.served_model_name
            && name.trim().is_empty()
        {
            return Err(invalid("server.served_model_name", "must not be empty"));
        }
        Ok(())
    }
}

/// ` file F` for an error in a configuration file, or nothing.
fn in_file(path: Option<&Path>) -> String {
    path.map(|path| format!(" file {}", path.display()))
        .unwrap_or_default()
}

/// ` (line L)` for a parser error span, or nothing.
fn span_suffix(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(span) => {
            let line = text
                .get(..span.start)
                .map_or(0, |prefix| prefix.matches('\n').count())
                + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn forced_acceptance_is_refused_in_a_server_configuration() {
        let err = Config::parse("[speculative]\nmethod = \"ngram\"\nforced_acceptance = 0.5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("speculative.forced_acceptance"), "{err}");
        assert!(err.contains("not the model's"), "{err}");
    }

    #[test]
    fn empty_file_gives_defaults() {
        let config = Config::parse("").unwrap();
        assert_eq!(config, Config::default());
        assert!(config.server.listen.ip().is_loopback());
        assert!(!config.metrics.public);
        assert!(!config.engine.share_prefix_cache);
    }

    #[test]
    fn example_file_parses_and_states_the_defaults_but_the_profile() {
        let text = include_str!("../inferno.example.toml");
        let config = Config::parse(text).unwrap();
        assert_eq!(config.attestation.profile, AttestationProfile::Development);
        let expected = Config {
            attestation: AttestationConfig::development(),
            ..Config::default()
        };
        assert_eq!(config, expected);
    }

    #[test]
    fn tables_are_read() {
        let text = format!(
            r#"
            [server]
            listen = "0.0.0.0:9000"
            served_model_name = "m"
            [engine]
            max_waiting = 3
            [limits]
            max_body_bytes = 10
            [metrics]
            public = true
            [[auth.keys]]
            name = "alice"
            sha256 = "{HASH}"
            "#
        );
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.server.listen.port(), 9000);
        assert_eq!(config.server.served_model_name.as_deref(), Some("m"));
        assert_eq!(config.engine.max_waiting, 3);
        assert_eq!(config.limits.max_body_bytes, 10);
        assert!(config.metrics.public);
        assert_eq!(config.auth.keys[0].name, "alice");
    }

    #[test]
    fn unknown_key_is_rejected_with_its_name_and_line() {
        let err = Config::parse("[limits]\nmax_body = 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("max_body"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
    }

    #[test]
    fn the_audit_content_mode_is_the_policys_not_the_configs() {
        let err = Config::parse("[audit]\ndir = \"/a\"\ncontent = \"hmac\"\n").unwrap_err();
        assert!(err.to_string().contains("content"), "{err}");
        let config = Config::parse(
            "[audit]\ndir = \"/a\"\ncontent_key_file = \"/k\"\ncommit_interval_ms = 0\n",
        )
        .unwrap();
        let audit = config.audit.unwrap();
        assert_eq!(audit.content_key_file, Some(PathBuf::from("/k")));
        assert_eq!(audit.commit_interval_ms, 0);
    }

    #[test]
    fn attestation_defaults_to_production_and_reads_its_table() {
        assert_eq!(
            Config::default().attestation.profile,
            AttestationProfile::Production
        );
        let config =
            Config::parse("[attestation]\nprofile = \"development\"\npolicy = \"p.toml\"\n")
                .unwrap();
        assert_eq!(config.attestation.profile, AttestationProfile::Development);
        assert_eq!(config.attestation.policy, Some(PathBuf::from("p.toml")));
        let err = Config::parse("[attestation]\nprofile = \"lax\"\n").unwrap_err();
        assert!(err.to_string().contains("lax"), "{err}");
    }

    #[test]
    fn wrong_type_is_rejected_with_its_key() {
        let err = Config::parse("[limits]\nmax_n = \"four\"\n").unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("limits.max_n: "), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
        let err = Config::parse("[engine]\nmax_batched_tokens = -1\n").unwrap_err();
        assert!(
            err.to_string().contains("engine.max_batched_tokens"),
            "{err}"
        );
    }

    #[test]
    fn the_metrics_key_is_a_hash() {
        let config = Config::parse(&format!("[metrics]\nkey_sha256 = \"{HASH}\"\n")).unwrap();
        assert_eq!(config.metrics.key_sha256.as_deref(), Some(HASH));
        let err = Config::parse("[metrics]\nkey_sha256 = \"secret\"\n").unwrap_err();
        assert!(err.to_string().contains("metrics.key_sha256"), "{err}");
    }

    #[test]
    fn bad_key_hash_names_the_field() {
        let err = Config::parse("[[auth.keys]]\nname = \"a\"\nsha256 = \"abc\"\n").unwrap_err();
        assert!(err.to_string().contains("auth.keys[0].sha256"), "{err}");
    }

    #[test]
    fn duplicate_key_names_are_rejected() {
        let text = format!(
            "[[auth.keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\n[[auth.keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\n"
        );
        let err = Config::parse(&text).unwrap_err();
        assert!(err.to_string().contains("auth.keys[1].name"), "{err}");
    }

    #[test]
    fn a_configured_certificate_is_refused() {
        let err = Config::parse("[tls]\ncert = \"c.pem\"\n").unwrap_err();
        assert!(err.to_string().contains("tls"), "{err}");
        let err = Config::parse("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n").unwrap_err();
        assert!(err.to_string().contains("in memory"), "{err}");
    }

    #[test]
    fn zero_limits_are_rejected() {
        let err = Config::parse("[limits]\nmax_connections = 0\n").unwrap_err();
        assert!(err.to_string().contains("limits.max_connections"), "{err}");
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "nonsense = 1\n").unwrap();
        let err = Config::load(&path).unwrap_err();
        assert!(err.to_string().contains("bad.toml"), "{err}");
        std::fs::write(&path, "[limits]\nmax_n = 0\n").unwrap();
        let err = Config::load(&path).unwrap_err();
        assert!(err.to_string().contains("bad.toml: limits.max_n"), "{err}");
        let missing = Config::load(&dir.path().join("absent.toml")).unwrap_err();
        assert!(missing.to_string().contains("absent.toml"), "{missing}");
    }
}
