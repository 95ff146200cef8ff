//! `inferno serve`: load the model, start the engine and serve the OpenAI API over TLS until
//! SIGTERM or SIGINT.

use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::setup;
use crate::backend::{self, Device};
use crate::config::{AttestationConfig, AttestationProfile, Config};
use crate::engine::{Engine, EngineConfig, ModelInfo};
use crate::server::{ModelService, Server};

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
    /// Switch to this unprivileged user once the listening socket, keys and audit log are open,
    /// overriding `server.user`.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
}

/// Runs `inferno serve`.
pub fn run(args: ServeArgs) -> ExitCode {
    init_tracing();
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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
    if let Some(user) = args.user {
        config.server.user = Some(user);
    }
    let production = config.attestation.profile == AttestationProfile::Production;
    if production {
        // Before any thread or secret exists: every thread inherits it.
        refuse_unaudited(&config)?;
        crate::harden::deny_dumps_and_ptrace()?;
    }
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
    runtime.block_on(serve_async(config, config_digest, args.model, args.device))
}

async fn serve_async(
    config: Config,
    config_digest: Option<String>,
    model_dir: Option<PathBuf>,
    device: Device,
) -> anyhow::Result<()> {
    let engine_config = config.engine.clone();
    let served_name = config.server.served_model_name.clone();
    let mut config = config;
    config.attestation.cuda = match device {
        Device::Cuda => true,
        Device::Cpu => false,
        Device::Auto => backend::cuda::probe().is_ok(),
    };
    // Watch the signals before anything else, and keep watching them: a SIGTERM that arrives
    // between two waits must not be lost.
    let mut signals = ShutdownSignals::watch()?;
    let production = config.attestation.profile == AttestationProfile::Production;
    let user = config.server.user.clone();
    let server = Server::start(config).await?;
    // The keys exist and the socket and the audit log are open: lock the keys' pages, then give
    // up privileges before the model (operator-supplied files) is read.
    if let Err(err) = harden_after_start(production, user.as_deref()) {
        server.shutdown().await;
        return Err(err.into());
    }
    server.record_config(
        config_digest,
        Some(server.attestation().policy_sha256().to_owned()),
    );
    tracing::info!(
        listen = %server.local_addr(),
        "listening; /health answers 503 until the model is loaded"
    );
    let load = tokio::task::spawn_blocking(move || {
        load_model(model_dir.as_deref(), device, engine_config, served_name)
    });
    let loaded = tokio::select! {
        loaded = load => loaded.context("model loading panicked")?,
        () = signals.recv() => {
            tracing::info!("signal received while loading; exiting");
            server.shutdown().await;
            return Ok(());
        }
    };
    let (service, backend_name, kv_tokens) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            server.shutdown().await;
            return Err(err);
        }
    };
    // The banner says "ready": print it only once requests reach the model.
    let banner = banner(&server, &service, &backend_name, kv_tokens);
    server.set_model(service);
    eprintln!("{banner}");
    signals.recv().await;
    tracing::info!("shutdown signal received; finishing in-flight requests");
    server.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// The production profile serves nothing unaudited: without an `[audit]` table it does not start.
fn refuse_unaudited(config: &Config) -> anyhow::Result<()> {
    if config.audit.is_none() {
        anyhow::bail!(
            "the production profile refuses to serve without an audit log: add an [audit] table to the configuration (docs/audit-log.md)"
        );
    }
    Ok(())
}

/// Locks the process's memory (production) and drops to `user` (any profile).
fn harden_after_start(
    production: bool,
    user: Option<&str>,
) -> Result<(), crate::harden::HardenError> {
    if production {
        crate::harden::lock_resident_memory()?;
    }
    if let Some(user) = user {
        crate::harden::drop_privileges(user)?;
        tracing::info!(user, "dropped privileges");
    }
    Ok(())
}

/// Loads the model (the embedded default without `dir`), builds the backend for `device` and
/// starts the engine.
fn load_model(
    dir: Option<&Path>,
    device: Device,
    engine_config: EngineConfig,
    served_name: Option<String>,
) -> anyhow::Result<(ModelService, String, usize)> {
    let model = setup::load_model(dir)?;
    let backend = backend::select(device, &model, &engine_config)?;
    let backend_name = backend.name().to_owned();
    let engine = Engine::spawn(backend, ModelInfo::of(&model), engine_config)?;
    let kv_tokens = engine.kv_cache().capacity_tokens();
    Ok((
        ModelService::new(model, engine, served_name),
        backend_name,
        kv_tokens,
    ))
}

/// The start-up banner: what is served, where, and under which attestation and policy.
fn banner(server: &Server, service: &ModelService, backend: &str, kv_tokens: usize) -> String {
    let identity = server.identity();
    let cert_kind = if identity.self_signed {
        "self-signed"
    } else {
        "from config"
    };
    format!(
        "inferno {version} ready\n  model:       {name}\n  digest:      {digest}\n  backend:     {backend}\n  kv cache:    {kv_tokens} tokens\n  context:     {context} tokens\n  listening:   https://{addr}\n  certificate: {cert_kind}, SHA-256 {fingerprint}\n  attestation: {attestation}\n  policy:      SHA-256 {policy}",
        version = env!("CARGO_PKG_VERSION"),
        name = service.name(),
        digest = service.digest(),
        context = service.max_context(),
        addr = server.local_addr(),
        fingerprint = identity.fingerprint,
        attestation = server.attestation().banner_line(),
        policy = server.attestation().policy_sha256(),
    )
}

/// SIGTERM and SIGINT, watched from start-up to shutdown.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Starts watching both signals (their default action, exiting at once, is replaced).
    fn watch() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
        })
    }

    /// Resolves on the next SIGTERM or SIGINT (or one received since the last call).
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}
