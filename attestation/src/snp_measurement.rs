//! The expected SEV-SNP launch measurement of the appliance booted by measured direct boot.
//!
//! With measured direct boot the host starts the guest with the AmdSev OVMF (the build of
//! `OvmfPkg/AmdSev/AmdSevX64.dsc`, `scripts/ovmf-amdsev-build.sh`), a kernel, an initrd and a
//! command line, and QEMU's `kernel-hashes=on` places the SEV hashes table (SHA-256 of the
//! kernel, of the initrd, and of the command line plus its NUL) in the page that the OVMF's SEV
//! metadata names. The launch digest then covers the OVMF pages, the OVMF's metadata pages
//! (the hashes table among them) and one VMSA page per vCPU, whose CPUID signature depends on
//! the vCPU type (QEMU's `-cpu` model) and whose count is the vCPU count.
//!
//! The computation is the `sev` crate's measurement support; `scripts/image-reference-values.sh`
//! computes the same values with sev-snp-measure (PyPI), an independent implementation, and the
//! vectors in `attestation/tests/vectors/snp-measurement/` hold its results, which
//! `attestation/tests/snp_measurement.rs` recomputes here.

use std::path::{Path, PathBuf};

use sev::measurement::ovmf::{OVMF, SectionType};
use sev::measurement::snp::{SnpMeasurementArgs, snp_calc_launch_digest};
use sev::measurement::vcpu_types::CpuType;
use sev::measurement::vmsa::{GuestFeatures, VMMType};

/// The size of a launch measurement in bytes.
pub const MEASUREMENT_LEN: usize = 48;

/// The QEMU vCPU model the reference values assume for each CPU product of the policy
/// (`Milan`, `Genoa`, `Turin`): the model named after the product.
pub const PRODUCT_VCPU_TYPES: [(&str, &str); 3] = [
    ("Milan", "EPYC-Milan"),
    ("Genoa", "EPYC-Genoa"),
    ("Turin", "EPYC-Turin"),
];

/// The QEMU vCPU model named after a CPU product (`Genoa` -> `EPYC-Genoa`), or None for an
/// unknown product.
pub fn vcpu_type_of_product(product: &str) -> Option<&'static str> {
    PRODUCT_VCPU_TYPES
        .iter()
        .find(|(p, _)| *p == product)
        .map(|(_, vcpu_type)| *vcpu_type)
}

/// Why a launch measurement could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum SnpMeasurementError {
    /// The vCPU count is zero.
    #[error("the vCPU count must be at least 1")]
    NoVcpus,
    /// The vCPU type is not a QEMU EPYC model the computation knows.
    #[error("unknown vCPU type {0:?} (expected a QEMU EPYC model such as EPYC-Genoa)")]
    UnknownVcpuType(String),
    /// The command line starts or ends with white space, which the measurement tools strip but
    /// QEMU hashes: the computed value would not match the launch.
    #[error("the kernel command line starts or ends with white space")]
    CommandLineWhiteSpace,
    /// The firmware has no SEV hashes table, so the host cannot boot a kernel by measured direct
    /// boot with it.
    #[error("{0} has no SEV hashes table: use the AmdSev OVMF (scripts/ovmf-amdsev-build.sh)")]
    NoHashesTable(String),
    /// The `sev` crate's computation failed (an unreadable file, a malformed OVMF).
    #[error("cannot compute the launch measurement: {0}")]
    Compute(String),
}

/// The inputs of measured direct boot that the image and the firmware determine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectBoot {
    /// The AmdSev OVMF firmware file.
    pub ovmf: PathBuf,
    /// The kernel (bzImage) file.
    pub kernel: PathBuf,
    /// The initrd file.
    pub initrd: PathBuf,
    /// The kernel command line, without its terminating NUL.
    pub cmdline: String,
}

impl DirectBoot {
    /// The expected launch measurement of this boot with `vcpus` vCPUs of QEMU model
    /// `vcpu_type` (`EPYC-Genoa`, `EPYC-v4`, ...), launched by QEMU with the default SEV-SNP
    /// guest features (SNP active only).
    pub fn launch_measurement(
        &self,
        vcpu_type: &str,
        vcpus: u32,
    ) -> Result<[u8; MEASUREMENT_LEN], SnpMeasurementError> {
        if vcpus == 0 {
            return Err(SnpMeasurementError::NoVcpus);
        }
        let cpu = CpuType::try_from(vcpu_type)
            .map_err(|_| SnpMeasurementError::UnknownVcpuType(vcpu_type.to_string()))?;
        if self.cmdline.trim() != self.cmdline {
            return Err(SnpMeasurementError::CommandLineWhiteSpace);
        }
        for path in [&self.kernel, &self.initrd] {
            std::fs::metadata(path)
                .map_err(|e| SnpMeasurementError::Compute(format!("{}: {e}", path.display())))?;
        }
        check_hashes_table(&self.ovmf)?;
        let digest = snp_calc_launch_digest(SnpMeasurementArgs {
            vcpus,
            vcpu_type: cpu,
            ovmf_file: self.ovmf.clone(),
            guest_features: GuestFeatures::default(),
            kernel_file: Some(self.kernel.clone()),
            initrd_file: Some(self.initrd.clone()),
            append: Some(&self.cmdline),
            ovmf_hash_str: None,
            vmm_type: Some(VMMType::QEMU),
        })
        .map_err(|e| SnpMeasurementError::Compute(e.to_string()))?;
        let bytes: Vec<u8> = digest
            .try_into()
            .map_err(|e: sev::error::MeasurementError| {
                SnpMeasurementError::Compute(e.to_string())
            })?;
        bytes.try_into().map_err(|b: Vec<u8>| {
            SnpMeasurementError::Compute(format!("digest has {} bytes, not 48", b.len()))
        })
    }
}

/// Fails unless the OVMF at `path` carries the SEV hashes table.
fn check_hashes_table(path: &Path) -> Result<(), SnpMeasurementError> {
    let ovmf = OVMF::new(path.to_path_buf())
        .map_err(|e| SnpMeasurementError::Compute(format!("{}: {e}", path.display())))?;
    if ovmf.has_metadata_section(SectionType::SnpKernelHashes) {
        Ok(())
    } else {
        Err(SnpMeasurementError::NoHashesTable(
            path.display().to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_product_has_a_vcpu_model_the_computation_knows() {
        for (product, vcpu_type) in PRODUCT_VCPU_TYPES {
            assert_eq!(vcpu_type_of_product(product), Some(vcpu_type));
            assert!(CpuType::try_from(vcpu_type).is_ok(), "{vcpu_type}");
        }
        assert_eq!(vcpu_type_of_product("Rome"), None);
    }

    fn boot(cmdline: &str) -> DirectBoot {
        DirectBoot {
            ovmf: "/nonexistent/OVMF.fd".into(),
            kernel: "/nonexistent/vmlinuz".into(),
            initrd: "/nonexistent/initrd".into(),
            cmdline: cmdline.into(),
        }
    }

    #[test]
    fn bad_configurations_are_refused_before_any_file_is_read() {
        assert!(matches!(
            boot("quiet").launch_measurement("EPYC-Genoa", 0),
            Err(SnpMeasurementError::NoVcpus)
        ));
        assert!(matches!(
            boot("quiet").launch_measurement("Pentium", 1),
            Err(SnpMeasurementError::UnknownVcpuType(t)) if t == "Pentium"
        ));
        assert!(matches!(
            boot("quiet ").launch_measurement("EPYC-Genoa", 1),
            Err(SnpMeasurementError::CommandLineWhiteSpace)
        ));
        let missing = boot("quiet").launch_measurement("EPYC-Genoa", 1);
        assert!(
            matches!(&missing, Err(SnpMeasurementError::Compute(m)) if m.contains("/nonexistent/vmlinuz")),
            "{missing:?}"
        );
    }
}
