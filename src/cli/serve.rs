//! `inferno serve`: load the model, start the engine and serve the OpenAI API over TLS until
//! SIGTERM or SIGINT.

use anyhow::Context;
use indicatif::ProgressBar;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use super::{setup, startup};
use crate::attest::StartupAttestation;
use crate::backend::cuda::{CudaInitError, EarlyUpload, OpenedDevice};
use crate::backend::{self, Device};
use crate::config::{AttestationConfig, AttestationProfile, Config, ModelKeySource};
use crate::engine::{Engine, EngineConfig, ModelInfo};
use crate::model::{Model, ModelDigest, ModelFiles, ModelTensors, TextAhead};
use crate::seal::{self, ModelKey};
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
    /// The key file of a sealed model (`--model` names the sealed directory), overriding
    /// `[model.key]`. Development only: the production profile refuses key files.
    #[arg(long, value_name = "FILE")]
    model_key_file: Option<PathBuf>,
    /// The key broker that releases the key of a sealed model (`--model` names the sealed
    /// directory, sealed with `inferno seal --recipient`), overriding `[model.key]`.
    #[arg(long, value_name = "URL", conflicts_with = "model_key_file")]
    key_broker: Option<String>,
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
    runtime.block_on(serve_async(config, config_digest, args.model, args.device))
}

async fn serve_async(
    config: Config,
    config_digest: Option<String>,
    model_dir: Option<PathBuf>,
    device: Device,
) -> anyhow::Result<()> {
    let mut timeline = startup::Timeline::start();
    let progress = startup::progress_bar();
    let engine_config = config.engine.clone();
    let served_name = config.server.served_model_name.clone();
    let key_source = config.model.key.clone();
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
    // 0.18 s longer: `docs/benchmarks.md`, 2026-11-30).
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
    let opened_sealed = open_sealed_model(
        &server,
        &attestation,
        model_dir.as_deref(),
        key_source,
        &attestation_config,
        &progress,
        sealed_early.clone(),
    )
    .await;
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
    let (service, backend_name, kv_tokens, timeline) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            server.shutdown().await;
            return Err(err);
        }
    };
    // The banner says "ready": print it only once requests reach the model.
    server.set_model(service);
    let service = server.app().service().context("the model was just set")?;
    let banner = banner(&server, &attestation, service, &backend_name, kv_tokens)
        + &super::serve_flags::banner_lines(&server, service);
    timeline.log();
    eprintln!("{banner}");
    signals.recv().await;
    tracing::info!("shutdown signal received; finishing in-flight requests");
    super::shutdown::drain_or_force(server, signals.recv()).await;
    tracing::info!("stopped");
    Ok(())
}

/// When `dir` holds a sealed model: obtains its key from `source` (refusing a key file outside
/// the development profile; asking a key broker with fresh evidence collected under
/// `attestation`), decrypts it and records the release, or the refusal, in the audit log before
/// returning; each chunk decrypted goes to `early` as well when given. `None` for a plaintext
/// model (then `source` must be absent).
async fn open_sealed_model(
    server: &Server,
    startup: &StartupAttestation,
    dir: Option<&Path>,
    source: Option<ModelKeySource>,
    attestation: &AttestationConfig,
    progress: &ProgressBar,
    early: Option<Arc<EarlyUpload>>,
) -> anyhow::Result<Option<ModelFiles>> {
    let sealed_dir = dir.filter(|d| seal::is_sealed(d)).map(Path::to_path_buf);
    let (dir, source) = match (sealed_dir, source) {
        (None, None) => return Ok(None),
        (None, Some(_)) => anyhow::bail!(
            "a model key source is configured but {} is not a sealed model (no {})",
            dir.map_or_else(|| "the embedded model".into(), |d| d.display().to_string()),
            seal::MANIFEST_FILE
        ),
        (Some(dir), source) => (dir, source),
    };
    let key_id = seal::Manifest::read(&dir)
        .map(|(manifest, _)| manifest.key_id)
        .unwrap_or_else(|_| "unknown".into());
    let refuse = async |reason: String| -> anyhow::Error {
        let record = server
            .record_key_release(key_id.clone(), false, reason.clone())
            .await;
        match record {
            Ok(()) => anyhow::anyhow!("sealed model refused: {reason}"),
            Err(err) => anyhow::anyhow!(
                "sealed model refused: {reason} (and the audit record failed: {err})"
            ),
        }
    };
    let (key, how) = match source {
        None => {
            return Err(refuse(format!(
                "{} is a sealed model and no key source is configured ([model.key] or --model-key-file)",
                dir.display()
            ))
            .await);
        }
        Some(ModelKeySource::File { path }) => {
            if let Err(reason) = seal::check_key_file_allowed(startup.profile) {
                return Err(refuse(format!("key file {}: {reason}", path.display())).await);
            }
            match ModelKey::read_file(&path) {
                Ok(key) => (
                    key,
                    format!("key file {} (development profile)", path.display()),
                ),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Tpm { blob, tcti }) => {
            let tcti = tcti.unwrap_or_else(|| seal::tpm::DEFAULT_TCTI.to_owned());
            let unsealed = tokio::task::spawn_blocking({
                let (blob, tcti) = (blob.clone(), tcti.clone());
                move || {
                    seal::tpm::TpmSealedKey::read(&blob)
                        .and_then(|sealed| seal::tpm::unseal_key(&tcti, &sealed))
                }
            })
            .await
            .context("unsealing from the TPM panicked")?;
            match unsealed {
                Ok(key) => (key, format!("TPM {tcti}, blob {}", blob.display())),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Snp { blob }) => {
            let unsealed = tokio::task::spawn_blocking({
                let blob = blob.clone();
                move || {
                    seal::snp::SnpSealedKey::read(&blob)
                        .and_then(|sealed| seal::snp::unseal(&sealed))
                }
            })
            .await
            .context("the SEV-SNP derived key task panicked")?;
            match unsealed {
                Ok(key) => (key, format!("SEV-SNP derived key, blob {}", blob.display())),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Broker { url, retries }) => {
            match key_from_broker(startup, &dir, &url, retries, attestation).await {
                Ok(key) => (key, format!("key broker {url}")),
                Err(reason) => return Err(refuse(reason).await),
            }
        }
    };
    let policy = startup.policy_sha256().to_owned();
    let opened = tokio::task::spawn_blocking({
        let dir = dir.clone();
        let progress = progress.clone();
        move || {
            let started = std::time::Instant::now();
            progress.set_message("decrypting");
            let (manifest, files) = match &early {
                Some(early) => seal::open_sealed_streaming(&dir, &key, &progress, &**early)?,
                None => seal::open_sealed_reporting(&dir, &key, &progress)?,
            };
            drop(key);
            let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(
                bytes,
                ms = (secs * 1e3) as u64,
                gb_per_s = format!("{:.1}", bytes as f64 / secs.max(1e-9) / 1e9),
                "sealed model opened (read, decrypted and hashed in one pass)"
            );
            let allowed = &manifest.release.policy_sha256;
            if !allowed.is_empty() && !allowed.contains(&policy) {
                return Err(anyhow::anyhow!(
                    "the server policy {policy} is not among the policies the model was sealed for"
                ));
            }
            Ok::<_, anyhow::Error>(files)
        }
    })
    .await
    .context("opening the sealed model panicked")?;
    match opened {
        Ok(files) => {
            server
                .record_key_release(key_id, true, how)
                .await
                .context("audit: the key release record failed")?;
            Ok(Some(files))
        }
        Err(err) => Err(refuse(format!("{err:#}")).await),
    }
}

/// Asks the key broker at `url` for the key of the sealed model in `dir`, with fresh evidence
/// binding the broker's challenge and an ephemeral key; the one-line reason when none came.
async fn key_from_broker(
    startup: &StartupAttestation,
    dir: &Path,
    url: &str,
    retries: u32,
    attestation: &AttestationConfig,
) -> Result<ModelKey, String> {
    let (manifest, _) = seal::Manifest::read(dir).map_err(|e| e.to_string())?;
    let wrapped_key = manifest.wrapped_key.clone().ok_or_else(|| {
        format!(
            "{} was not sealed for a key broker (no wrapped_key; seal it with `inferno seal --recipient`)",
            dir.display()
        )
    })?;
    let tee = serde_json::to_value(startup.evidence.platform)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let request = crate::keybroker::KeyRequest {
        model_id: manifest
            .release
            .model_id
            .clone()
            .unwrap_or_else(|| Model::name_of_dir(dir)),
        key_id: manifest.key_id.clone(),
        wrapped_key,
        tee,
    };
    let config = attestation.clone();
    let evidence_for = move |mut runtime_data| {
        crate::attest::collect_fresh_evidence(&config, &mut runtime_data).map_err(|e| e.to_string())
    };
    crate::keybroker::request_key(url, &request, &startup.runtime_data, retries, evidence_for)
        .await
        .map_err(|e| e.to_string())
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

/// The model digest a sealed model's manifest states, read before the model is opened (the
/// start-up evidence binds it); `None` for a plaintext model or the embedded default.
fn sealed_model_digest(dir: Option<&Path>) -> anyhow::Result<Option<[u8; 32]>> {
    let Some(dir) = dir.filter(|d| seal::is_sealed(d)) else {
        return Ok(None);
    };
    let (manifest, _) = seal::Manifest::read(dir).with_context(|| {
        format!(
            "cannot read the sealed model's manifest in {}",
            dir.display()
        )
    })?;
    let bytes = hex::decode(&manifest.model_digest)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .with_context(|| {
            format!(
                "the sealed model's manifest in {} has no valid model_digest",
                dir.display()
            )
        })?;
    Ok(Some(bytes))
}

/// A model as read before the start-up attestation: the embedded default (parsed), or a
/// directory's files (read and hashed once; parsed after the attestation, while the GPU opens).
enum ReadModel {
    /// The embedded default model.
    Embedded(Box<Model>),
    /// A plaintext model directory's files.
    Files(ModelFiles),
}

/// Reads (and hashes) the model directory, handing each block to `early` when given, or loads
/// the embedded default model when none is given, advancing `progress` by the bytes read;
/// returns how long it took.
fn read_model(
    dir: Option<&Path>,
    progress: &ProgressBar,
    early: Option<&EarlyUpload>,
) -> anyhow::Result<(ReadModel, std::time::Duration)> {
    let started = Instant::now();
    let model = match dir {
        Some(dir) => ReadModel::Files(
            match early {
                Some(early) => ModelFiles::read_dir_streaming(dir, progress, early),
                None => ModelFiles::read_dir_reporting(dir, progress),
            }
            .with_context(|| format!("cannot load the model in {}", dir.display()))?,
        ),
        None => ReadModel::Embedded(Box::new(setup::load_model(None)?)),
    };
    let took = started.elapsed();
    tracing::info!(ms = took.as_millis() as u64, "model read");
    Ok((model, took))
}

/// Prepares on `opened`, ahead of the model, the backend (kernels included) for the configuration
/// in `config` (the bytes of `path`, read apart from the hashed files while they are read, or a
/// sealed model's decrypted chunk), for `engine`. What was prepared is used only when the model
/// turns out to have that configuration; a configuration that cannot be read or a preparation
/// that fails leaves the work to the backend, after the read.
fn prepare_ahead(
    opened: &mut OpenedDevice,
    path: &Path,
    config: Result<Vec<u8>, String>,
    engine: &EngineConfig,
) {
    let config = config.and_then(|bytes| {
        crate::model::ModelConfig::from_json(path, &bytes).map_err(|e| e.to_string())
    });
    // The weights' buffers come first (the early copies land in them from then on), then the
    // kernels and the rest.
    let prepared = config.and_then(|config| {
        opened
            .prepare_backend(&config, engine, backend::cuda::CudaOptions::default())
            .map_err(|e| e.to_string())
    });
    if let Err(why) = prepared {
        tracing::info!(%why, "backend not prepared ahead; it is built after the read");
    }
}

/// The GPU for the backend: opened while the model was read, or opening on another thread.
enum GpuOpening {
    /// Opened (after the platform check) while the model was read.
    Open(Box<OpenedDevice>),
    /// Opening since the start-up attestation passed.
    Opening(std::thread::JoinHandle<Result<OpenedDevice, CudaInitError>>),
}

/// Builds the backend for `device` and starts the engine on the model: the plaintext model read
/// before attestation, or the opened sealed model, whose digest must be the attested `digest`.
/// The GPU (`opening`: opened while the model was read, or opening since the attestation) is
/// used once opened, and the text parts parsed during the read (`text_ahead`) when they were
/// parsed from the same bytes. Records the phases in `timeline`; `progress` counts the bytes
/// uploaded.
#[allow(clippy::too_many_arguments)]
fn start_engine(
    dir: Option<&Path>,
    plaintext: Option<ReadModel>,
    text_ahead: Option<std::thread::JoinHandle<Option<TextAhead>>>,
    sealed: Option<ModelFiles>,
    digest: [u8; 32],
    device: Device,
    engine_config: EngineConfig,
    served_name: Option<String>,
    mut timeline: startup::Timeline,
    progress: ProgressBar,
    opening: Option<GpuOpening>,
) -> anyhow::Result<(ModelService, String, usize, startup::Timeline)> {
    // Checked before anything of the model is used (what was parsed or copied during the read
    // is used only for the bytes this digest covers).
    let check_digest = |actual: &ModelDigest| {
        if actual.bytes == digest {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "the loaded model's digest {actual} is not the attested digest {}",
                hex::encode(digest)
            ))
        }
    };
    // The backend is built from the configuration and the weights while the tokenizer and the
    // chat template are parsed on another thread.
    let build = |tensors: ModelTensors<'_>| -> anyhow::Result<_> {
        let opened = match opening {
            Some(GpuOpening::Open(opened)) => Some(*opened),
            Some(GpuOpening::Opening(opening)) => Some(
                opening
                    .join()
                    .map_err(|_| anyhow::anyhow!("opening the GPU panicked"))?
                    .map_err(backend::BackendInitError::from)?,
            ),
            None => None,
        };
        progress.set_message("uploading");
        let built = backend::select_reporting(device, tensors, &engine_config, &progress, opened)?;
        progress.finish_and_clear();
        Ok(built)
    };
    let (model, built) = match (plaintext, sealed, dir) {
        (Some(ReadModel::Embedded(model)), _, _) => {
            check_digest(&model.digest)?;
            let built = build(model.tensors());
            (*model, built)
        }
        (Some(ReadModel::Files(files)), _, Some(dir)) | (None, Some(files), Some(dir)) => {
            check_digest(files.digest())?;
            let parse_started = Instant::now();
            let mut parsed = None;
            let (model, built) = Model::from_files_building_ahead(
                &files,
                Model::name_of_dir(dir),
                || text_ahead.and_then(|ahead| ahead.join().ok().flatten()),
                |tensors| {
                    parsed = Some(parse_started.elapsed());
                    build(tensors)
                },
            )
            .with_context(|| format!("cannot load the model in {}", dir.display()))?;
            // The buffers stay alive (shared) only as long as the model needs them.
            drop(files);
            // What the backend waited for: the configuration and the weights' headers.
            timeline.parse = parsed.unwrap_or_default();
            (model, built)
        }
        _ => anyhow::bail!("no model to serve: neither a plaintext nor an opened sealed model"),
    };
    let (backend, phases) = built?;
    timeline.backend = phases;
    let backend_name = backend.name().to_owned();
    let engine_started = Instant::now();
    let engine = Engine::spawn(backend, ModelInfo::of(&model), engine_config)?;
    timeline.engine = engine_started.elapsed();
    let kv_tokens = engine.kv_cache().capacity_tokens();
    Ok((
        ModelService::new(model, engine, served_name),
        backend_name,
        kv_tokens,
        timeline,
    ))
}

/// The start-up banner: what is served, where, and under which attestation and policy.
fn banner(
    server: &Server,
    attestation: &StartupAttestation,
    service: &ModelService,
    backend: &str,
    kv_tokens: usize,
) -> String {
    format!(
        "inferno {version} ready\n  model:       {name}\n  digest:      {digest}\n  backend:     {backend}\n  kv cache:    {kv_tokens} tokens\n  context:     {context} tokens\n  listening:   https://{addr}\n  certificate: self-signed, carries the evidence, SHA-256 {fingerprint}\n  attestation: {attestation}\n  policy:      SHA-256 {policy}",
        version = env!("CARGO_PKG_VERSION"),
        name = service.name(),
        digest = service.digest(),
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
