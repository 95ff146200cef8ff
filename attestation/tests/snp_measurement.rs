//! Cross-checks the SEV-SNP launch measurement of `inferno_attestation::snp_measurement` (the
//! `sev` crate) against sev-snp-measure's values in `testdata/snp-measurement/vectors.toml`,
//! and ties the shipped reference values to those vectors.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::reference_values::ReferenceValues;
use inferno_attestation::snp_measurement::{DirectBoot, PRODUCT_VCPU_TYPES, SnpMeasurementError};
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Vectors {
    ovmf_sha256: String,
    tool: String,
    synthetic: Synthetic,
    appliance: Appliance,
}

#[derive(Deserialize)]
struct Synthetic {
    kernel: String,
    initrd: String,
    cmdline: String,
    kernel_sha256: String,
    initrd_sha256: String,
    cmdline_nul_sha256: String,
    measurements: Vec<Expected>,
}

#[derive(Deserialize)]
struct Appliance {
    kernel_sha256: String,
    initrd_sha256: String,
    cmdline_nul_sha256: String,
    measurements: Vec<Expected>,
}

#[derive(Deserialize)]
struct Expected {
    vcpu_type: String,
    vcpus: u32,
    measurement: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/snp-measurement")
}

fn vectors() -> Vectors {
    toml::from_str(&std::fs::read_to_string(testdata().join("vectors.toml")).unwrap()).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn cmdline_nul_sha256(cmdline: &str) -> String {
    sha256_hex(&[cmdline.as_bytes(), b"\0"].concat())
}

/// Decompresses the committed AmdSev OVMF into `dir` and checks its SHA-256 against the vectors.
fn ovmf(dir: &Path, vectors: &Vectors) -> PathBuf {
    let mut firmware = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(testdata().join("OVMF.amdsev.fd.gz")).unwrap(),
    )
    .read_to_end(&mut firmware)
    .unwrap();
    assert_eq!(sha256_hex(&firmware), vectors.ovmf_sha256);
    let path = dir.join("OVMF.amdsev.fd");
    std::fs::write(&path, firmware).unwrap();
    path
}

#[test]
fn the_sev_crate_agrees_with_sev_snp_measure_on_every_synthetic_vector() {
    let v = vectors();
    assert_eq!(v.tool, "sev-snp-measure 0.0.13");
    let s = &v.synthetic;
    assert_eq!(sha256_hex(s.kernel.as_bytes()), s.kernel_sha256);
    assert_eq!(sha256_hex(s.initrd.as_bytes()), s.initrd_sha256);
    assert_eq!(cmdline_nul_sha256(&s.cmdline), s.cmdline_nul_sha256);

    let dir = tempfile::tempdir().unwrap();
    let boot = DirectBoot {
        ovmf: ovmf(dir.path(), &v),
        kernel: dir.path().join("kernel"),
        initrd: dir.path().join("initrd"),
        cmdline: s.cmdline.clone(),
    };
    std::fs::write(&boot.kernel, &s.kernel).unwrap();
    std::fs::write(&boot.initrd, &s.initrd).unwrap();
    assert!(s.measurements.len() >= 16);
    let mut distinct = std::collections::BTreeSet::new();
    for e in &s.measurements {
        let computed = boot.launch_measurement(&e.vcpu_type, e.vcpus).unwrap();
        assert_eq!(
            hex::encode(computed),
            e.measurement,
            "{} x{}",
            e.vcpu_type,
            e.vcpus
        );
        distinct.insert(e.measurement.clone());
    }
    // Every vCPU type and count gives its own value: the vector exercises both.
    assert_eq!(distinct.len(), s.measurements.len());

    // Each input is measured: a changed kernel, initrd or command line changes the value.
    let first = &s.measurements[0];
    let expected = first.measurement.as_str();
    let changed = |boot: &DirectBoot| {
        hex::encode(
            boot.launch_measurement(&first.vcpu_type, first.vcpus)
                .unwrap(),
        )
    };
    let mut other = boot.clone();
    other.cmdline.push_str(" debug");
    assert_ne!(changed(&other), expected);
    std::fs::write(dir.path().join("other"), "another kernel").unwrap();
    let other = DirectBoot {
        kernel: dir.path().join("other"),
        ..boot.clone()
    };
    assert_ne!(changed(&other), expected);
    let other = DirectBoot {
        initrd: dir.path().join("other"),
        ..boot.clone()
    };
    assert_ne!(changed(&other), expected);
}

#[test]
fn a_firmware_without_the_sev_hashes_table_is_refused_naming_it() {
    let v = vectors();
    let dir = tempfile::tempdir().unwrap();
    let path = ovmf(dir.path(), &v);
    let original = std::fs::read(&path).unwrap();
    std::fs::write(dir.path().join("kernel"), "k").unwrap();
    let boot = DirectBoot {
        ovmf: path.clone(),
        kernel: dir.path().join("kernel"),
        initrd: dir.path().join("kernel"),
        cmdline: "quiet".into(),
    };

    // The SEV metadata ("ASEV" header: signature, length, version, item count, then items of
    // GPA, size and type, little-endian u32s) with its kernel-hashes section (type 0x10) turned
    // into a secrets section (type 2): the firmware of a build without the hashes table.
    let mut firmware = original.clone();
    let header = firmware.windows(4).position(|w| w == b"ASEV").unwrap();
    let u32_at = |f: &[u8], at: usize| u32::from_le_bytes(f[at..at + 4].try_into().unwrap());
    let items = u32_at(&firmware, header + 12) as usize;
    let mut replaced = 0;
    for item in 0..items {
        let kind = header + 16 + item * 12 + 8;
        if u32_at(&firmware, kind) == 0x10 {
            firmware[kind..kind + 4].copy_from_slice(&2u32.to_le_bytes());
            replaced += 1;
        }
    }
    assert_eq!(replaced, 1, "the AmdSev OVMF has one kernel-hashes section");
    std::fs::write(&path, &firmware).unwrap();
    let err = boot.launch_measurement("EPYC-Genoa", 1).unwrap_err();
    assert!(
        matches!(err, SnpMeasurementError::NoHashesTable(_)),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );

    // The footer table that locates the metadata blanked: refused, naming the file.
    let mut firmware = original;
    let len = firmware.len();
    firmware[len - 0x10000..].fill(0xff);
    std::fs::write(&path, &firmware).unwrap();
    let err = boot.launch_measurement("EPYC-Genoa", 1).unwrap_err();
    assert!(matches!(err, SnpMeasurementError::Compute(_)), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// The `[sev_snp]` measurements of policy/reference-values.toml, as (QEMU vCPU type, vCPUs) ->
/// measurement.
fn shipped() -> (ReferenceValues, BTreeMap<(String, u32), String>) {
    let values = ReferenceValues::from_bytes(
        &std::fs::read(root().join("policy/reference-values.toml")).unwrap(),
    )
    .unwrap();
    let map = values
        .sev_snp
        .as_ref()
        .unwrap()
        .measurements
        .iter()
        .map(|m| {
            let vcpu_type = PRODUCT_VCPU_TYPES
                .iter()
                .find(|(p, _)| *p == m.product)
                .unwrap()
                .1;
            ((vcpu_type.to_string(), m.vcpus), m.measurement.clone())
        })
        .collect();
    (values, map)
}

#[test]
fn the_shipped_reference_values_list_the_cross_checked_appliance_measurements() {
    let v = vectors();
    let (values, shipped) = shipped();
    assert_eq!(values.image, "inferno");
    assert_eq!(values.inputs["ovmf_amdsev_sha256"], v.ovmf_sha256);
    assert_eq!(values.inputs["kernel_sha256"], v.appliance.kernel_sha256);
    assert_eq!(values.inputs["initrd_sha256"], v.appliance.initrd_sha256);
    assert_eq!(
        values.inputs["cmdline_nul_sha256"],
        v.appliance.cmdline_nul_sha256
    );
    assert_eq!(
        cmdline_nul_sha256(&values.inputs["cmdline"]),
        v.appliance.cmdline_nul_sha256
    );
    assert_eq!(values.tools["sev_snp_measure"], v.tool);
    assert!(!values.guest_policy["debug"]);
    assert!(!values.guest_policy["migration_agent"]);
    let vector: BTreeMap<(String, u32), String> = v
        .appliance
        .measurements
        .iter()
        .map(|e| ((e.vcpu_type.clone(), e.vcpus), e.measurement.clone()))
        .collect();
    assert_eq!(shipped, vector);
    // Every product, each with the same vCPU counts.
    for (_, vcpu_type) in PRODUCT_VCPU_TYPES {
        let counts: Vec<u32> = shipped
            .keys()
            .filter(|(t, _)| t == vcpu_type)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(counts, [1, 2, 4, 8, 16, 32, 64], "{vcpu_type}");
    }

    // The production policies accept exactly these, and nothing else.
    let prod = LoadedPolicy::from_file(&root().join("policy/production.toml")).unwrap();
    let accepted = prod
        .policy
        .sev_snp
        .as_ref()
        .unwrap()
        .measurements
        .clone()
        .unwrap();
    let mut listed: Vec<String> = shipped.values().cloned().collect();
    let mut accepted_sorted = accepted.clone();
    listed.sort();
    accepted_sorted.sort();
    assert_eq!(accepted_sorted, listed);
}

#[test]
fn the_reference_values_script_maps_products_to_the_same_vcpu_models() {
    let script = std::fs::read_to_string(root().join("scripts/image-reference-values.sh")).unwrap();
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("snp_products=\""))
        .unwrap()
        .trim_end_matches('"');
    let pairs: Vec<(&str, &str)> = line
        .split(' ')
        .map(|p| p.split_once(':').unwrap())
        .collect();
    assert_eq!(pairs, PRODUCT_VCPU_TYPES);
}

#[test]
#[ignore = "needs the production image's split artifacts: INFERNO_IMAGE_OUT=DIR with inferno.vmlinuz, inferno.initrd, inferno.cmdline (image/build)"]
fn the_sev_crate_agrees_with_sev_snp_measure_on_the_appliance_image() {
    let out = PathBuf::from(
        std::env::var_os("INFERNO_IMAGE_OUT")
            .expect("INFERNO_IMAGE_OUT names image/build's OUTDIR"),
    );
    let v = vectors();
    let a = &v.appliance;
    let cmdline = std::fs::read_to_string(out.join("inferno.cmdline"))
        .unwrap()
        .replace('\0', "")
        .trim_end_matches('\n')
        .to_string();
    assert_eq!(
        sha256_hex(&std::fs::read(out.join("inferno.vmlinuz")).unwrap()),
        a.kernel_sha256
    );
    assert_eq!(
        sha256_hex(&std::fs::read(out.join("inferno.initrd")).unwrap()),
        a.initrd_sha256
    );
    assert_eq!(cmdline_nul_sha256(&cmdline), a.cmdline_nul_sha256);
    let dir = tempfile::tempdir().unwrap();
    let boot = DirectBoot {
        ovmf: ovmf(dir.path(), &v),
        kernel: out.join("inferno.vmlinuz"),
        initrd: out.join("inferno.initrd"),
        cmdline,
    };
    for e in &a.measurements {
        assert_eq!(
            hex::encode(boot.launch_measurement(&e.vcpu_type, e.vcpus).unwrap()),
            e.measurement,
            "{} x{}",
            e.vcpu_type,
            e.vcpus
        );
    }
}
