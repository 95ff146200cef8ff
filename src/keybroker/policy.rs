//! The key broker's release policy (`inferno keybroker --policy FILE`): which attestation
//! policy evidence must pass, and for each model id which key ids it may have, under which
//! launch measurements and which server policies.
//!
//! ```toml
//! appraisal = "development"        # or "production", or a policy file (relative to this file)
//! # collateral = "bundle.json"     # offline collateral for hardware evidence
//!
//! [[model]]
//! id = "inferno-tiny"
//! key_ids = ["0123...ef"]          # 16-byte key ids (hex)
//! measurements = ["ab...cd"]       # SEV-SNP MEASUREMENT or TDX MRTD (hex)
//! server_policies = ["12...34"]    # SHA-256 of the server policies allowed (hex)
//! model_digests = ["56...78"]      # optional: model digests the appliance must attest
//! ```
//!
//! `"production"` is the embedded production policy with the image's reference values
//! (`policy/reference-values.toml`, embedded too). Whatever the appraisal policy, a GPU section
//! is not required of the evidence: the appliance asks for the key with its CPU TEE's evidence
//! before it opens its GPU.
//!
//! `key_ids`, `measurements` and `server_policies` must be non-empty: a rule that names no
//! measurement or no server policy would release to anything, so it is refused when the policy
//! is read. `model_digests`, when present, must be non-empty too.

use std::path::{Path, PathBuf};

use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::AppraisalReport;
use serde::Deserialize;

/// The reference values the embedded production policy names (`policy/reference-values.toml`).
const PRODUCTION_REFERENCE_VALUES: &[u8] = include_bytes!("../../policy/reference-values.toml");

/// The release policy file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("key broker policy {}: {reason}", path.display())]
pub struct PolicyFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    appraisal: String,
    #[serde(default)]
    collateral: Option<PathBuf>,
    #[serde(default)]
    model: Vec<ModelRule>,
}

/// What one model id may be released, and to whom.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRule {
    /// The model id (the sealed manifest's `release.model_id`).
    pub id: String,
    /// The key ids this model may have.
    pub key_ids: Vec<String>,
    /// The launch measurements (SEV-SNP MEASUREMENT, TDX MRTD) allowed, hex.
    pub measurements: Vec<String>,
    /// The server policy digests (runtime data `policy_sha256`) allowed, hex.
    pub server_policies: Vec<String>,
    /// When set, the model digests (runtime data `model_digest`, the digest the sealed manifest
    /// promises) the appliance must attest, hex.
    #[serde(default)]
    pub model_digests: Option<Vec<String>>,
}

/// A loaded release policy.
#[derive(Debug)]
pub struct ReleasePolicy {
    /// The attestation policy evidence must pass.
    pub appraisal: LoadedPolicy,
    /// Offline collateral for hardware evidence.
    pub collateral: Option<CollateralBundle>,
    /// The per-model rules.
    pub models: Vec<ModelRule>,
    /// SHA-256 of the release policy file's bytes, hex.
    pub digest: String,
}

impl ReleasePolicy {
    /// Reads and checks a release policy file.
    pub fn from_file(path: &Path) -> Result<Self, PolicyFileError> {
        let bad = |reason: String| PolicyFileError {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = crate::model::files::read_regular(path).map_err(|e| bad(e.to_string()))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| bad(e.to_string()))?;
        let file: PolicyFile = toml::from_str(text).map_err(|e| bad(one_line(&e.to_string())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut appraisal = match file.appraisal.as_str() {
            "development" => LoadedPolicy::from_bytes(crate::attest::DEVELOPMENT_POLICY),
            // The embedded production policy names the image's reference values, embedded too.
            "production" => LoadedPolicy::with_reference_values(
                crate::attest::PRODUCTION_POLICY,
                PRODUCTION_REFERENCE_VALUES,
            ),
            other => LoadedPolicy::from_file(&base.join(other)),
        }
        .map_err(|e| bad(format!("appraisal policy {:?}: {e}", file.appraisal)))?;
        // The appliance asks for the key with its CPU TEE's evidence, before its GPU is opened:
        // a GPU section is appraised when present, never required (the appliance attests its
        // GPU itself, under its own policy, before it serves).
        appraisal.policy.gpu.required = false;
        let collateral = file
            .collateral
            .map(|c| CollateralBundle::from_file(&base.join(c)))
            .transpose()
            .map_err(|e| bad(format!("collateral: {e}")))?;
        for rule in &file.model {
            rule.check()
                .map_err(|e| bad(format!("model {:?}: {e}", rule.id)))?;
        }
        let mut ids: Vec<&str> = file.model.iter().map(|m| m.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("model {:?} has two rules", w[0])));
        }
        Ok(Self {
            appraisal,
            collateral,
            models: file.model,
            digest: hex::encode(ring::digest::digest(&ring::digest::SHA256, &bytes)),
        })
    }

    /// The rule of `model_id`.
    pub fn rule(&self, model_id: &str) -> Option<&ModelRule> {
        self.models.iter().find(|m| m.id == model_id)
    }
}

impl ModelRule {
    fn check(&self) -> Result<(), String> {
        if self.id.is_empty() {
            return Err("empty id".into());
        }
        let digests = self.model_digests.as_ref();
        for (name, list, len) in [
            ("key_ids", Some(&self.key_ids), Some(32)),
            ("measurements", Some(&self.measurements), None),
            ("server_policies", Some(&self.server_policies), Some(64)),
            ("model_digests", digests, Some(64)),
        ] {
            let Some(list) = list else { continue };
            if list.is_empty() {
                return Err(format!("{name} is empty: it would release to anything"));
            }
            for value in list {
                let ok = value
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    && !value.is_empty()
                    && value.len() % 2 == 0
                    && len.is_none_or(|l| value.len() == l);
                if !ok {
                    return Err(format!(
                        "{name}: {value:?} is not lowercase hex of the right length"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether evidence appraised as `report` (which passed the attestation policy) may have
    /// `key_id`: `Ok` with what allowed it, or `Err` with the one-line reason of the refusal.
    pub fn allows(&self, key_id: &str, report: &AppraisalReport) -> Result<String, String> {
        if !self.key_ids.iter().any(|k| k == key_id) {
            return Err(format!(
                "key id {key_id} is not among the keys of model {:?}",
                self.id
            ));
        }
        let measurement =
            launch_measurement(report).ok_or("the evidence carries no launch measurement")?;
        if !self.measurements.contains(&measurement) {
            return Err(format!(
                "launch measurement {measurement} is not allowed for model {:?}",
                self.id
            ));
        }
        let doc = report
            .claims
            .runtime_data
            .as_ref()
            .ok_or("the evidence binds no runtime data")?;
        if !self.server_policies.contains(&doc.policy_sha256) {
            return Err(format!(
                "server policy {} is not allowed for model {:?}",
                doc.policy_sha256, self.id
            ));
        }
        if let Some(allowed) = &self.model_digests {
            match &doc.model_digest {
                Some(digest) if allowed.contains(digest) => {}
                Some(digest) => {
                    return Err(format!(
                        "model digest {digest} is not allowed for model {:?}",
                        self.id
                    ));
                }
                None => return Err("the evidence binds no model digest".into()),
            }
        }
        Ok(format!(
            "model {:?}, measurement {measurement}, server policy {}",
            self.id, doc.policy_sha256
        ))
    }
}

/// The launch measurement the appraisal verified: SEV-SNP MEASUREMENT or TDX MRTD, hex.
pub fn launch_measurement(report: &AppraisalReport) -> Option<String> {
    report
        .claims
        .sev_snp
        .as_ref()
        .map(|c| c.measurement.clone())
        .or_else(|| report.claims.tdx.as_ref().map(|c| c.mrtd.clone()))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("release.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn rules_that_would_release_to_anything_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = "ab".repeat(16);
        let policy = "cd".repeat(32);
        let good = format!(
            "appraisal = \"development\"\n[[model]]\nid = \"m\"\nkey_ids = [\"{key}\"]\nmeasurements = [\"00ff\"]\nserver_policies = [\"{policy}\"]\n"
        );
        let loaded = ReleasePolicy::from_file(&write(dir.path(), &good)).unwrap();
        assert_eq!(loaded.rule("m").unwrap().key_ids, vec![key.clone()]);
        assert!(loaded.rule("other").is_none());

        let empty = good.replace("measurements = [\"00ff\"]", "measurements = []");
        let err = ReleasePolicy::from_file(&write(dir.path(), &empty)).unwrap_err();
        assert!(err.to_string().contains("measurements is empty"), "{err}");

        let short = good.replace(&key, "abcd");
        let err = ReleasePolicy::from_file(&write(dir.path(), &short)).unwrap_err();
        assert!(err.to_string().contains("key_ids"), "{err}");

        let twice = format!("{good}{}", &good["appraisal = \"development\"\n".len()..]);
        let err = ReleasePolicy::from_file(&write(dir.path(), &twice)).unwrap_err();
        assert!(err.to_string().contains("two rules"), "{err}");

        let no_digest = format!("{good}model_digests = []\n");
        let err = ReleasePolicy::from_file(&write(dir.path(), &no_digest)).unwrap_err();
        assert!(err.to_string().contains("model_digests is empty"), "{err}");
        let digest = format!("{good}model_digests = [\"{policy}\"]\n");
        let loaded = ReleasePolicy::from_file(&write(dir.path(), &digest)).unwrap();
        assert_eq!(
            loaded.rule("m").unwrap().model_digests,
            Some(vec![policy.clone()])
        );

        let unknown = good.replace("id = \"m\"", "id = \"m\"\nanything = true");
        assert!(ReleasePolicy::from_file(&write(dir.path(), &unknown)).is_err());
    }
}
