//! Start-up steps shared by the subcommands that run a model.

use std::path::Path;

use anyhow::Context;

use crate::backend::{self, Device};
use crate::engine::{Engine, EngineConfig, EngineHandle, ModelInfo};
use crate::model::Model;

/// Loads the model directory, or the embedded default model when none is given.
pub fn load_model(dir: Option<&Path>) -> anyhow::Result<Model> {
    match dir {
        Some(dir) => {
            Model::load(dir).with_context(|| format!("cannot load the model in {}", dir.display()))
        }
        None => Model::embedded().context("cannot load the embedded model"),
    }
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
        kv_cache = %engine.kv_cache().capacity_label(),
        "engine ready"
    );
    Ok(engine)
}
