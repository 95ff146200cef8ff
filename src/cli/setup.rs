//! Start-up steps shared by the subcommands that run a model.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;

use crate::backend::{self, Device};
use crate::engine::{Engine, EngineConfig, EngineHandle, ModelInfo};
use crate::model::{Model, ModelFiles};

/// Loads the model directory, or the embedded default model when none is given.
pub fn load_model(dir: Option<&Path>) -> anyhow::Result<Model> {
    match dir {
        Some(dir) => {
            Model::load(dir).with_context(|| format!("cannot load the model in {}", dir.display()))
        }
        None => Model::embedded().context("cannot load the embedded model"),
    }
}

/// [`load_model`], advancing `progress` by the bytes read, and returning how long reading and
/// hashing the files, then parsing them, took (an embedded model is all parsing).
pub fn load_model_reporting(
    dir: Option<&Path>,
    progress: &ProgressBar,
) -> anyhow::Result<(Model, Duration, Duration)> {
    let Some(dir) = dir else {
        let started = Instant::now();
        let model = load_model(None)?;
        return Ok((model, Duration::ZERO, started.elapsed()));
    };
    let failed = || format!("cannot load the model in {}", dir.display());
    let started = Instant::now();
    let files = ModelFiles::read_dir_reporting(dir, progress).with_context(failed)?;
    let read_hash = started.elapsed();
    let started = Instant::now();
    let model = Model::from_files(&files, Model::name_of_dir(dir)).with_context(failed)?;
    Ok((model, read_hash, started.elapsed()))
}

/// Builds the backend for `device` and starts an engine on it.
pub fn start_engine(
    model: &Model,
    device: Device,
    config: &EngineConfig,
) -> anyhow::Result<EngineHandle> {
    let backend = backend::select(device, model, config)?;
    let engine = Engine::spawn(backend, ModelInfo::of(model), config.clone())?;
    tracing::info!(
        model = %model.name,
        digest = %model.digest,
        kv_cache_tokens = engine.kv_cache().capacity_tokens(),
        "engine ready"
    );
    Ok(engine)
}
