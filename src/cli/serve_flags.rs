//! The flags of `inferno serve` that override the configuration file (the names vLLM users
//! type); the banner states the settings in force (`crate::startup`).

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use zeroize::Zeroizing;

use super::LogFormat;
use crate::config::{ApiKeyEntry, Config};

/// Flags that override the configuration file; the banner shows the values in force.
#[derive(Debug, Default, clap::Args)]
pub struct ServeOverrides {
    /// Host (IP address) to listen on, overriding the host of `server.listen`.
    #[arg(long, value_name = "IP")]
    host: Option<IpAddr>,
    /// Port to listen on, overriding the port of `server.listen` (0: any free port).
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// An accepted API key, added to `[[auth.keys]]` as principal `cli-N`; repeatable. A key on
    /// the command line is visible to other local users (`ps`): prefer `--api-key-file`.
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A file of accepted API keys, one a line (blank lines and `#` comments skipped), added as
    /// `cli-N` like `--api-key`.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// The model id served in `/v1/models` and expected in requests, overriding
    /// `server.served_model_name`.
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// The longest context (prompt plus completion) served, in tokens, overriding
    /// `server.max_model_len`; at most the model's own.
    #[arg(long, value_name = "TOKENS")]
    max_model_len: Option<usize>,
    /// The model's tool-call format (`llama3_json`, `hermes`, `mistral`), overriding
    /// `server.tool_call_parser`.
    #[arg(long, value_name = "FORMAT")]
    tool_call_parser: Option<String>,
    /// The model's reasoning format (`qwen3`, `deepseek_r1`), overriding
    /// `server.reasoning_parser`.
    #[arg(long, value_name = "FORMAT")]
    reasoning_parser: Option<String>,
    /// Fraction of free GPU memory for the KV cache, overriding `engine.gpu_memory_fraction`.
    #[arg(long, value_name = "FRACTION")]
    gpu_memory_utilization: Option<f64>,
    /// Speculative decoding with this proposer, overriding `[speculative] method`: `ngram`
    /// (prompt lookup); `eagle3` is refused (not supported yet).
    #[arg(long, value_enum, value_name = "METHOD")]
    speculative: Option<crate::engine::SpeculativeMethod>,
    /// The most tokens proposed per sequence and step, overriding
    /// `[speculative] num_speculative_tokens`.
    #[arg(long, value_name = "K")]
    num_speculative_tokens: Option<usize>,
    /// How log lines are written: `text` (coloured only on a terminal) or `json` (one object a
    /// line, for log shippers).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl ServeOverrides {
    /// Applies the flags to `config` and checks the result as the file is checked (ranges
    /// included).
    pub fn apply(self, config: &mut Config) -> anyhow::Result<()> {
        if let Some(host) = self.host {
            config.server.listen.set_ip(host);
        }
        if let Some(port) = self.port {
            config.server.listen.set_port(port);
        }
        let mut keys: Vec<Zeroizing<String>> =
            self.api_keys.into_iter().map(Zeroizing::new).collect();
        if let Some(path) = &self.api_key_file {
            let text = Zeroizing::new(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --api-key-file {}", path.display()))?,
            );
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty() && !line.starts_with('#'))
                    .map(|line| Zeroizing::new(line.to_owned())),
            );
        }
        for (i, key) in keys.iter().enumerate() {
            let hash = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
            config.auth.keys.push(ApiKeyEntry {
                name: format!("cli-{}", i + 1),
                sha256: hex::encode(hash.as_ref()),
            });
        }
        if let Some(name) = self.served_model_name {
            config.server.served_model_name = Some(name);
        }
        if let Some(method) = self.speculative {
            config.speculative.method = Some(method);
        }
        if let Some(k) = self.num_speculative_tokens {
            config.speculative.num_speculative_tokens = k;
        }
        if let Some(tokens) = self.max_model_len {
            config.server.max_model_len = Some(tokens);
        }
        if let Some(name) = &self.tool_call_parser {
            config.server.tool_call_parser = Some(named("--tool-call-parser", name)?);
        }
        if let Some(name) = &self.reasoning_parser {
            config.server.reasoning_parser = Some(named("--reasoning-parser", name)?);
        }
        if let Some(fraction) = self.gpu_memory_utilization {
            config.engine.gpu_memory_fraction = fraction;
        }
        config
            .validate()
            .context("the configuration with the command-line flags applied")?;
        Ok(())
    }
}

/// Reads a format name as the configuration file spells it.
fn named<T: serde::de::DeserializeOwned>(flag: &str, name: &str) -> anyhow::Result<T> {
    serde_json::from_value(serde_json::Value::String(name.to_owned()))
        .map_err(|err| anyhow::anyhow!("{flag} {name:?}: {err}"))
}
