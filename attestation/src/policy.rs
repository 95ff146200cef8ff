//! The server policy: a TOML file that decides how evidence is appraised, what the audit log
//! records and what clients must present. Its digest is the SHA-256 of the exact file bytes.
//!
//! `docs/policy.md` documents the schema. Unknown keys are errors, so that a misspelt setting
//! never silently weakens a policy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::reference_values::ReferenceValues;

/// The only policy schema version this crate accepts.
pub const POLICY_SCHEMA_VERSION: u32 = 2;

/// Errors when loading a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The bytes are not UTF-8 TOML of the policy schema.
    #[error("policy is not valid TOML of schema {POLICY_SCHEMA_VERSION}: {0}")]
    Toml(#[from] toml::de::Error),
    /// The policy is of another schema version.
    #[error("policy schema {found} is not supported (expected {POLICY_SCHEMA_VERSION})")]
    Schema {
        /// The version found.
        found: u32,
    },
    /// A value is well-formed TOML but invalid.
    #[error("policy field `{field}`: {reason}")]
    Field {
        /// The offending field.
        field: String,
        /// Why it is invalid.
        reason: String,
    },
}

/// A CPU TEE platform that a policy may accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Platform {
    /// AMD SEV-SNP.
    SevSnp,
    /// Intel TDX.
    Tdx,
}

/// The server policy, schema version 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The schema version; must be [`POLICY_SCHEMA_VERSION`].
    pub schema: u32,
    /// A human-readable name, shown in every appraisal.
    pub name: String,
    /// Which CPU TEEs are accepted.
    pub platforms: Vec<Platform>,
    /// Time rules for certificates and collateral.
    pub time: TimePolicy,
    /// Roots trusted besides the vendors' built-in ones (the simulated TEE's).
    #[serde(default)]
    pub simulated: SimulatedPolicy,
    /// Requirements on the runtime-data binding.
    pub runtime_data: RuntimeDataPolicy,
    /// SEV-SNP requirements; required when `platforms` lists `sev-snp`.
    #[serde(default)]
    pub sev_snp: Option<SnpPolicy>,
    /// TDX requirements; required when `platforms` lists `tdx`.
    #[serde(default)]
    pub tdx: Option<TdxPolicy>,
    /// vTPM requirements; absent means a vTPM is not required (but verified when present).
    #[serde(default)]
    pub tpm: Option<TpmPolicy>,
    /// GPU requirements.
    pub gpu: GpuPolicy,
    /// What the audit log records (read by the server).
    pub audit: AuditPolicy,
    /// What clients must present (read by the server).
    pub auth: AuthPolicy,
    /// A reference-values file (`policy/reference-values.toml`), relative to this policy's
    /// directory, whose measurements every verifier applies (see [`crate::reference_values`]).
    #[serde(default)]
    pub reference_values: Option<String>,
}

/// Time rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimePolicy {
    /// How long past a CRL's or TCB-info's next-update the collateral is still accepted.
    pub collateral_grace_seconds: u64,
    /// Whether evidence appraised without proof of freshness (the caller waived it,
    /// `--no-freshness`: quotes taken without a nonce, start-up evidence re-read from an old
    /// audit log) may pass, for offline audit. Absent: false, so such an appraisal is rejected
    /// as NOT FRESH.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unfresh_evidence: bool,
}

/// Which simulated roots are trusted. Empty in production.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedPolicy {
    /// SHA-256 fingerprints (hex of the DER certificate) of simulated ARKs to trust.
    #[serde(default)]
    pub trusted_ark_sha256: Vec<String>,
    /// SHA-256 fingerprints (hex of the DER certificate) of simulated GPU roots to trust.
    #[serde(default)]
    pub trusted_gpu_root_sha256: Vec<String>,
}

/// Requirements on the runtime-data document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeDataPolicy {
    /// Evidence must carry a runtime-data document whose SHA-512 equals REPORT_DATA.
    pub required: bool,
}

/// A minimum TCB; each component compares independently.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinTcb {
    /// Minimum PSP bootloader SVN.
    pub bootloader: u8,
    /// Minimum PSP OS (TEE) SVN.
    pub tee: u8,
    /// Minimum SNP firmware SVN.
    pub snp: u8,
    /// Minimum microcode patch level.
    pub microcode: u8,
    /// Minimum FMC SVN (Turin and later; ignored on Milan and Genoa).
    #[serde(default)]
    pub fmc: u8,
}

/// SEV-SNP requirements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpPolicy {
    /// Accepted processor products (`Milan`, `Genoa`, `Turin`).
    pub products: Vec<String>,
    /// Lowest accepted report version (2 to 5).
    pub min_report_version: u32,
    /// Accept a guest whose policy allows debugging. Never true in production.
    pub allow_debug: bool,
    /// Accept a guest whose policy allows SMT on the host.
    pub allow_smt: bool,
    /// Accept a guest whose policy allows a migration agent.
    pub allow_migration_agent: bool,
    /// Accepted VMPLs of the requesting guest code.
    pub vmpls: Vec<u32>,
    /// Minimum REPORTED_TCB, per product name.
    #[serde(default)]
    pub min_tcb: std::collections::BTreeMap<String, MinTcb>,
    /// Accepted launch measurements (hex, 48 bytes). Absent: any.
    #[serde(default)]
    pub measurements: Option<Vec<String>>,
    /// Accepted HOST_DATA values (hex, 32 bytes). Absent: any.
    #[serde(default)]
    pub host_data: Option<Vec<String>>,
    /// Require an AMD CRL in the collateral, signed by the ARK and current.
    #[serde(default)]
    pub require_crl: bool,
    /// The accepted launch measurements are of measured direct boot (QEMU `kernel-hashes=on`:
    /// the kernel, initrd and command line are hashed into the launch measurement). A vTPM's
    /// PCR 11 may then be all zeros, since direct boot runs no systemd-stub, but only when the
    /// report's measurement is one of the listed values (`measurements` or the reference
    /// values). TDX has no such rule: its MRTD does not pin the kernel. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured_direct_boot: bool,
}

/// TDX requirements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TdxPolicy {
    /// Accepted TCB statuses (e.g. `UpToDate`, `SWHardeningNeeded`).
    pub allowed_tcb_status: Vec<String>,
    /// Security advisories tolerated (e.g. `INTEL-SA-00837`); any other is a rejection.
    #[serde(default)]
    pub allowed_advisories: Vec<String>,
    /// Accept a TD with the DEBUG attribute. Never true in production.
    pub allow_debug: bool,
    /// Accepted MRTD values (hex, 48 bytes). Absent: any.
    #[serde(default)]
    pub mrtd: Option<Vec<String>>,
    /// Accepted RTMR0 values. Absent: any.
    #[serde(default)]
    pub rtmr0: Option<Vec<String>>,
    /// Accepted RTMR1 values. Absent: any.
    #[serde(default)]
    pub rtmr1: Option<Vec<String>>,
    /// Accepted RTMR2 values. Absent: any.
    #[serde(default)]
    pub rtmr2: Option<Vec<String>>,
    /// Accepted RTMR3 values. Absent: any.
    #[serde(default)]
    pub rtmr3: Option<Vec<String>>,
    /// Accepted MRCONFIGID values. Absent: any.
    #[serde(default)]
    pub mr_config_id: Option<Vec<String>>,
}

/// vTPM requirements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmPolicy {
    /// Evidence must include a verified vTPM section whose AK is bound by the runtime data.
    pub required: bool,
    /// The PCRs (0–23, SHA-256 bank) the server quotes and every vTPM quote must cover.
    /// Default: 0–7, the firmware and boot-loader measurements.
    #[serde(default = "default_tpm_pcrs")]
    pub pcrs: Vec<u8>,
    /// Accepted values of SHA-256-bank PCRs: PCR index (a TOML key, "11") to a list of hex
    /// values (32 bytes). Each PCR listed must be among `pcrs`. Empty: any values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pcr_values: BTreeMap<String, Vec<String>>,
    /// Attestation keys trusted by their public key: SHA-256 (hex) of each AK's DER
    /// SubjectPublicKeyInfo. Standalone vTPM evidence (no CPU evidence) whose AK is listed needs
    /// no AK certificate chain to a `--tpm-root`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ak_public_keys: Vec<String>,
}

/// The default `[tpm] pcrs`: 0–7, firmware code and configuration, option ROMs, boot loader and
/// its configuration.
pub const DEFAULT_TPM_PCRS: [u8; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

fn default_tpm_pcrs() -> Vec<u8> {
    DEFAULT_TPM_PCRS.to_vec()
}

impl TpmPolicy {
    fn validate(&self) -> Result<(), PolicyError> {
        if self.pcrs.is_empty() {
            return Err(field("tpm.pcrs", "must list at least one PCR"));
        }
        if let Some(bad) = self.pcrs.iter().find(|p| **p > 23) {
            return Err(field(
                "tpm.pcrs",
                &format!("PCR {bad} is out of range (0 to 23)"),
            ));
        }
        let mut sorted = self.pcrs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.pcrs.len() {
            return Err(field("tpm.pcrs", "lists a PCR twice"));
        }
        for key in &self.ak_public_keys {
            check_hex("tpm.ak_public_keys", key, 32)?;
        }
        for (key, values) in &self.pcr_values {
            let name = format!("tpm.pcr_values.{key}");
            let pcr = crate::reference_values::parse_pcr(&name, key)?;
            if !self.pcrs.contains(&pcr) {
                return Err(field(&name, &format!("PCR {pcr} is not among [tpm] pcrs")));
            }
            for value in values {
                check_hex(&name, value, 32)?;
            }
        }
        Ok(())
    }
}

/// GPU requirements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPolicy {
    /// Evidence must include a verified GPU section.
    pub required: bool,
    /// The GPU must be in confidential-computing mode.
    pub require_cc_mode: bool,
    /// The GPU must report the CC ready state.
    pub require_ready_state: bool,
    /// Driver and VBIOS RIMs must be in the collateral and every golden measurement match.
    #[serde(default)]
    pub require_reference_values: bool,
    /// Every certificate of the GPU device chain (except the per-boot attestation leaf and the
    /// root) and of the RIM signing chains must have a good, fresh OCSP response in the
    /// collateral. Responses present are checked even when this is false.
    #[serde(default)]
    pub require_ocsp: bool,
    /// Accepted driver versions. Absent: any.
    #[serde(default)]
    pub driver_versions: Option<Vec<String>>,
    /// Accepted VBIOS versions. Absent: any.
    #[serde(default)]
    pub vbios_versions: Option<Vec<String>>,
}

/// What the audit log keeps of prompts and completions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditContent {
    /// Nothing: records carry metadata only.
    #[default]
    None,
    /// An HMAC-SHA256 of each text under a key the compliance team holds.
    Hmac,
    /// The full texts, encrypted (AES-256-GCM) under a key the compliance team holds.
    Encrypted,
}

impl AuditContent {
    /// The policy's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hmac => "hmac",
            Self::Encrypted => "encrypted",
        }
    }

    /// Whether the mode needs a content key.
    pub fn needs_key(self) -> bool {
        self != Self::None
    }
}

/// What the audit log records, and where prompts and completions may appear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditPolicy {
    /// What each request and completion record keeps of the texts.
    pub content: AuditContent,
    /// Whether prompts and completions may appear in the server's diagnostic (tracing) logs.
    /// Absent: false.
    #[serde(default)]
    pub content_in_logs: bool,
}

/// What clients must present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthPolicy {
    /// The server refuses to start without configured API keys; every API request must then
    /// carry a valid one. With false, a server without keys serves loopback only.
    pub require_api_key: bool,
}

/// A policy together with the digest of the bytes it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedPolicy {
    /// The parsed policy, with its reference values applied when they are in force.
    pub policy: Policy,
    /// SHA-256 of the exact file bytes.
    pub digest: [u8; 32],
    /// Whether the reference values the policy names are in force.
    pub reference_values: ReferenceValuesUse,
}

/// Whether the reference values a policy names (its `reference_values` key) are in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferenceValuesUse {
    /// The policy names no reference-values file.
    None,
    /// The file was read and its values are part of the policy.
    Applied {
        /// The file, as the policy names it.
        file: String,
        /// The image the values describe.
        image: String,
        /// SHA-256 of the file's exact bytes.
        sha256: [u8; 32],
        /// The policy fields the file set (`sev_snp.measurements`, `tpm.pcr_values.11`, ...).
        fields: BTreeSet<String>,
    },
    /// The file is deliberately not applied: the appliance appraising its own start-up
    /// evidence, which cannot contain the reference values of the image it is part of (they
    /// are computed from that image). Every verifier applies them.
    NotApplied {
        /// The file, as the policy names it.
        file: String,
    },
}

impl LoadedPolicy {
    /// Parses and validates policy bytes, computing their digest. A policy that names a
    /// reference-values file is refused here (the file could not be found): load it with
    /// [`LoadedPolicy::from_file`] or [`LoadedPolicy::with_reference_values`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PolicyError> {
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

    /// Reads, parses and validates a policy file; the reference-values file it names (relative
    /// to the policy's directory) is read and applied, and a missing or invalid one is an error.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let loaded = Self::parse(&read(path)?)?;
        match loaded.policy.reference_values.clone() {
            None => Ok(loaded),
            Some(file) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let bytes = read(&dir.join(&file))?;
                loaded.apply_reference_values(&bytes)
            }
        }
    }

    /// Parses policy bytes that name a reference-values file, applying `reference_values`
    /// (that file's bytes, e.g. embedded in a program).
    pub fn with_reference_values(
        policy: &[u8],
        reference_values: &[u8],
    ) -> Result<Self, PolicyError> {
        let loaded = Self::parse(policy)?;
        if loaded.policy.reference_values.is_none() {
            return Err(field(
                "reference_values",
                "reference values were given but the policy names no reference-values file",
            ));
        }
        loaded.apply_reference_values(reference_values)
    }

    /// Parses policy bytes for the appliance's appraisal of its own start-up evidence: the
    /// reference values the policy names are not applied ([`ReferenceValuesUse::NotApplied`]).
    pub fn for_self_appraisal(bytes: &[u8]) -> Result<Self, PolicyError> {
        let mut loaded = Self::parse(bytes)?;
        if let Some(file) = loaded.policy.reference_values.clone() {
            loaded.reference_values = ReferenceValuesUse::NotApplied { file };
        }
        Ok(loaded)
    }

    /// [`LoadedPolicy::for_self_appraisal`] of a file.
    pub fn from_file_for_self_appraisal(path: &Path) -> Result<Self, PolicyError> {
        Self::for_self_appraisal(&read(path)?)
    }

    fn parse(bytes: &[u8]) -> Result<Self, PolicyError> {
        let text = std::str::from_utf8(bytes).map_err(|e| PolicyError::Field {
            field: "(file)".into(),
            reason: format!("not UTF-8: {e}"),
        })?;
        let policy: Policy = toml::from_str(text)?;
        policy.validate()?;
        Ok(Self {
            policy,
            digest: Sha256::digest(bytes).into(),
            reference_values: ReferenceValuesUse::None,
        })
    }

    fn apply_reference_values(mut self, bytes: &[u8]) -> Result<Self, PolicyError> {
        let file = self.policy.reference_values.clone().unwrap_or_default();
        let values = ReferenceValues::from_bytes(bytes)?;
        let fields = values.apply_to(&mut self.policy)?;
        self.policy.validate()?;
        self.reference_values = ReferenceValuesUse::Applied {
            file,
            image: values.image,
            sha256: Sha256::digest(bytes).into(),
            fields,
        };
        Ok(self)
    }

    /// The digest as lowercase hex.
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest)
    }

    /// What an allow-list of policy field `name` (`sev_snp.measurements`, `tdx.rtmr1`,
    /// `tpm.pcr_values.11`) is called in appraisal messages.
    pub fn allow_list_name(&self, name: &str) -> String {
        match &self.reference_values {
            ReferenceValuesUse::Applied {
                file,
                image,
                fields,
                ..
            } if fields.contains(name) => {
                format!("the reference values of image {image:?} ({file})")
            }
            _ => "the policy's allow-list".to_owned(),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, PolicyError> {
    std::fs::read(path).map_err(|source| PolicyError::Io {
        path: path.display().to_string(),
        source,
    })
}

impl Policy {
    /// Checks cross-field rules and the shape of every reference value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.schema != POLICY_SCHEMA_VERSION {
            return Err(PolicyError::Schema { found: self.schema });
        }
        if self.platforms.is_empty() {
            return Err(field("platforms", "must list at least one platform"));
        }
        for fp in &self.simulated.trusted_ark_sha256 {
            check_hex("simulated.trusted_ark_sha256", fp, 32)?;
        }
        for fp in &self.simulated.trusted_gpu_root_sha256 {
            check_hex("simulated.trusted_gpu_root_sha256", fp, 32)?;
        }
        if self.platforms.contains(&Platform::SevSnp) {
            let snp = self
                .sev_snp
                .as_ref()
                .ok_or_else(|| field("sev_snp", "required when platforms lists sev-snp"))?;
            snp.validate()?;
        }
        if self.platforms.contains(&Platform::Tdx) {
            let tdx = self
                .tdx
                .as_ref()
                .ok_or_else(|| field("tdx", "required when platforms lists tdx"))?;
            tdx.validate()?;
        }
        if let Some(tpm) = &self.tpm {
            tpm.validate()?;
        }
        Ok(())
    }
}

impl SnpPolicy {
    fn validate(&self) -> Result<(), PolicyError> {
        const PRODUCTS: [&str; 3] = ["Milan", "Genoa", "Turin"];
        for product in self.products.iter().chain(self.min_tcb.keys()) {
            if !PRODUCTS.contains(&product.as_str()) {
                return Err(field(
                    "sev_snp.products",
                    &format!("unknown product {product:?} (known: Milan, Genoa, Turin)"),
                ));
            }
        }
        if !(2..=5).contains(&self.min_report_version) {
            return Err(field("sev_snp.min_report_version", "must be 2 to 5"));
        }
        if self.vmpls.iter().any(|v| *v > 3) {
            return Err(field("sev_snp.vmpls", "VMPLs are 0 to 3"));
        }
        for m in self.measurements.iter().flatten() {
            check_hex("sev_snp.measurements", m, 48)?;
        }
        for h in self.host_data.iter().flatten() {
            check_hex("sev_snp.host_data", h, 32)?;
        }
        Ok(())
    }
}

impl TdxPolicy {
    fn validate(&self) -> Result<(), PolicyError> {
        let lists = [
            ("tdx.mrtd", &self.mrtd),
            ("tdx.rtmr0", &self.rtmr0),
            ("tdx.rtmr1", &self.rtmr1),
            ("tdx.rtmr2", &self.rtmr2),
            ("tdx.rtmr3", &self.rtmr3),
            ("tdx.mr_config_id", &self.mr_config_id),
        ];
        for (name, list) in lists {
            for value in list.iter().flatten() {
                check_hex(name, value, 48)?;
            }
        }
        Ok(())
    }
}

pub(crate) fn field(name: &str, reason: &str) -> PolicyError {
    PolicyError::Field {
        field: name.into(),
        reason: reason.into(),
    }
}

pub(crate) fn check_hex(name: &str, value: &str, len: usize) -> Result<(), PolicyError> {
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

    fn policy_file(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../policy")
            .join(name)
    }

    #[test]
    fn shipped_policies_parse_and_digest_is_of_file_bytes() {
        for name in ["production.toml", "development.toml"] {
            let path = policy_file(name);
            let loaded = LoadedPolicy::from_file(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(loaded.digest, <[u8; 32]>::from(Sha256::digest(&bytes)));
        }
        let prod = LoadedPolicy::from_file(&policy_file("production.toml")).unwrap();
        assert!(matches!(
            prod.reference_values,
            ReferenceValuesUse::Applied { .. }
        ));
        assert!(prod.policy.simulated.trusted_ark_sha256.is_empty());
        assert!(!prod.policy.sev_snp.as_ref().unwrap().allow_debug);
        assert!(prod.policy.gpu.required && prod.policy.gpu.require_cc_mode);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let base = std::fs::read_to_string(policy_file("production.toml")).unwrap();
        let load = |text: &str| LoadedPolicy::for_self_appraisal(text.as_bytes());
        assert!(load(&base).is_ok());
        let typo = base.replace("allow_debug = false", "allow_debgu = false");
        assert!(load(&typo).is_err());
        let schema = base.replace("schema = 2", "schema = 9");
        assert!(matches!(
            load(&schema),
            Err(PolicyError::Schema { found: 9 })
        ));
        let product = base.replace("\"Milan\"", "\"Naples\"");
        assert!(matches!(load(&product), Err(PolicyError::Field { .. })));
        let pcrs = "pcrs = [0, 1, 2, 3, 4, 5, 6, 7, 11]";
        assert!(base.contains(pcrs));
        for (bad, reason) in [
            ("pcrs = []", "at least one"),
            ("pcrs = [0, 24]", "PCR 24"),
            ("pcrs = [7, 7]", "twice"),
        ] {
            let err = load(&base.replace(pcrs, bad)).unwrap_err();
            assert!(err.to_string().contains(reason), "{bad}: {err}");
        }
        let default = base.replace(pcrs, "");
        let loaded = load(&default).unwrap();
        let tpm = loaded.policy.tpm.unwrap();
        assert_eq!(tpm.pcrs, (0..=7).collect::<Vec<u8>>());
    }

    #[test]
    fn audit_content_modes_parse_and_unknown_modes_are_rejected() {
        let base = std::fs::read_to_string(policy_file("development.toml")).unwrap();
        assert!(base.contains("content = \"none\""));
        let prod = LoadedPolicy::from_file(&policy_file("production.toml")).unwrap();
        assert_eq!(prod.policy.audit.content, AuditContent::None);
        assert!(!prod.policy.audit.content_in_logs);
        assert!(prod.policy.auth.require_api_key);
        for (mode, expected) in [
            ("hmac", AuditContent::Hmac),
            ("encrypted", AuditContent::Encrypted),
        ] {
            let text = base.replace("content = \"none\"", &format!("content = \"{mode}\""));
            let loaded = LoadedPolicy::from_bytes(text.as_bytes()).unwrap();
            assert_eq!(loaded.policy.audit.content, expected);
            assert!(expected.needs_key());
        }
        let bad = base.replace("content = \"none\"", "content = \"plain\"");
        assert!(matches!(
            LoadedPolicy::from_bytes(bad.as_bytes()),
            Err(PolicyError::Toml(_))
        ));
        let old = base.replace("content = \"none\"", "record_content_hashes = true");
        assert!(LoadedPolicy::from_bytes(old.as_bytes()).is_err());
    }

    #[test]
    fn whitespace_changes_the_digest() {
        let base = std::fs::read(policy_file("production.toml")).unwrap();
        let mut edited = base.clone();
        edited.push(b'\n');
        let a = LoadedPolicy::for_self_appraisal(&base).unwrap();
        let b = LoadedPolicy::for_self_appraisal(&edited).unwrap();
        assert_eq!(a.policy, b.policy);
        assert_ne!(a.digest, b.digest);
    }

    /// Reference values for a policy naming `reference_values = "rv.toml"`.
    const REFERENCE_VALUES: &str = r#"
schema = 1
image = "inferno"
[tools]
mkosi = "25.3"
[sev_snp]
measurements = [{ product = "Genoa", vcpus = 4, measurement = "MEASUREMENT" }]
[tdx]
mrtd = ["MRTD"]
[tpm.sha256]
11 = ["PCR11"]
"#;

    fn reference_values() -> String {
        REFERENCE_VALUES
            .replace("MEASUREMENT", &"ab".repeat(48))
            .replace("MRTD", &"cd".repeat(48))
            .replace("PCR11", &"ef".repeat(32))
    }

    fn production_naming(file: &str) -> String {
        std::fs::read_to_string(policy_file("production.toml"))
            .unwrap()
            .replace(
                "reference_values = \"reference-values.toml\"",
                &format!("reference_values = \"{file}\""),
            )
    }

    #[test]
    fn reference_values_fill_the_allow_lists_of_verifiers_only() {
        let text = production_naming("rv.toml");
        let loaded =
            LoadedPolicy::with_reference_values(text.as_bytes(), reference_values().as_bytes())
                .unwrap();
        let snp = loaded.policy.sev_snp.as_ref().unwrap();
        assert_eq!(snp.measurements, Some(vec!["ab".repeat(48)]));
        assert_eq!(
            loaded.policy.tdx.as_ref().unwrap().mrtd,
            Some(vec!["cd".repeat(48)])
        );
        let tpm = loaded.policy.tpm.as_ref().unwrap();
        assert_eq!(tpm.pcr_values["11"], ["ef".repeat(32)]);
        assert_eq!(
            loaded.digest,
            <[u8; 32]>::from(Sha256::digest(text.as_bytes()))
        );
        assert_eq!(
            loaded.allow_list_name("sev_snp.measurements"),
            "the reference values of image \"inferno\" (rv.toml)"
        );
        assert_eq!(
            loaded.allow_list_name("sev_snp.host_data"),
            "the policy's allow-list"
        );

        // From its file: the file next to the policy is read; a missing one is an error.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("policy.toml"), &text).unwrap();
        let err = LoadedPolicy::from_file(&dir.path().join("policy.toml")).unwrap_err();
        assert!(err.to_string().contains("rv.toml"), "{err}");
        std::fs::write(dir.path().join("rv.toml"), reference_values()).unwrap();
        let from_file = LoadedPolicy::from_file(&dir.path().join("policy.toml")).unwrap();
        assert_eq!(from_file, loaded);

        // Read from bytes the file cannot be found: refused, naming the key.
        let err = LoadedPolicy::from_bytes(text.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("reference_values"), "{err}");
        // The appliance's self-appraisal leaves them out, and says so.
        let own = LoadedPolicy::for_self_appraisal(text.as_bytes()).unwrap();
        assert_eq!(own.policy.sev_snp.as_ref().unwrap().measurements, None);
        assert!(own.policy.tpm.as_ref().unwrap().pcr_values.is_empty());
        assert_eq!(
            own.reference_values,
            ReferenceValuesUse::NotApplied {
                file: "rv.toml".into()
            }
        );
    }

    #[test]
    fn bad_or_conflicting_reference_values_are_rejected() {
        let text = production_naming("rv.toml");
        let load = |policy: &str, values: &str| {
            LoadedPolicy::with_reference_values(policy.as_bytes(), values.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let values = reference_values();
        assert_eq!(load(&text, &values), Ok(()));
        for (bad_values, reason) in [
            (values.replace("schema = 1", "schema = 2"), "schema"),
            (values.replace("[tools]", "[tool]"), "unknown field"),
            (values.replace("Genoa", "Naples"), "Naples"),
            (values.replace(&"ab".repeat(48), "abcd"), "2 bytes"),
            (values.replace("11 = ", "24 = "), "\"24\""),
            (values.replace("11 = ", "12 = "), "PCR 12"),
            (values.replace(&"ef".repeat(32), "zz"), "not hex"),
        ] {
            let err = load(&text, &bad_values).unwrap_err();
            assert!(err.contains(reason), "{reason}: {err}");
        }
        // A list set both inline and by the file is ambiguous.
        let inline = text.replace(
            "require_crl = false",
            &format!(
                "require_crl = false\nmeasurements = [\"{}\"]",
                "00".repeat(48)
            ),
        );
        let err = load(&inline, &values).unwrap_err();
        assert!(err.contains("sev_snp.measurements"), "{err}");
        // Values for a table the policy lacks.
        let no_tpm = text.replace("[tpm]\n", "[tpm_gone]\n");
        assert!(load(&no_tpm, &values).is_err());
        // Reference values given to a policy that names none.
        let dev = std::fs::read_to_string(policy_file("development.toml")).unwrap();
        let err = load(&dev, &values).unwrap_err();
        assert!(err.contains("names no reference-values file"), "{err}");
        // Inline PCR values must be quoted PCRs with 32-byte hex values.
        let inline_pcr = |values: &str| {
            let pcrs = "pcrs = [0, 1, 2, 3, 4, 5, 6, 7]";
            let text = dev.replace(pcrs, &format!("{pcrs}\npcr_values = {{ {values} }}"));
            LoadedPolicy::from_bytes(text.as_bytes()).map_err(|e| e.to_string())
        };
        let good = format!("7 = [\"{}\"]", "00".repeat(32));
        let loaded = LoadedPolicy::from_bytes(
            dev.replace(
                "pcrs = [0, 1, 2, 3, 4, 5, 6, 7]",
                &format!("pcrs = [0, 1, 2, 3, 4, 5, 6, 7]\npcr_values = {{ {good} }}"),
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            loaded.policy.tpm.unwrap().pcr_values["7"],
            ["00".repeat(32)]
        );
        for (bad, reason) in [
            (
                format!("11 = [\"{}\"]", "00".repeat(32)),
                "PCR 11 is not among",
            ),
            (format!("07 = [\"{}\"]", "00".repeat(32)), "not a PCR index"),
            ("7 = [\"00\"]".to_owned(), "1 bytes"),
        ] {
            let err = inline_pcr(&bad).unwrap_err();
            assert!(err.contains(reason), "{bad}: {err}");
        }
    }

    #[test]
    fn the_shipped_reference_values_parse() {
        let bytes = std::fs::read(policy_file("reference-values.toml")).unwrap();
        let values = ReferenceValues::from_bytes(&bytes).unwrap();
        assert!(values.image.starts_with("inferno"));
        let pcr11 = &values.tpm.as_ref().unwrap().sha256["11"];
        assert_eq!(pcr11.len(), 1);
        assert_eq!(
            values.tpm.as_ref().unwrap().pcr11_boot_phases["ready"],
            pcr11[0]
        );
    }
}
