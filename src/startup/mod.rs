//! The start-up pipeline of `inferno serve`, from the listening socket to serving: the server and
//! its audit log first, then the model read (and hashed) while the platform is appraised and the
//! GPU opened, the start-up attestation binding the model digest, a sealed model's key release,
//! the backend and the engine, and last the banner. The CLI parses the arguments and the
//! configuration and calls [`serve`].

mod model;
mod sealed;
mod settings;
mod shutdown;
mod timeline;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use crate::attest::StartupAttestation;
use crate::backend::cuda::{CudaInitError, EarlyUpload, OpenedDevice};
use crate::backend::{self, Device};
use crate::config::{AttestationProfile, Config};
use crate::model::TextAhead;
use crate::server::{ModelService, Server};

use model::{GpuOpening, ReadModel, prepare_ahead, read_model, start_engine};
use sealed::{open_sealed_model, sealed_model_digest};
use timeline::progress_bar;

/// Serves `config` until SIGTERM or SIGINT: the model in `model_dir` (the embedded default when
/// none) on `device`; `config_digest` is the SHA-256 of the configuration file, recorded in the
/// audit log.
pub async fn serve(
    config: Config,
    config_digest: Option<String>,
    model_dir: Option<PathBuf>,
    device: Device,
) -> anyhow::Result<()> {
    let mut timeline = timeline::Timeline::start();
    let progress = progress_bar();
    let engine_config = crate::engine::EngineConfig {
        speculative: config.speculative.clone(),
        ..config.engine.clone()
    };
    let served_name = config.server.served_model_name.clone();
    let key_source = config.model.key.clone();
    let quantize = config.model.quantization;
    // After a cold boot, the driver library and this binary would be faulted in from disk only
    // once the model is read: ask for them now, in the background (no CUDA call).
    if device != Device::Cpu {
        std::thread::spawn(backend::cuda::prefetch_driver);
    }
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
    let use_cuda = config.attestation.cuda;
    let attestation_config = config.attestation.clone();
    let server = Server::start(config).await?;
    // The keys exist and the socket and the audit log are open: lock the keys' pages, then give
    // up privileges before the model (operator-supplied files) is read.
    if let Err(err) = harden_after_start(production, user.as_deref()) {
        server.shutdown().await;
        return Err(err.into());
    }
    timeline.server = timeline.elapsed();
    tracing::info!(
        listen = %server.local_addr(),
        "listening; /health answers 503 until the model is loaded and attested"
    );
    // The start-up evidence binds the model digest, so it is known first: a sealed model's
    // manifest states it (opening the model checks every byte against it), a plaintext model is
    // read and hashed once. While a plaintext model is read for the GPU, the platform is
    // appraised (evidence binding no start-up value) and, once it passed, the GPU opened and the
    // weight bytes copied to it as they are hashed; otherwise the GPU is opened only after the
    // start-up evidence passed. Nothing is served before that evidence binds the digest.
    let sealed_digest = match sealed_model_digest(model_dir.as_deref()) {
        Ok(digest) => digest,
        Err(err) => {
            server.shutdown().await;
            return Err(err);
        }
    };
    let mut early_device = None;
    // The sink of a plaintext model's read for the GPU.
    let early = (use_cuda && sealed_digest.is_none() && model_dir.is_some())
        .then(|| Arc::new(EarlyUpload::new()));
    // A plaintext model's tokenizer and chat template are parsed from the files read apart from
    // the hashed ones; used only if the hashed files hold the same bytes. Beside a read that
    // the disk bounds, or after a read from a warm page cache (beside it, the parse made it
    // 0.18 s longer: `docs/model-loading.md`, "Where the start-up time goes").
    let text_ahead = match (&sealed_digest, &model_dir) {
        (None, Some(dir)) => {
            let dir = dir.clone();
            let read = early.clone();
            Some(std::thread::spawn(move || {
                if let Some(read) = read {
                    read.wait_while_read_is_fast();
                }
                TextAhead::parse(&dir)
            }))
        }
        _ => None,
    };
    let plaintext = match sealed_digest {
        Some(_) => None,
        None => {
            let dir = model_dir.clone();
            let progress = progress.clone();
            progress.set_message("reading");
            let sink = early.clone();
            let read = tokio::task::spawn_blocking(move || {
                let read = read_model(dir.as_deref(), &progress, sink.as_deref());
                // Whatever happened, the backend's preparation no longer waits for the read.
                if let Some(sink) = &sink {
                    sink.read_over();
                }
                read
            });
            let read = async { read.await.context("model loading panicked")? };
            let open_early = async {
                let Some(early) = early else {
                    return Ok(None);
                };
                server.check_platform().await?;
                let dir = model_dir.clone();
                let engine = engine_config.clone();
                let opened = tokio::task::spawn_blocking(move || {
                    let mut opened =
                        OpenedDevice::open(backend::cuda::CudaOptions::default().device)?;
                    opened.copy_early(early);
                    if let Some(dir) = dir {
                        let path = dir.join(crate::model::CONFIG_FILE);
                        let config = std::fs::read(&path).map_err(|e| e.to_string());
                        prepare_ahead(&mut opened, &path, config, &engine);
                    }
                    Ok::<_, CudaInitError>(opened)
                })
                .await
                .context("opening the GPU panicked")?
                .map_err(backend::BackendInitError::from)?;
                anyhow::Ok(Some(opened))
            };
            let loaded = tokio::select! {
                loaded = async { tokio::try_join!(read, open_early) } => loaded,
                () = signals.recv() => {
                    tracing::info!("signal received while loading; exiting");
                    server.shutdown().await;
                    return Ok(());
                }
            };
            match loaded {
                Ok(((model, took), opened)) => {
                    match &model {
                        ReadModel::Embedded(_) => timeline.parse = took,
                        ReadModel::Files(_) => timeline.read_hash = took,
                    }
                    early_device = opened;
                    Some(model)
                }
                Err(err) => {
                    server.shutdown().await;
                    return Err(err);
                }
            }
        }
    };
    let model_digest = match (&plaintext, sealed_digest) {
        (Some(ReadModel::Embedded(model)), _) => model.digest.bytes,
        (Some(ReadModel::Files(files)), _) => files.digest().bytes,
        (None, Some(digest)) => digest,
        (None, None) => unreachable!("either the manifest or the model gave the digest"),
    };
    let attest_started = Instant::now();
    let attestation = match server.attest(model_digest).await {
        Ok(attestation) => attestation,
        Err(err) => {
            server.shutdown().await;
            return Err(err.into());
        }
    };
    timeline.attest = attest_started.elapsed();
    server.record_config(config_digest, Some(attestation.policy_sha256().to_owned()));
    // The attestation passed (and set the GPU's ready state): open the GPU on another thread
    // while the model is opened or parsed, unless it was opened while the model was read. A
    // sealed model's chunks are copied to it as they are decrypted once it is open.
    let sealed_early = (use_cuda && sealed_digest.is_some()).then(|| Arc::new(EarlyUpload::new()));
    let opening = match early_device {
        Some(opened) => Some(GpuOpening::Open(Box::new(opened))),
        None => use_cuda.then(|| {
            let early = sealed_early.clone();
            let dir = model_dir.clone();
            let engine = engine_config.clone();
            GpuOpening::Opening(std::thread::spawn(move || {
                let mut opened = OpenedDevice::open(backend::cuda::CudaOptions::default().device)?;
                if let Some(early) = early {
                    opened.copy_early(early.clone());
                    // A sealed model's configuration is known once its chunk was decrypted.
                    if let (Some(dir), Some(config)) = (dir, early.wait_for_config()) {
                        let path = dir.join(crate::model::CONFIG_FILE);
                        prepare_ahead(&mut opened, &path, Ok(config), &engine);
                    }
                }
                Ok(opened)
            }))
        }),
    };
    // A sealed model is opened (key released, chunks decrypted and hashed) before anything
    // else touches it; every refusal is final, recorded and stops start-up.
    let open_started = Instant::now();
    // A key broker that does not answer holds this for up to its timeouts: a signal ends it.
    let opened_sealed = tokio::select! {
        opened = open_sealed_model(
            &server,
            &attestation,
            model_dir.as_deref(),
            key_source,
            &attestation_config,
            &progress,
            sealed_early.clone(),
        ) => opened,
        () = signals.recv() => {
            tracing::info!("signal received while opening the sealed model; exiting");
            if let Some(early) = &sealed_early {
                early.read_over();
            }
            server.shutdown().await;
            return Ok(());
        }
    };
    // Whatever happened, the GPU's thread no longer waits for the sealed configuration.
    if let Some(early) = &sealed_early {
        early.read_over();
    }
    let sealed = match opened_sealed {
        Ok(sealed) => {
            if sealed.is_some() {
                timeline.read_hash = open_started.elapsed();
            }
            sealed
        }
        Err(err) => {
            server.shutdown().await;
            return Err(err);
        }
    };
    let load = tokio::task::spawn_blocking(move || {
        start_engine(
            model_dir.as_deref(),
            plaintext,
            text_ahead,
            sealed,
            model_digest,
            device,
            engine_config,
            served_name,
            quantize,
            timeline,
            progress,
            opening,
        )
    });
    let loaded = tokio::select! {
        loaded = load => loaded.context("model loading panicked")?,
        () = signals.recv() => {
            tracing::info!("signal received while loading; exiting");
            server.shutdown().await;
            return Ok(());
        }
    };
    let (service, backend_name, kv_cache, timeline) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            server.shutdown().await;
            return Err(err);
        }
    };
    // The banner says "ready": print it only once requests reach the model.
    server.set_model(service);
    let service = server.app().service().context("the model was just set")?;
    let banner = banner(&server, &attestation, service, &backend_name, &kv_cache)
        + &settings::banner_lines(&server, service);
    timeline.log();
    eprintln!("{banner}");
    signals.recv().await;
    tracing::info!("shutdown signal received; finishing in-flight requests");
    shutdown::drain_or_force(server, signals.recv()).await;
    tracing::info!("stopped");
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

/// The start-up banner: what is served, where, and under which attestation and policy.
fn banner(
    server: &Server,
    attestation: &StartupAttestation,
    service: &ModelService,
    backend: &str,
    kv_cache: &str,
) -> String {
    format!(
        "inferno {version} ready\n  model:       {name}\n  digest:      {digest}\n  weights:     {format}\n  backend:     {backend}\n  kv cache:    {kv_cache}\n  context:     {context} tokens\n  listening:   https://{addr}\n  certificate: self-signed, carries the evidence, SHA-256 {fingerprint}\n  attestation: {attestation}\n  policy:      SHA-256 {policy}",
        version = env!("CARGO_PKG_VERSION"),
        name = service.name(),
        digest = service.digest(),
        format = service.weight_format(),
        context = service.max_context(),
        addr = server.local_addr(),
        fingerprint = server.identity().fingerprint(),
        attestation = attestation.banner_line(),
        policy = attestation.policy_sha256(),
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
