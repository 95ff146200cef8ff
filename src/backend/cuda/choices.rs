//! The small-M product paths chosen on a GPU, kept on disk beside the kernel cache.
//!
//! At start-up the backend times its small-M kernels against cuBLASLt for every decode product
//! shape of up to eight rows and keeps the faster path per shape
//! (`CudaBackend::choose_small_m_products`); on the H200 that is 40 shapes and 0.3 s, on the
//! critical path of a start-up from a warm page cache. What it finds depends only on the GPU,
//! its driver, cuBLASLt, the kernels (their sources, the model's shapes, the architecture and
//! NVRTC) and the way it times them, so the choices are stored under a key over all of those
//! ([`ChoiceStore::new`]) and a later start-up with the same key takes them from there; a shape
//! missing from the file, or a file that does not parse, is timed again (and the file
//! rewritten). A stored choice can only pick between two correct paths for a shape the small-M
//! kernel fits (the backend checks that first), so a file changed behind the server's back
//! changes speed, not results beyond rounding; in the appliance it lives on the encrypted data
//! partition with the kernel cache (`docs/cuda-backend.md`).
//!
//! The same file holds, per product shape of more rows (`plan::tuned_rows`), which of cuBLASLt's
//! candidate algorithms was fastest (its index in the heuristic's order, which the key's
//! cuBLASLt version and GPU fix). Files written before those were timed have no `algorithms`
//! list and still load; the shapes missing from it are timed and the file rewritten. Every
//! candidate computes the same product, so a changed file again changes speed only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ring::digest;
use serde::{Deserialize, Serialize};

/// Bumped whenever the way the paths are timed changes, so older choices are not used.
const FORMAT: u32 = 1;

/// A timed product shape: `x[m, k] · w[n, k]ᵀ` and the work that follows it in a step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(super) struct ChosenShape {
    /// The product (`qkv_rope_write`, `gate_up_swiglu` or `plain`).
    pub product: String,
    /// Rows of x (the decode step's rows, 1 to 8; a tuned algorithm's, `plan::tuned_rows`).
    pub m: usize,
    /// Rows of the weight (the product's outputs per row of x).
    pub n: usize,
    /// The depth both share.
    pub k: usize,
}

/// One stored choice.
#[derive(Debug, Serialize, Deserialize)]
struct StoredChoice {
    #[serde(flatten)]
    shape: ChosenShape,
    /// The small-M kernel was faster than cuBLASLt.
    small_m_kernel: bool,
}

/// One stored cuBLASLt algorithm choice.
#[derive(Debug, Serialize, Deserialize)]
struct StoredAlgorithm {
    #[serde(flatten)]
    shape: ChosenShape,
    /// The fastest candidate's index in cuBLASLt's heuristic order.
    candidate: usize,
}

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct StoredChoices {
    format: u32,
    choices: Vec<StoredChoice>,
    /// Absent in files written before algorithms were timed.
    #[serde(default)]
    algorithms: Vec<StoredAlgorithm>,
}

/// The choices read back from a store.
#[derive(Debug, Default)]
pub(super) struct Stored {
    /// Shape → the small-M kernel was faster.
    pub small_m: HashMap<ChosenShape, bool>,
    /// Shape → the fastest cuBLASLt candidate's index.
    pub algorithms: HashMap<ChosenShape, usize>,
}

/// Where the choices for one key are stored.
#[derive(Debug, Clone)]
pub(super) struct ChoiceStore {
    path: PathBuf,
}

impl ChoiceStore {
    /// The store in `dir` for choices that depend on `key_parts` (each part one of the things
    /// the choices depend on: the GPU's name, driver and library versions, the kernels' cache
    /// keys, launch settings).
    pub fn new(dir: &Path, key_parts: &[&str]) -> Self {
        let mut hasher = digest::Context::new(&digest::SHA256);
        hasher.update(format!("product choices {FORMAT}").as_bytes());
        for part in key_parts {
            hasher.update(&[0]);
            hasher.update(part.as_bytes());
        }
        Self {
            path: dir.join(format!("products-{}.json", hex::encode(hasher.finish()))),
        }
    }

    /// The stored choices; empty when there are none or the file does not parse as this format.
    pub fn load(&self) -> Stored {
        let Ok(bytes) = std::fs::read(&self.path) else {
            return Stored::default();
        };
        match serde_json::from_slice::<StoredChoices>(&bytes) {
            Ok(stored) if stored.format == FORMAT => Stored {
                small_m: stored
                    .choices
                    .into_iter()
                    .map(|c| (c.shape, c.small_m_kernel))
                    .collect(),
                algorithms: stored
                    .algorithms
                    .into_iter()
                    .map(|a| (a.shape, a.candidate))
                    .collect(),
            },
            _ => {
                tracing::warn!(path = %self.path.display(), "stored product choices not used: not this format");
                Stored::default()
            }
        }
    }

    /// Stores `choices` (shape → the small-M kernel was faster) and `algorithms` (shape → the
    /// fastest cuBLASLt candidate) atomically (a temporary file renamed over the old one),
    /// creating the directory if needed.
    pub fn save(
        &self,
        choices: &[(ChosenShape, bool)],
        algorithms: &[(ChosenShape, usize)],
    ) -> std::io::Result<()> {
        let stored = StoredChoices {
            format: FORMAT,
            choices: choices
                .iter()
                .map(|(shape, small_m_kernel)| StoredChoice {
                    shape: shape.clone(),
                    small_m_kernel: *small_m_kernel,
                })
                .collect(),
            algorithms: algorithms
                .iter()
                .map(|(shape, candidate)| StoredAlgorithm {
                    shape: shape.clone(),
                    candidate: *candidate,
                })
                .collect(),
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self
            .path
            .with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&stored)?)?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(product: &str, m: usize) -> ChosenShape {
        ChosenShape {
            product: product.into(),
            m,
            n: 6144,
            k: 4096,
        }
    }

    #[test]
    fn choices_come_back_for_the_same_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("kernels");
        let store = ChoiceStore::new(&cache, &["NVIDIA H200", "driver 13000"]);
        assert!(store.load().small_m.is_empty(), "nothing stored yet");
        let choices = [
            (shape("qkv_rope_write", 1), true),
            (shape("qkv_rope_write", 8), false),
        ];
        store.save(&choices, &[(shape("plain", 48), 3)]).unwrap();
        let loaded = store.load().small_m;
        assert_eq!(store.load().algorithms[&shape("plain", 48)], 3);
        assert_eq!(loaded.len(), 2);
        assert!(loaded[&shape("qkv_rope_write", 1)]);
        assert!(!loaded[&shape("qkv_rope_write", 8)]);
        assert!(!loaded.contains_key(&shape("plain", 1)));
        for other in [
            &["NVIDIA H100", "driver 13000"][..],
            &["NVIDIA H200", "driver 13010"],
            &["NVIDIA H200"],
            &["NVIDIA H200driver 13000"],
        ] {
            assert!(
                ChoiceStore::new(&cache, other).load().small_m.is_empty(),
                "{other:?}"
            );
        }
        // Saved again (a shape timed anew), the file is replaced whole.
        store.save(&choices[..1], &[]).unwrap();
        assert_eq!(store.load().small_m.len(), 1);
        assert!(store.load().algorithms.is_empty());
    }

    #[test]
    fn a_file_that_does_not_parse_gives_no_choices() {
        let dir = tempfile::tempdir().unwrap();
        let store = ChoiceStore::new(dir.path(), &["gpu"]);
        std::fs::write(&store.path, b"{\"format\": 1, \"choices\": [").unwrap();
        assert!(store.load().small_m.is_empty());
        std::fs::write(&store.path, b"{\"format\": 0, \"choices\": []}").unwrap();
        assert!(store.load().small_m.is_empty());
        store.save(&[(shape("plain", 2), true)], &[]).unwrap();
        assert_eq!(store.load().small_m.len(), 1);
    }

    #[test]
    fn a_file_from_before_algorithms_were_timed_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = ChoiceStore::new(dir.path(), &["gpu"]);
        std::fs::write(
            &store.path,
            br#"{"format": 1, "choices": [{"product": "plain", "m": 2, "n": 6144, "k": 4096, "small_m_kernel": true}]}"#,
        )
        .unwrap();
        let loaded = store.load();
        assert!(loaded.small_m[&shape("plain", 2)]);
        assert!(loaded.algorithms.is_empty());
    }
}
