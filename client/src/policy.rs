//! The client policy: what a client requires of a server before it sends a prompt. A TOML file
//! (`docs/client.md` documents it); unknown keys are errors, so a misspelt requirement never
//! silently weakens it.

use std::collections::BTreeMap;

use inferno_attestation::policy::{
    AuditContent, AuditPolicy, AuthPolicy, GpuPolicy, LoadedPolicy, MinTcb, POLICY_SCHEMA_VERSION,
    Platform, Policy, PolicyError, ReferenceValuesUse, RuntimeDataPolicy, SimulatedPolicy,
    SnpPolicy, TdxPolicy, TimePolicy, TpmPolicy,
};
use inferno_attestation::reference_values::ReferenceValues;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The only client-policy schema version this crate accepts.
pub const CLIENT_POLICY_SCHEMA_VERSION: u32 = 1;

/// Errors when loading a client policy.
#[derive(Debug, thiserror::Error)]
pub enum ClientPolicyError {
    /// The file could not be read.
    #[error("cannot read client policy {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The bytes are not TOML of the client-policy schema.
    #[error("client policy is not valid TOML of schema {CLIENT_POLICY_SCHEMA_VERSION}: {0}")]
    Toml(#[from] toml::de::Error),
    /// A value is well-formed TOML but invalid.
    #[error("client policy field `{field}`: {reason}")]
    Field {
        /// The offending field.
        field: String,
        /// Why it is invalid.
        reason: String,
    },
}

/// A client policy, schema version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientPolicy {
    /// The schema version; must be [`CLIENT_POLICY_SCHEMA_VERSION`].
    pub schema: u32,
    /// A human-readable name, shown in every appraisal.
    pub name: String,
    /// Whether evidence of the simulated TEE (test keys, no hardware protection) is accepted.
    /// Only then may `[simulated]` name roots.
    pub accept_simulated: bool,
    /// Which CPU TEEs are accepted.
    pub platforms: Vec<Platform>,
    /// Accepted server policies: SHA-256 of the server's policy file (hex). Absent: any.
    #[serde(default)]
    pub server_policy_sha256: Option<Vec<String>>,
    /// Accepted models: the model digest `inferno serve` prints (hex). Absent: any.
    #[serde(default)]
    pub model_digests: Option<Vec<String>>,
    /// Reference launch measurements: the SEV-SNP MEASUREMENT or the TDX MRTD (hex, 48 bytes).
    /// Absent: any.
    #[serde(default)]
    pub measurements: Option<Vec<String>>,
    /// A reference-values file (`policy/reference-values.toml`, relative to this policy's
    /// directory) whose SEV-SNP measurements, TDX registers and vTPM PCR values the evidence
    /// appraisal then requires (`inferno_attestation::reference_values`). Absent: none.
    #[serde(default)]
    pub reference_values: Option<String>,
    /// Minimum SEV-SNP reported TCB, per processor product (`Milan`, `Genoa`, `Turin`).
    #[serde(default)]
    pub min_tcb: BTreeMap<String, MinTcb>,
    /// Time rules for certificates and collateral.
    pub time: TimePolicy,
    /// Simulated roots to trust (only with `accept_simulated = true`).
    #[serde(default)]
    pub simulated: SimulatedPolicy,
    /// GPU requirements (`required`: the evidence must carry a verified GPU).
    pub gpu: GpuPolicy,
    /// SEV-SNP appraisal rules (measurements and minimum TCB are set at the top level).
    #[serde(default)]
    pub sev_snp: Option<SnpPolicy>,
    /// TDX appraisal rules (the MRTD is set in `measurements`).
    #[serde(default)]
    pub tdx: Option<TdxPolicy>,
    /// vTPM requirements; absent means verified when present, not required.
    #[serde(default)]
    pub tpm: Option<TpmPolicy>,
}

/// A client policy with the digest of the bytes it was parsed from, and the attestation-crate
/// policy that appraises evidence for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedClientPolicy {
    /// The parsed policy.
    pub policy: ClientPolicy,
    /// SHA-256 of the exact file bytes.
    pub digest: [u8; 32],
    /// The platform rules as the attestation crate's appraisal takes them.
    pub appraisal: LoadedPolicy,
}

impl LoadedClientPolicy {
    /// Parses and validates client-policy bytes. A policy that names a reference-values file is
    /// refused here (the file could not be found): load it with [`LoadedClientPolicy::from_file`]
    /// or [`LoadedClientPolicy::with_reference_values`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ClientPolicyError> {
        let loaded = Self::parse(bytes)?;
        if let Some(file) = &loaded.policy.reference_values {
            return Err(field(
                "reference_values",
                &format!(
                    "the policy names the file {file:?}, which a policy read from bytes cannot find: load the policy from its file"
                ),
            ));
        }
        Ok(loaded)
    }

    /// Parses client-policy bytes that name a reference-values file, applying
    /// `reference_values` (that file's bytes) to the evidence appraisal.
    pub fn with_reference_values(
        policy: &[u8],
        reference_values: &[u8],
    ) -> Result<Self, ClientPolicyError> {
        let mut loaded = Self::parse(policy)?;
        let Some(file) = loaded.policy.reference_values.clone() else {
            return Err(field(
                "reference_values",
                "reference values were given but the policy names no reference-values file",
            ));
        };
        if loaded.policy.measurements.is_some() {
            return Err(field(
                "measurements",
                "is set both inline and by the reference-values file; keep one",
            ));
        }
        let reason = |e: PolicyError| field("reference_values", &e.to_string());
        let values = ReferenceValues::from_bytes(reference_values).map_err(reason)?;
        let fields = values
            .apply_to(&mut loaded.appraisal.policy)
            .map_err(reason)?;
        loaded.appraisal.policy.validate().map_err(reason)?;
        loaded.appraisal.reference_values = ReferenceValuesUse::Applied {
            file,
            image: values.image,
            sha256: Sha256::digest(reference_values).into(),
            fields,
        };
        Ok(loaded)
    }

    fn parse(bytes: &[u8]) -> Result<Self, ClientPolicyError> {
        let text = std::str::from_utf8(bytes).map_err(|e| field("(file)", &e.to_string()))?;
        let policy: ClientPolicy = toml::from_str(text)?;
        policy.validate()?;
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let appraisal = LoadedPolicy {
            policy: policy.appraisal_policy(),
            digest,
            reference_values: ReferenceValuesUse::None,
        };
        appraisal
            .policy
            .validate()
            .map_err(|e| field("(platform rules)", &e.to_string()))?;
        Ok(Self {
            policy,
            digest,
            appraisal,
        })
    }

    /// Reads, parses and validates a client-policy file; the reference-values file it names
    /// (relative to the policy's directory) is read and applied, and a missing one is an error.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ClientPolicyError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| ClientPolicyError::Io {
                path: path.display().to_string(),
                source,
            })
        };
        let bytes = read(path)?;
        match Self::parse(&bytes)?.policy.reference_values {
            None => Self::from_bytes(&bytes),
            Some(file) => {
                let dir = path.parent().unwrap_or(std::path::Path::new("."));
                Self::with_reference_values(&bytes, &read(&dir.join(file))?)
            }
        }
    }
}

impl ClientPolicy {
    /// Checks the schema, the shape of every reference value and cross-field rules.
    pub fn validate(&self) -> Result<(), ClientPolicyError> {
        if self.schema != CLIENT_POLICY_SCHEMA_VERSION {
            return Err(field(
                "schema",
                &format!(
                    "{} is not supported (expected {CLIENT_POLICY_SCHEMA_VERSION})",
                    self.schema
                ),
            ));
        }
        if self.platforms.is_empty() {
            return Err(field("platforms", "must list at least one platform"));
        }
        let simulated_roots =
            self.simulated.trusted_ark_sha256.len() + self.simulated.trusted_gpu_root_sha256.len();
        if !self.accept_simulated && simulated_roots > 0 {
            return Err(field(
                "simulated",
                "names simulated roots but accept_simulated is false",
            ));
        }
        for (name, list, len) in [
            ("server_policy_sha256", &self.server_policy_sha256, 32),
            ("model_digests", &self.model_digests, 32),
            ("measurements", &self.measurements, 48),
        ] {
            for value in list.iter().flatten() {
                check_hex(name, value, len)?;
            }
        }
        if let Some(snp) = &self.sev_snp
            && (snp.measurements.is_some() || !snp.min_tcb.is_empty())
        {
            return Err(field(
                "sev_snp",
                "set measurements and min_tcb at the top level of a client policy",
            ));
        }
        if let Some(tdx) = &self.tdx
            && tdx.mrtd.is_some()
        {
            return Err(field(
                "tdx.mrtd",
                "set the MRTD in the top-level measurements of a client policy",
            ));
        }
        Ok(())
    }

    /// The attestation-crate policy that appraises evidence for this client policy: its platform
    /// rules, with runtime data required. The server-only tables (audit, auth) do not apply to
    /// a client and are filled with neutral values.
    fn appraisal_policy(&self) -> Policy {
        Policy {
            schema: POLICY_SCHEMA_VERSION,
            name: self.name.clone(),
            platforms: self.platforms.clone(),
            time: self.time.clone(),
            simulated: self.simulated.clone(),
            runtime_data: RuntimeDataPolicy { required: true },
            sev_snp: self.sev_snp.clone(),
            tdx: self.tdx.clone(),
            tpm: self.tpm.clone(),
            gpu: self.gpu.clone(),
            audit: AuditPolicy {
                content: AuditContent::None,
                content_in_logs: false,
            },
            auth: AuthPolicy {
                require_api_key: false,
            },
            reference_values: None,
        }
    }
}

fn field(name: &str, reason: &str) -> ClientPolicyError {
    ClientPolicyError::Field {
        field: name.into(),
        reason: reason.into(),
    }
}

fn check_hex(name: &str, value: &str, len: usize) -> Result<(), ClientPolicyError> {
    if value.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(field(name, &format!("{value:?}: hex must be lowercase")));
    }
    match hex::decode(value) {
        Ok(bytes) if bytes.len() == len => Ok(()),
        Ok(bytes) => Err(field(
            name,
            &format!("{value:?} is {} bytes, expected {len}", bytes.len()),
        )),
        Err(e) => Err(field(name, &format!("{value:?} is not hex: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_text(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../policy")
            .join(name);
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn shipped_client_policies_parse() {
        let dev = LoadedClientPolicy::from_bytes(policy_text("client-development.toml").as_bytes())
            .unwrap();
        assert!(dev.policy.accept_simulated);
        assert!(!dev.appraisal.policy.simulated.trusted_ark_sha256.is_empty());
        assert!(dev.appraisal.policy.runtime_data.required);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../policy/client-production.toml");
        let prod = LoadedClientPolicy::from_file(&path).unwrap();
        assert!(!prod.policy.accept_simulated);
        assert!(prod.policy.gpu.required);
        assert!(prod.policy.simulated.trusted_ark_sha256.is_empty());
        // The release's reference values apply to the evidence appraisal.
        assert!(matches!(
            prod.appraisal.reference_values,
            ReferenceValuesUse::Applied { .. }
        ));
        let tpm = prod.appraisal.policy.tpm.as_ref().unwrap();
        assert_eq!(tpm.pcr_values["11"].len(), 1);
        let snp = prod.appraisal.policy.sev_snp.as_ref().unwrap();
        assert!(snp.measurements.is_some());
        // Read from bytes, the file named cannot be found: refused.
        let err = LoadedClientPolicy::from_bytes(policy_text("client-production.toml").as_bytes())
            .unwrap_err();
        assert!(err.to_string().contains("reference_values"), "{err}");
    }

    #[test]
    fn reference_values_conflicting_with_inline_measurements_are_rejected() {
        let text = policy_text("client-development.toml").replacen(
            "schema = 1",
            "schema = 1\nreference_values = \"rv.toml\"",
            1,
        );
        let values = format!(
            "schema = 1\nimage = \"inferno\"\n[sev_snp]\nmeasurements = [{{ product = \"Milan\", vcpus = 4, measurement = \"{}\" }}]\n",
            "ab".repeat(48)
        );
        let loaded =
            LoadedClientPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap();
        let snp = loaded.appraisal.policy.sev_snp.as_ref().unwrap();
        assert_eq!(snp.measurements, Some(vec!["ab".repeat(48)]));
        let inline = text.replacen(
            "schema = 1",
            &format!("schema = 1\nmeasurements = [\"{}\"]", "cd".repeat(48)),
            1,
        );
        let err = LoadedClientPolicy::with_reference_values(inline.as_bytes(), values.as_bytes())
            .unwrap_err();
        assert!(err.to_string().contains("both inline"), "{err}");
        let bad = values.replace("Milan", "Naples");
        assert!(
            LoadedClientPolicy::with_reference_values(text.as_bytes(), bad.as_bytes()).is_err()
        );
    }

    #[test]
    fn unknown_keys_bad_values_and_simulated_roots_without_consent_are_rejected() {
        let dev = policy_text("client-development.toml");
        let typo = dev.replace("accept_simulated", "accept_simulatd");
        assert!(LoadedClientPolicy::from_bytes(typo.as_bytes()).is_err());
        let refuse = dev.replace("accept_simulated = true", "accept_simulated = false");
        let err = LoadedClientPolicy::from_bytes(refuse.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("accept_simulated"), "{err}");
        let short = format!("{dev}\nmodel_digests_extra = 1\n");
        assert!(LoadedClientPolicy::from_bytes(short.as_bytes()).is_err());
        let bad_digest = dev.replacen("schema = 1", "schema = 1\nmodel_digests = [\"abcd\"]", 1);
        let err = LoadedClientPolicy::from_bytes(bad_digest.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("model_digests"), "{err}");
    }
}
