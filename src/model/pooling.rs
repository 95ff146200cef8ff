//! The pooling settings of a sentence-transformers embedding model (Qwen3-Embedding and the
//! like): `modules.json` (which modules run after the transformer), its pooling module's
//! `config.json`, `config_sentence_transformers.json` (the default prompt) and the Matryoshka
//! keys of `config.json` (`is_matryoshka`, `matryoshka_dimensions`, as vLLM reads them).
//!
//! Decoder embedding models pool the final hidden state of the last token; any other pooling
//! mode, and modules other than the transformer, pooling and normalization, are refused at load.

use std::path::Path;

use serde_json::Value;

use super::error::ModelError;
use super::source::ModelSource;

/// `modules.json`: the sentence-transformers pipeline.
pub const MODULES_FILE: &str = "modules.json";
/// `config_sentence_transformers.json`: prompts and the default prompt.
pub const SENTENCE_TRANSFORMERS_FILE: &str = "config_sentence_transformers.json";

/// How an embedding model turns hidden states into an embedding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    /// Whether the embedding is scaled to unit L2 norm (a `Normalize` module).
    pub normalize: bool,
    /// The text put before every input (`prompts[default_prompt_name]`), when one is named.
    pub default_prompt: Option<String>,
    /// The output sizes the model was trained to be cut to (Matryoshka); `None`: it may not be
    /// cut; an empty list: any size up to the hidden size.
    pub matryoshka: Option<Vec<usize>>,
}

fn invalid(path: &Path, field: &str, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidField {
        path: path.to_path_buf(),
        field: field.into(),
        reason: reason.into(),
    }
}

fn json(path: &Path, bytes: &[u8]) -> Result<Value, ModelError> {
    serde_json::from_slice(bytes).map_err(|err| invalid(path, "(contents)", err.to_string()))
}

impl Pooling {
    /// The model's pooling, or `None` when it has no `modules.json` (a generative model).
    /// `config` is `config.json`'s contents.
    pub(crate) fn load(
        source: &ModelSource<'_>,
        config: &[u8],
    ) -> Result<Option<Self>, ModelError> {
        let Some(modules) = source.read_optional(MODULES_FILE)? else {
            return Ok(None);
        };
        let modules_path = source.path(MODULES_FILE);
        let modules = json(&modules_path, &modules)?;
        let mut normalize = false;
        let mut pooling = false;
        for (index, module) in modules.as_array().into_iter().flatten().enumerate() {
            let kind = module["type"].as_str().unwrap_or_default();
            match kind.rsplit('.').next().unwrap_or_default() {
                "Transformer" => {}
                "Normalize" => normalize = true,
                "Pooling" => {
                    pooling = true;
                    let dir = module["path"].as_str().unwrap_or_default();
                    check_pooling_mode(source, dir)?;
                }
                _ => {
                    return Err(invalid(
                        &modules_path,
                        &format!("[{index}].type"),
                        format!(
                            "the module {kind:?} is not supported (Transformer, Pooling, Normalize)"
                        ),
                    ));
                }
            }
        }
        if !pooling {
            return Err(invalid(
                &modules_path,
                "type",
                "an embedding model needs a sentence_transformers.models.Pooling module",
            ));
        }
        let default_prompt = match source.read_optional(SENTENCE_TRANSFORMERS_FILE)? {
            None => None,
            Some(bytes) => {
                let path = source.path(SENTENCE_TRANSFORMERS_FILE);
                let settings = json(&path, &bytes)?;
                match settings["default_prompt_name"].as_str() {
                    None => None,
                    Some(name) => Some(
                        settings["prompts"][name]
                            .as_str()
                            .ok_or_else(|| {
                                invalid(
                                    &path,
                                    "default_prompt_name",
                                    format!("names {name:?}, which prompts does not hold"),
                                )
                            })?
                            .to_owned(),
                    ),
                }
            }
        };
        let config = json(&source.path(super::CONFIG_FILE), config)?;
        let matryoshka = match (&config["matryoshka_dimensions"], &config["is_matryoshka"]) {
            (Value::Array(sizes), _) => Some(
                sizes
                    .iter()
                    .map(|size| size.as_u64().map(|size| size as usize))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        invalid(
                            &source.path(super::CONFIG_FILE),
                            "matryoshka_dimensions",
                            "must be a list of sizes",
                        )
                    })?,
            ),
            (_, Value::Bool(true)) => Some(Vec::new()),
            _ => None,
        };
        Ok(Some(Self {
            normalize,
            default_prompt,
            matryoshka,
        }))
    }
}

/// Refuses a pooling module whose `config.json` asks for anything but last-token pooling. The
/// file sits in a subdirectory, which the model's files (and digest) do not cover: it is read
/// from the directory when there is one, and can only make the load fail, never change the
/// output (last-token pooling is all a decoder embedding model is served with).
fn check_pooling_mode(source: &ModelSource<'_>, dir: &str) -> Result<(), ModelError> {
    if matches!(source, ModelSource::Memory(_)) {
        return Ok(());
    }
    let path = source.path(dir).join(super::CONFIG_FILE);
    let bytes = match super::files::read_regular(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ModelError::Io { path, source }),
    };
    let config = json(&path, &bytes)?;
    let modes: Vec<&str> = config
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, value)| key.starts_with("pooling_mode_") && value == &&Value::Bool(true))
        .map(|(key, _)| key.as_str())
        .collect();
    if modes != ["pooling_mode_lasttoken"] {
        return Err(invalid(
            &path,
            "pooling_mode_*",
            format!(
                "only last-token pooling (pooling_mode_lasttoken) is supported for decoder models, found {modes:?}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(
        files: &'static [(&'static str, &'static [u8])],
    ) -> Result<Option<Pooling>, ModelError> {
        let config = files
            .iter()
            .find(|(name, _)| *name == "config.json")
            .map_or(&b"{}"[..], |(_, bytes)| *bytes);
        Pooling::load(&ModelSource::Memory(files), config)
    }

    #[test]
    fn sentence_transformers_files_give_the_pooling() {
        let pooling = load(&[
            (
                "modules.json",
                br#"[{"idx":0,"path":"","type":"sentence_transformers.models.Transformer"},
                    {"idx":1,"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                    {"idx":2,"path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
            ),
            (
                "config_sentence_transformers.json",
                br#"{"prompts":{"query":"Query: ","document":""},"default_prompt_name":"query"}"#,
            ),
            ("config.json", br#"{"matryoshka_dimensions":[32,64]}"#),
        ])
        .expect("loads")
        .expect("an embedding model");
        assert!(pooling.normalize);
        assert_eq!(pooling.default_prompt.as_deref(), Some("Query: "));
        assert_eq!(pooling.matryoshka, Some(vec![32, 64]));
        assert_eq!(load(&[]).expect("loads"), None);
    }

    #[test]
    fn other_modules_are_refused() {
        let err = load(&[(
            "modules.json",
            br#"[{"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                {"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
        )])
        .expect_err("refused");
        assert!(err.to_string().contains("Dense"), "{err}");
    }

    #[test]
    fn a_pooling_mode_other_than_last_token_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("1_Pooling")).expect("dir");
        std::fs::write(
            dir.path().join("1_Pooling/config.json"),
            br#"{"pooling_mode_mean_tokens": true, "pooling_mode_lasttoken": false}"#,
        )
        .expect("write");
        std::fs::write(
            dir.path().join("modules.json"),
            br#"[{"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
        )
        .expect("write");
        let files = crate::model::ModelFiles::read_dir(dir.path()).expect("read");
        let err = Pooling::load(&ModelSource::Files(&files), b"{}").expect_err("refused");
        assert!(
            err.to_string().contains("pooling_mode_mean_tokens"),
            "{err}"
        );
    }
}
