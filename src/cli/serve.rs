//! `inferno serve`: the arguments and the configuration; the start-up pipeline that loads the
//! model, attests, starts the engine and serves the OpenAI API over TLS until SIGTERM or SIGINT
//! is `crate::startup`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::backend::Device;
use crate::config::{AttestationConfig, AttestationProfile, Config, ModelKeySource};

/// Arguments of `inferno serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Hugging Face model directory; without it the embedded default model is served.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// TOML configuration file (see inferno.example.toml); every option has a default.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, overriding `server.listen`.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Where the forward pass runs: cpu, cuda or auto.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// The key file of a sealed model (`--model` names the sealed directory), overriding
    /// `[model.key]`. Development only: the production profile refuses key files.
    #[arg(long, value_name = "FILE")]
    model_key_file: Option<PathBuf>,
    /// The key broker that releases the key of a sealed model (`--model` names the sealed
    /// directory, sealed with `inferno seal --recipient`), overriding `[model.key]`.
    #[arg(long, value_name = "URL", conflicts_with = "model_key_file")]
    key_broker: Option<String>,
    /// Quantize a 16-bit checkpoint's projections when loading it, overriding
    /// `[model] quantization`: `fp8` (per-channel weight scales, dynamic per-token activation
    /// scales). The model digest stays that of the files as read.
    #[arg(long, value_enum, value_name = "FORMAT")]
    quantization: Option<crate::model::QuantizeAtLoad>,
    /// The KV cache's element type, overriding `[engine] kv_cache_dtype`: `auto` or `fp8`.
    #[arg(long, value_enum, value_name = "DTYPE")]
    kv_cache_dtype: Option<crate::engine::KvCacheDtype>,
    /// Switch to this unprivileged user once the listening socket, keys and audit log are open,
    /// overriding `server.user`.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// The flags that override other settings of the file.
    #[command(flatten)]
    overrides: super::serve_flags::ServeOverrides,
}

/// Runs `inferno serve`.
pub fn run(args: ServeArgs) -> ExitCode {
    super::init_tracing_as(args.overrides.log_format);
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        // The embedded default runs the development profile: simulated TEE, development policy.
        None => Config {
            attestation: AttestationConfig::development(),
            ..Config::default()
        },
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(path) = args.model_key_file {
        config.model.key = Some(ModelKeySource::File { path });
    }
    if let Some(url) = args.key_broker {
        let retries = match &config.model.key {
            Some(ModelKeySource::Broker { retries, .. }) => *retries,
            _ => crate::config::DEFAULT_BROKER_RETRIES,
        };
        config.model.key = Some(ModelKeySource::Broker { url, retries });
    }
    if let Some(quantization) = args.quantization {
        config.model.quantization = Some(quantization);
    }
    if let Some(dtype) = args.kv_cache_dtype {
        config.engine.kv_cache_dtype = dtype;
    }
    if let Some(user) = args.user {
        config.server.user = Some(user);
    }
    args.overrides.apply(&mut config)?;
    let production = config.attestation.profile == AttestationProfile::Production;
    if production {
        // Before any thread or secret exists: every thread inherits it.
        refuse_unaudited(&config)?;
        crate::harden::deny_dumps_and_ptrace()?;
    }
    // Named, so profiles and `bench serve --server-pid` tell the compute pool from the async
    // runtime (whose threads would otherwise lend it their name). Fails only if already built.
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("rayon-{i}"))
        .build_global();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let config_digest = match &args.config {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some(hex::encode(ring::digest::digest(
                &ring::digest::SHA256,
                &bytes,
            )))
        }
        None => None,
    };
    let served = runtime.block_on(crate::startup::serve(
        config,
        config_digest,
        args.model,
        args.device,
    ));
    // The server has shut down (its audit log signed). A model read or a backend build still
    // running on a blocking thread (a signal arrived while loading) is not waited for: dropping
    // the runtime would wait for it to finish, which for a large model on a slow disk is minutes.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

/// The production profile serves nothing unaudited: without an `[audit]` table it does not start.
fn refuse_unaudited(config: &Config) -> anyhow::Result<()> {
    if config.audit.is_none() {
        anyhow::bail!(
            "the production profile refuses to serve without an audit log: add an [audit] table to the configuration (docs/audit-log.md); a configuration without [attestation] profile = \"development\" runs the production profile (docs/configuration.md)"
        );
    }
    Ok(())
}
