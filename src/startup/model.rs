//! The model at start-up: read (and hashed) before the attestation, the backend prepared ahead
//! on an opened GPU, then the backend and the engine built on it.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use indicatif::ProgressBar;

use crate::backend::cuda::{CudaInitError, EarlyUpload, OpenedDevice};
use crate::backend::{self, Device};
use crate::engine::{Engine, EngineConfig, ModelInfo};
use crate::model::{Model, ModelDigest, ModelFiles, ModelTensors, QuantizeAtLoad, TextAhead};
use crate::server::ModelService;

use super::timeline::Timeline;

/// A model as read before the start-up attestation: the embedded default (parsed), or a
/// directory's files (read and hashed once; parsed after the attestation, while the GPU opens).
pub(super) enum ReadModel {
    /// The embedded default model.
    Embedded(Box<Model>),
    /// A plaintext model directory's files.
    Files(ModelFiles),
}

/// Reads (and hashes) the model directory, handing each block to `early` when given, or loads
/// the embedded default model when none is given, advancing `progress` by the bytes read;
/// returns how long it took.
pub(super) fn read_model(
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
        None => ReadModel::Embedded(Box::new(
            Model::embedded().context("cannot load the embedded model")?,
        )),
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
pub(super) fn prepare_ahead(
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
pub(super) enum GpuOpening {
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
pub(super) fn start_engine(
    dir: Option<&Path>,
    plaintext: Option<ReadModel>,
    text_ahead: Option<std::thread::JoinHandle<Option<TextAhead>>>,
    sealed: Option<ModelFiles>,
    digest: [u8; 32],
    device: Device,
    engine_config: EngineConfig,
    served_name: Option<String>,
    quantize: Option<QuantizeAtLoad>,
    mut timeline: Timeline,
    progress: ProgressBar,
    opening: Option<GpuOpening>,
) -> anyhow::Result<(ModelService, String, String, Timeline)> {
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
        // Quantized at load: the backend builds the served format from the weights as read.
        let mut config = tensors.config.clone();
        if let Some(quantize) = quantize {
            quantize.apply(&mut config);
        }
        let tensors = ModelTensors {
            config: &config,
            weights: tensors.weights,
        };
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
    let mut model = model;
    if let Some(quantize) = quantize {
        quantize.apply(&mut model.config);
    }
    let (backend, phases) = built?;
    timeline.backend = phases;
    let backend_name = backend.name().to_owned();
    let engine_started = Instant::now();
    let engine = Engine::spawn(backend, ModelInfo::of(&model), engine_config)?;
    timeline.engine = engine_started.elapsed();
    let kv_cache = engine.kv_cache().capacity_label();
    Ok((
        ModelService::new(model, engine, served_name),
        backend_name,
        kv_cache,
        timeline,
    ))
}
