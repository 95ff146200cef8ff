//! Reference values: the measurements one build of the appliance image determines, as written
//! by `scripts/image-reference-values.sh` into `policy/reference-values.toml`.
//!
//! A policy names the file with its top-level `reference_values` key; loading the policy from
//! its file then applies the values (see [`LoadedPolicy::from_file`](crate::policy::LoadedPolicy::from_file)):
//! the SEV-SNP launch measurements become `[sev_snp] measurements`, the TDX registers the
//! `[tdx]` lists and the vTPM PCR values `[tpm] pcr_values`. Evidence whose measurement is not
//! listed then fails its appraisal, which names the value. `docs/deploy-airgapped.md` (section 7)
//! explains how each value is computed and reproduced.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::policy::{Policy, PolicyError, check_hex, field};

/// The only reference-values schema version this crate accepts.
pub const REFERENCE_VALUES_SCHEMA_VERSION: u32 = 1;

/// A reference-values file, schema version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceValues {
    /// The schema version; must be [`REFERENCE_VALUES_SCHEMA_VERSION`].
    pub schema: u32,
    /// The image the values describe (`inferno`, or `inferno-development`).
    pub image: String,
    /// The git commit the image was built from.
    #[serde(default)]
    pub commit: Option<String>,
    /// The build's SOURCE_DATE_EPOCH.
    #[serde(default)]
    pub source_date_epoch: Option<u64>,
    /// The SEV-SNP guest policy the image is meant to be launched with (documentation: the
    /// policy's `[sev_snp] allow_*` rules decide what is accepted).
    #[serde(default)]
    pub guest_policy: BTreeMap<String, bool>,
    /// SHA-256 (and other descriptions) of every input, so that anyone can recompute the values.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// The versions of the tools that computed the values.
    #[serde(default)]
    pub tools: BTreeMap<String, String>,
    /// SEV-SNP launch measurements.
    #[serde(default)]
    pub sev_snp: Option<SnpReferenceValues>,
    /// TDX measurement registers.
    #[serde(default)]
    pub tdx: Option<TdxReferenceValues>,
    /// vTPM PCR values.
    #[serde(default)]
    pub tpm: Option<TpmReferenceValues>,
}

/// SEV-SNP reference values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpReferenceValues {
    /// The expected launch measurements, one per CPU product and vCPU count. An empty list
    /// accepts no SEV-SNP evidence at all.
    pub measurements: Vec<SnpMeasurement>,
}

/// One expected SEV-SNP launch measurement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpMeasurement {
    /// The CPU product whose vCPU type the VMSAs carry (`Milan`, `Genoa`, `Turin`).
    pub product: String,
    /// The number of vCPUs the guest is launched with.
    pub vcpus: u32,
    /// The launch measurement, hex (48 bytes).
    pub measurement: String,
}

/// TDX reference values: each list present replaces "any value" for its register; an empty list
/// accepts no TDX evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TdxReferenceValues {
    /// Expected MRTD values (the TD's initial firmware image).
    #[serde(default)]
    pub mrtd: Option<Vec<String>>,
    /// Expected RTMR0 values (firmware configuration; depends on the host's ACPI tables).
    #[serde(default)]
    pub rtmr0: Option<Vec<String>>,
    /// Expected RTMR1 values (the boot loader / UKI).
    #[serde(default)]
    pub rtmr1: Option<Vec<String>>,
    /// Expected RTMR2 values (the kernel command line and initrd).
    #[serde(default)]
    pub rtmr2: Option<Vec<String>>,
}

/// vTPM reference values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmReferenceValues {
    /// Expected values of SHA-256-bank PCRs: PCR index ("11") to the accepted values (hex,
    /// 32 bytes).
    #[serde(default)]
    pub sha256: BTreeMap<String, Vec<String>>,
    /// PCR 11 after each boot phase systemd-pcrphase marks (`enter_initrd`, `leave_initrd`,
    /// `sysinit`, `ready`), for diagnosis; only the values in `sha256` are accepted.
    #[serde(default)]
    pub pcr11_boot_phases: BTreeMap<String, String>,
}

impl ReferenceValues {
    /// Parses and validates reference-values bytes (TOML).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PolicyError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| field("reference_values", &format!("not UTF-8: {e}")))?;
        let values: Self = toml::from_str(text).map_err(|e| {
            field(
                "reference_values",
                &format!("not valid reference values: {}", e.message()),
            )
        })?;
        values.validate()?;
        Ok(values)
    }

    fn validate(&self) -> Result<(), PolicyError> {
        if self.schema != REFERENCE_VALUES_SCHEMA_VERSION {
            return Err(field(
                "reference_values.schema",
                &format!(
                    "{} is not supported (expected {REFERENCE_VALUES_SCHEMA_VERSION})",
                    self.schema
                ),
            ));
        }
        if let Some(snp) = &self.sev_snp {
            for m in &snp.measurements {
                if !["Milan", "Genoa", "Turin"].contains(&m.product.as_str()) {
                    return Err(field(
                        "reference_values.sev_snp.measurements",
                        &format!("unknown product {:?}", m.product),
                    ));
                }
                check_hex("reference_values.sev_snp.measurements", &m.measurement, 48)?;
            }
        }
        if let Some(tdx) = &self.tdx {
            for (name, list) in tdx.lists() {
                for value in list.iter().flatten() {
                    check_hex(&format!("reference_values.tdx.{name}"), value, 48)?;
                }
            }
        }
        if let Some(tpm) = &self.tpm {
            for (pcr, values) in &tpm.sha256 {
                parse_pcr(&format!("reference_values.tpm.sha256.{pcr}"), pcr)?;
                for value in values {
                    check_hex(&format!("reference_values.tpm.sha256.{pcr}"), value, 32)?;
                }
            }
        }
        Ok(())
    }

    /// Applies the values to `policy`: each list replaces the policy's "any value". A value
    /// that the policy also sets inline is an error (which one holds would be ambiguous), and
    /// so are values for a platform or vTPM the policy has no table for. Returns the policy
    /// fields set (`sev_snp.measurements`, `tdx.mrtd`, `tpm.pcr_values.11`, ...).
    pub fn apply_to(&self, policy: &mut Policy) -> Result<BTreeSet<String>, PolicyError> {
        let mut applied = BTreeSet::new();
        if let Some(snp) = &self.sev_snp {
            let table = policy.sev_snp.as_mut().ok_or_else(|| {
                field(
                    "reference_values",
                    "the file lists SEV-SNP values but the policy has no [sev_snp] table",
                )
            })?;
            if table.measurements.is_some() {
                return Err(inline_conflict("sev_snp.measurements"));
            }
            let mut list: Vec<String> = snp
                .measurements
                .iter()
                .map(|m| m.measurement.to_ascii_lowercase())
                .collect();
            list.sort();
            list.dedup();
            table.measurements = Some(list);
            applied.insert("sev_snp.measurements".to_owned());
        }
        if let Some(tdx) = &self.tdx {
            let table = policy.tdx.as_mut().ok_or_else(|| {
                field(
                    "reference_values",
                    "the file lists TDX values but the policy has no [tdx] table",
                )
            })?;
            let targets = [
                ("mrtd", &mut table.mrtd),
                ("rtmr0", &mut table.rtmr0),
                ("rtmr1", &mut table.rtmr1),
                ("rtmr2", &mut table.rtmr2),
            ];
            for ((name, target), (_, values)) in targets.into_iter().zip(tdx.lists()) {
                if let Some(values) = values {
                    if target.is_some() {
                        return Err(inline_conflict(&format!("tdx.{name}")));
                    }
                    *target = Some(values.clone());
                    applied.insert(format!("tdx.{name}"));
                }
            }
        }
        if let Some(tpm) = self.tpm.as_ref().filter(|t| !t.sha256.is_empty()) {
            let table = policy.tpm.as_mut().ok_or_else(|| {
                field(
                    "reference_values",
                    "the file lists PCR values but the policy has no [tpm] table",
                )
            })?;
            for (pcr, values) in &tpm.sha256 {
                let index = parse_pcr("reference_values.tpm.sha256", pcr)?;
                if !table.pcrs.contains(&index) {
                    return Err(field(
                        "reference_values",
                        &format!("the file lists PCR {index}, which [tpm] pcrs does not quote"),
                    ));
                }
                let name = format!("tpm.pcr_values.{index}");
                if table
                    .pcr_values
                    .insert(index.to_string(), values.clone())
                    .is_some()
                {
                    return Err(inline_conflict(&name));
                }
                applied.insert(name);
            }
        }
        Ok(applied)
    }
}

impl TdxReferenceValues {
    fn lists(&self) -> [(&'static str, &Option<Vec<String>>); 4] {
        [
            ("mrtd", &self.mrtd),
            ("rtmr0", &self.rtmr0),
            ("rtmr1", &self.rtmr1),
            ("rtmr2", &self.rtmr2),
        ]
    }
}

fn inline_conflict(name: &str) -> PolicyError {
    field(
        name,
        "is set both inline and by the reference-values file; keep one",
    )
}

/// A PCR index 0–23 written as a TOML key.
pub(crate) fn parse_pcr(name: &str, key: &str) -> Result<u8, PolicyError> {
    match key.parse::<u8>() {
        Ok(pcr) if pcr <= 23 && pcr.to_string() == key => Ok(pcr),
        _ => Err(field(
            name,
            &format!("{key:?} is not a PCR index (0 to 23)"),
        )),
    }
}
