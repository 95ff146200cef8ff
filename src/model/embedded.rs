//! The embedded default model: `tests/fixtures/inferno-tiny`, compiled into the binary so that
//! `inferno serve` and `inferno generate` work with no model directory, GPU or network.

use super::{Model, ModelError};

/// The served name of the embedded model.
pub const EMBEDDED_MODEL_NAME: &str = "inferno-tiny";

macro_rules! fixture_file {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/inferno-tiny/",
                $name
            )) as &[u8],
        )
    };
}

/// The files of the embedded model directory.
const FILES: &[(&str, &[u8])] = &[
    fixture_file!("config.json"),
    fixture_file!("generation_config.json"),
    fixture_file!("model.safetensors"),
    fixture_file!("tokenizer.json"),
    fixture_file!("tokenizer_config.json"),
];

impl Model {
    /// Loads the embedded default model (a 1M-parameter Llama 3 layout trained on a small corpus
    /// about confidential computing).
    pub fn embedded() -> Result<Self, ModelError> {
        Self::from_memory(EMBEDDED_MODEL_NAME, FILES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_model_loads_and_matches_the_fixture_directory() {
        let embedded = Model::embedded().expect("embedded model loads");
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inferno-tiny");
        let on_disk = Model::load(&dir).expect("fixture loads");
        assert_eq!(embedded.name, EMBEDDED_MODEL_NAME);
        assert_eq!(embedded.config, on_disk.config);
        // The directory also holds golden.json, which the embedded copy leaves out.
        assert_ne!(embedded.digest.hex, on_disk.digest.hex);
        assert_eq!(embedded.digest.files.len(), FILES.len());
    }
}
