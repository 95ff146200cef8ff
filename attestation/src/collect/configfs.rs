//! Linux configfs-tsm (`/sys/kernel/config/tsm/report`): one report per directory entry.
//! Write 64 bytes to `inblob`, read `outblob` (SNP report or TDX quote) and `auxblob` (SNP
//! certificate table), and compare `generation` before and after to detect a concurrent writer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CollectError, EvidenceSource, PlatformEvidence};
use crate::abi::snp_certs;
use crate::evidence::{Base64Bytes, SnpCert, SnpEvidence, TdxEvidence};

/// The kernel's default mount point.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/tsm/report";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The configfs-tsm report interface.
#[derive(Debug, Clone)]
pub struct ConfigFsTsm {
    root: PathBuf,
}

impl Default for ConfigFsTsm {
    fn default() -> Self {
        Self {
            root: PathBuf::from(DEFAULT_ROOT),
        }
    }
}

fn io(what: &Path, source: std::io::Error) -> CollectError {
    CollectError::Io {
        what: what.display().to_string(),
        source,
    }
}

impl ConfigFsTsm {
    /// An interface rooted elsewhere than [`DEFAULT_ROOT`].
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the root directory exists.
    pub fn available(&self) -> bool {
        self.root.is_dir()
    }

    /// Performs one request in an existing entry directory (created by configfs on `mkdir`).
    pub fn request_in(
        entry: &Path,
        report_data: &[u8; 64],
    ) -> Result<PlatformEvidence, CollectError> {
        let read = |name: &str| {
            let p = entry.join(name);
            std::fs::read(&p).map_err(|e| io(&p, e))
        };
        let generation_before = read("generation")?;
        let inblob = entry.join("inblob");
        std::fs::write(&inblob, report_data).map_err(|e| io(&inblob, e))?;
        let provider = String::from_utf8_lossy(&read("provider")?)
            .trim()
            .to_owned();
        let outblob = read("outblob")?;
        let auxblob = match provider.as_str() {
            "sev_guest" => read("auxblob").ok(),
            _ => None,
        };
        let generation_after = read("generation")?;
        let expected = parse_generation(&generation_before)?.wrapping_add(1);
        if parse_generation(&generation_after)? != expected {
            return Err(CollectError::Platform(
                "configfs-tsm entry was written concurrently (generation changed unexpectedly)"
                    .into(),
            ));
        }
        match provider.as_str() {
            "sev_guest" => {
                let certs = match auxblob {
                    Some(table) => snp_certs::parse(&table)
                        .map_err(|e| CollectError::Platform(format!("auxblob: {e}")))?
                        .into_iter()
                        .filter_map(|entry| {
                            entry.kind.map(|kind| SnpCert {
                                kind,
                                der: Base64Bytes(entry.data),
                            })
                        })
                        .collect(),
                    None => Vec::new(),
                };
                Ok(PlatformEvidence::SevSnp(SnpEvidence {
                    report: Base64Bytes(outblob),
                    certs,
                    hcl_report: None,
                }))
            }
            "tdx_guest" => Ok(PlatformEvidence::Tdx(TdxEvidence {
                quote: Base64Bytes(outblob),
            })),
            other => Err(CollectError::Platform(format!(
                "configfs-tsm provider {other:?} is not supported"
            ))),
        }
    }
}

fn parse_generation(bytes: &[u8]) -> Result<u64, CollectError> {
    String::from_utf8_lossy(bytes).trim().parse().map_err(|e| {
        CollectError::Platform(format!("configfs-tsm generation is not a number: {e}"))
    })
}

impl EvidenceSource for ConfigFsTsm {
    fn collect(&self, report_data: &[u8; 64]) -> Result<PlatformEvidence, CollectError> {
        let name = format!(
            "inferno-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let entry = self.root.join(name);
        std::fs::create_dir(&entry).map_err(|e| io(&entry, e))?;
        let result = Self::request_in(&entry, report_data);
        if let Err(e) = std::fs::remove_dir(&entry) {
            tracing::warn!(entry = %entry.display(), error = %e, "cannot remove configfs-tsm entry");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_entry(provider: &str, gen_before: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("generation"), gen_before).unwrap();
        std::fs::write(dir.path().join("provider"), provider).unwrap();
        std::fs::write(dir.path().join("outblob"), [5u8; 32]).unwrap();
        std::fs::write(
            dir.path().join("auxblob"),
            snp_certs::serialise(&[(snp_certs::GUID_VCEK, b"vcek-der")]),
        )
        .unwrap();
        dir
    }

    #[test]
    fn a_plain_directory_never_advances_generation_so_requests_are_refused() {
        // configfs bumps `generation` on each inblob write; a plain directory does not, which
        // is exactly what a concurrent writer looks like.
        let dir = fake_entry("sev_guest\n", "1\n");
        let err = ConfigFsTsm::request_in(dir.path(), &[1; 64]).unwrap_err();
        assert!(err.to_string().contains("concurrently"), "{err}");
        assert_eq!(std::fs::read(dir.path().join("inblob")).unwrap(), [1u8; 64]);
    }

    #[test]
    fn collect_fails_cleanly_without_configfs() {
        let tsm = ConfigFsTsm::at("/nonexistent/tsm/report");
        assert!(!tsm.available());
        assert!(matches!(
            tsm.collect(&[0; 64]),
            Err(CollectError::Io { .. })
        ));
    }
}
