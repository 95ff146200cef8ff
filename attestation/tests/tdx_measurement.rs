//! MRTD of `inferno_attestation::tdx_measurement`: the metadata of the real TDVF built by
//! `scripts/tdvf-build.sh` (`testdata/tdx-measurement/`), MRTD of a small synthetic firmware
//! computed step by step here, the `igvm` crate's independent implementation of the TDX
//! module's hashing on both, the errors for firmware without (valid) TDX metadata, and the
//! shipped reference values.

use std::io::Read;
use std::path::PathBuf;

use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::reference_values::ReferenceValues;
use inferno_attestation::tdx_measurement::{
    PageOrder, SectionType, Tdvf, TdxMeasurementError, direct_boot_load_options, direct_boot_rtmr2,
    rtmr_extend,
};
use serde::Deserialize;
use sha2::{Digest, Sha256, Sha384};

#[path = "tdx_support/igvm_mrtd.rs"]
mod igvm_mrtd;
use igvm_mrtd::igvm_mrtd;

#[derive(Deserialize)]
struct Vectors {
    tdvf_sha256: String,
    mrtd: String,
    mrtd_per_section: String,
    sections: Vec<(String, u32, u32, u64, u64, u32)>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

fn vectors() -> Vectors {
    let text = std::fs::read_to_string(testdata().join("tdx-measurement/vectors.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

fn gunzip(rel: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(testdata().join(rel)).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    bytes
}

/// The committed TDVF, checked against the SHA-256 the vectors (and the build) name.
fn built_tdvf(v: &Vectors) -> Vec<u8> {
    let firmware = gunzip("tdx-measurement/OVMF.inteltdx.fd.gz");
    assert_eq!(hex::encode(Sha256::digest(&firmware)), v.tdvf_sha256);
    firmware
}

#[test]
fn the_built_tdvf_metadata_lists_its_sections() {
    let v = vectors();
    let tdvf = Tdvf::from_bytes(built_tdvf(&v)).unwrap();
    assert_eq!(tdvf.version(), 1);
    let parsed: Vec<(String, u32, u32, u64, u64, u32)> = tdvf
        .sections()
        .iter()
        .map(|s| {
            (
                s.section_type.to_string(),
                s.data_offset,
                s.raw_data_size,
                s.memory_address,
                s.memory_data_size,
                s.attributes,
            )
        })
        .collect();
    assert_eq!(parsed, v.sections);
    // The firmware's code is measured; its variable store, the TD HOB and temporary memory are
    // only added.
    let bfv = &tdvf.sections()[0];
    assert_eq!(bfv.section_type, SectionType::Bfv);
    assert!(bfv.extends_mrtd() && !bfv.page_aug());
    assert!(tdvf.sections()[1..].iter().all(|s| !s.extends_mrtd()));
    // The BFV ends at 4 GiB, where the reset vector is.
    assert_eq!(bfv.memory_address + bfv.memory_data_size, 1 << 32);
}

#[test]
fn the_built_tdvf_mrtd_agrees_with_the_igvm_crate_and_the_vector() {
    let v = vectors();
    let tdvf = Tdvf::from_bytes(built_tdvf(&v)).unwrap();
    let mrtd = tdvf.mrtd().unwrap();
    assert_eq!(hex::encode(mrtd), v.mrtd);
    assert_eq!(igvm_mrtd(&tdvf), mrtd);
    assert_eq!(tdvf.mrtd_in_order(PageOrder::PerPage).unwrap(), mrtd);
    let per_section = tdvf.mrtd_in_order(PageOrder::PerSection).unwrap();
    assert_eq!(hex::encode(per_section), v.mrtd_per_section);
    assert_ne!(per_section, mrtd);
}

#[test]
fn mrtd_covers_the_measured_code_but_not_the_variable_store() {
    let v = vectors();
    let firmware = built_tdvf(&v);
    let original = Tdvf::from_bytes(firmware.clone()).unwrap().mrtd().unwrap();
    // A byte of the code volume (BFV, raw 0x84000..) changes MRTD.
    let mut code = firmware.clone();
    code[0x100000] ^= 1;
    let changed = Tdvf::from_bytes(code).unwrap();
    assert_ne!(changed.mrtd().unwrap(), original);
    assert_eq!(igvm_mrtd(&changed), changed.mrtd().unwrap());
    // A byte of the variable store (CFV, raw 0..0x84000) does not: it is added, not extended.
    let mut vars = firmware;
    vars[0x1000] ^= 1;
    assert_eq!(Tdvf::from_bytes(vars).unwrap().mrtd().unwrap(), original);
}

// --- A synthetic firmware, its MRTD computed operation by operation ---

/// On-disk bytes of the OVMF GUIDed table's footer GUID 96b582de-1fb2-45f7-baea-a366c55a082d.
const FOOTER_GUID: [u8; 16] = [
    0xde, 0x82, 0xb5, 0x96, 0xb2, 0x1f, 0xf7, 0x45, 0xba, 0xea, 0xa3, 0x66, 0xc5, 0x5a, 0x08, 0x2d,
];
/// On-disk bytes of the TDX metadata offset GUID e47a6535-984a-4798-865e-4685a7bf8ec2.
const TDX_OFFSET_GUID: [u8; 16] = [
    0x35, 0x65, 0x7a, 0xe4, 0x4a, 0x98, 0x98, 0x47, 0x86, 0x5e, 0x46, 0x85, 0xa7, 0xbf, 0x8e, 0xc2,
];
/// Any other GUID, for an entry the parser must step over.
const OTHER_GUID: [u8; 16] = [0x11; 16];

const IMAGE_LEN: usize = 0x3000;
const METADATA_AT: usize = 0x2000;

/// One section: type, raw offset, raw size, memory address, memory size, attributes.
type Section = (u32, u32, u32, u64, u64, u32);

/// Sections of the synthetic firmware: a code volume of 1.5 pages of content measured over two
/// pages, a variable store added only, temporary memory added only, and memory the guest
/// accepts later (PAGE.AUG), which MRTD does not cover.
const SECTIONS: [Section; 4] = [
    (0, 0x0, 0x1800, 0xfffe_0000, 0x2000, 1),
    (1, 0x1800, 0x800, 0xffff_0000, 0x1000, 0),
    (3, 0, 0, 0x80_0000, 0x1000, 0),
    (3, 0, 0, 0x90_0000, 0x1000, 2),
];

fn content_byte(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// A firmware image: content bytes, the metadata at METADATA_AT, and a GUIDed table at the end
/// holding an unrelated entry, the TDX metadata offset entry (when `with_tdx_entry`) and the
/// footer, ending 0x20 bytes before the end.
fn synthetic_image(sections: &[Section], with_tdx_entry: bool) -> Vec<u8> {
    let mut image: Vec<u8> = (0..IMAGE_LEN).map(content_byte).collect();
    let mut metadata = Vec::new();
    metadata.extend_from_slice(b"TDVF");
    metadata.extend_from_slice(&(16 + 32 * sections.len() as u32).to_le_bytes());
    metadata.extend_from_slice(&1u32.to_le_bytes());
    metadata.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for &(kind, offset, raw, address, size, attributes) in sections {
        metadata.extend_from_slice(&offset.to_le_bytes());
        metadata.extend_from_slice(&raw.to_le_bytes());
        metadata.extend_from_slice(&address.to_le_bytes());
        metadata.extend_from_slice(&size.to_le_bytes());
        metadata.extend_from_slice(&kind.to_le_bytes());
        metadata.extend_from_slice(&attributes.to_le_bytes());
    }
    image[METADATA_AT..METADATA_AT + metadata.len()].copy_from_slice(&metadata);

    let mut table = Vec::new();
    let mut entry = |data: &[u8], guid: &[u8; 16]| {
        table.extend_from_slice(data);
        table.extend_from_slice(&((data.len() + 18) as u16).to_le_bytes());
        table.extend_from_slice(guid);
    };
    entry(&[0xaa; 6], &OTHER_GUID);
    if with_tdx_entry {
        entry(
            &((IMAGE_LEN - METADATA_AT) as u32).to_le_bytes(),
            &TDX_OFFSET_GUID,
        );
    }
    let total = table.len() + 18;
    table.extend_from_slice(&(total as u16).to_le_bytes());
    table.extend_from_slice(&FOOTER_GUID);
    let end = IMAGE_LEN - 0x20;
    image[end - table.len()..end].copy_from_slice(&table);
    image
}

/// The 128-byte record of one TDX module operation, written out field by field.
fn record(operation: &str, gpa: u64) -> Vec<u8> {
    let mut r = operation.as_bytes().to_vec();
    r.resize(16, 0);
    r.extend_from_slice(&gpa.to_le_bytes());
    r.resize(128, 0);
    r
}

#[test]
fn synthetic_firmware_mrtd_is_the_hash_of_each_page_add_and_extend() {
    let image = synthetic_image(&SECTIONS, true);
    let tdvf = Tdvf::from_bytes(image.clone()).unwrap();
    assert_eq!(tdvf.sections().len(), 4);
    assert_eq!(tdvf.sections()[3].section_type, SectionType::TempMem);
    assert!(tdvf.sections()[3].page_aug());

    let mut expected = Sha384::new();
    // The code volume's first page: added, then its 16 chunks of raw content extended.
    expected.update(record("MEM.PAGE.ADD", 0xfffe_0000));
    for chunk in 0..16u64 {
        expected.update(record("MR.EXTEND", 0xfffe_0000 + chunk * 256));
        let at = (chunk * 256) as usize;
        expected.update(&image[at..at + 256]);
    }
    // Its second page: raw content for the first 0x800 bytes, zeros after it.
    expected.update(record("MEM.PAGE.ADD", 0xfffe_1000));
    for chunk in 0..16u64 {
        expected.update(record("MR.EXTEND", 0xfffe_1000 + chunk * 256));
        if chunk < 8 {
            let at = 0x1000 + (chunk * 256) as usize;
            expected.update(&image[at..at + 256]);
        } else {
            expected.update([0u8; 256]);
        }
    }
    // The variable store and the temporary memory: added only. The PAGE.AUG section: nothing.
    expected.update(record("MEM.PAGE.ADD", 0xffff_0000));
    expected.update(record("MEM.PAGE.ADD", 0x80_0000));
    let expected: [u8; 48] = expected.finalize().into();

    assert_eq!(tdvf.mrtd().unwrap(), expected);
    assert_eq!(igvm_mrtd(&tdvf), expected);
}

#[test]
fn synthetic_firmware_mrtd_per_section_adds_all_pages_before_extending() {
    let image = synthetic_image(&SECTIONS, true);
    let tdvf = Tdvf::from_bytes(image.clone()).unwrap();
    let mut expected = Sha384::new();
    // The code volume: both pages added, then both pages' chunks extended.
    expected.update(record("MEM.PAGE.ADD", 0xfffe_0000));
    expected.update(record("MEM.PAGE.ADD", 0xfffe_1000));
    for chunk in 0..32u64 {
        expected.update(record("MR.EXTEND", 0xfffe_0000 + chunk * 256));
        if chunk < 24 {
            let at = (chunk * 256) as usize;
            expected.update(&image[at..at + 256]);
        } else {
            expected.update([0u8; 256]);
        }
    }
    expected.update(record("MEM.PAGE.ADD", 0xffff_0000));
    expected.update(record("MEM.PAGE.ADD", 0x80_0000));
    let expected: [u8; 48] = expected.finalize().into();
    assert_eq!(tdvf.mrtd_in_order(PageOrder::PerSection).unwrap(), expected);
    assert_ne!(tdvf.mrtd().unwrap(), expected);
}

#[test]
fn synthetic_firmware_mrtd_depends_on_addresses_and_attributes() {
    let base = Tdvf::from_bytes(synthetic_image(&SECTIONS, true))
        .unwrap()
        .mrtd()
        .unwrap();
    let mut moved = SECTIONS;
    moved[2].3 = 0x80_1000;
    let mut measured_store = SECTIONS;
    measured_store[1].5 = 1;
    let mut added_late = SECTIONS;
    added_late[3].5 = 0;
    for sections in [moved, measured_store, added_late] {
        let tdvf = Tdvf::from_bytes(synthetic_image(&sections, true)).unwrap();
        let mrtd = tdvf.mrtd().unwrap();
        assert_ne!(mrtd, base, "{sections:x?}");
        assert_eq!(igvm_mrtd(&tdvf), mrtd);
    }
}

// --- Firmware without (valid) TDX metadata ---

#[test]
fn firmware_without_tdx_metadata_is_refused_naming_it() {
    // A GUIDed table without the TDX entry.
    let err = Tdvf::from_bytes(synthetic_image(&SECTIONS, false)).unwrap_err();
    assert!(
        matches!(err, TdxMeasurementError::NoTdxMetadata(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("no TDX metadata"), "{err}");
    assert!(err.to_string().contains("scripts/tdvf-build.sh"), "{err}");
    // No GUIDed table at all: a variable store, or any other file.
    for image in [vec![0u8; 0x84000], b"not a firmware".to_vec(), Vec::new()] {
        let err = Tdvf::from_bytes(image).unwrap_err();
        assert!(
            matches!(err, TdxMeasurementError::NoTdxMetadata(_)),
            "{err:?}"
        );
    }
    // A file that is not there.
    let err = Tdvf::from_file(&testdata().join("tdx-measurement/absent.fd")).unwrap_err();
    assert!(err.to_string().contains("absent.fd"), "{err}");
}

#[test]
fn malformed_metadata_is_refused_naming_the_fault() {
    let refuse = |image: Vec<u8>, needle: &str| {
        let err = Tdvf::from_bytes(image).unwrap_err();
        assert!(
            matches!(err, TdxMeasurementError::Malformed(_)),
            "{needle}: {err:?}"
        );
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    };
    let mut bad_signature = synthetic_image(&SECTIONS, true);
    bad_signature[METADATA_AT] = b'X';
    refuse(bad_signature, "signature");
    let mut bad_version = synthetic_image(&SECTIONS, true);
    bad_version[METADATA_AT + 8] = 2;
    refuse(bad_version, "version 2");
    let mut outside = SECTIONS;
    outside[1].1 = 0x2800;
    outside[1].2 = 0x1000;
    refuse(synthetic_image(&outside, true), "runs past");
    let mut unaligned = SECTIONS;
    unaligned[2].3 = 0x80_0800;
    refuse(synthetic_image(&unaligned, true), "not page-aligned");
    let mut raw_too_big = SECTIONS;
    raw_too_big[1].2 = 0x1800;
    refuse(synthetic_image(&raw_too_big, true), "exceeds memory size");
    let mut unknown_attribute = SECTIONS;
    unknown_attribute[2].5 = 4;
    refuse(
        synthetic_image(&unknown_attribute, true),
        "unknown attributes",
    );
}

#[test]
fn a_measured_td_hob_is_refused_since_the_host_writes_it() {
    let mut sections = SECTIONS;
    sections[2] = (2, 0, 0, 0x80_0000, 0x1000, 1);
    let tdvf = Tdvf::from_bytes(synthetic_image(&sections, true)).unwrap();
    let err = tdvf.mrtd().unwrap_err();
    assert!(
        matches!(
            err,
            TdxMeasurementError::HostContentMeasured {
                index: 2,
                kind: SectionType::TdHob
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("depend on the host"), "{err}");
}

// --- The shipped reference values ---

#[test]
fn the_shipped_reference_values_list_the_built_tdvf_mrtds_and_production_accepts_only_them() {
    let v = vectors();
    let values = ReferenceValues::from_bytes(
        &std::fs::read(root().join("policy/reference-values.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(values.inputs["tdvf_sha256"], v.tdvf_sha256);
    let both = vec![v.mrtd.clone(), v.mrtd_per_section.clone()];
    let tdx = values.tdx.as_ref().unwrap();
    assert_eq!(tdx.mrtd.as_ref(), Some(&both));

    let prod = LoadedPolicy::from_file(&root().join("policy/production.toml")).unwrap();
    let accepted = prod.policy.tdx.as_ref().unwrap().mrtd.clone();
    assert_eq!(accepted, Some(both));
}

// --- RTMR2 of measured direct boot ---

#[test]
fn direct_boot_load_options_are_the_command_line_and_initrd_in_utf16_with_a_nul() {
    let with = direct_boot_load_options("console=ttyS0 ro", true);
    let expected: Vec<u8> = "console=ttyS0 ro initrd=initrd\0"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    assert_eq!(with, expected);
    assert_eq!(&with[..4], b"c\0o\0");
    assert_eq!(&with[with.len() - 2..], b"\0\0");
    assert_eq!(
        direct_boot_load_options("quiet", false),
        b"q\0u\0i\0e\0t\0\0\0".to_vec()
    );
}

#[test]
fn direct_boot_rtmr2_extends_zero_with_the_load_options_then_the_initrd() {
    let dir = tempfile::tempdir().unwrap();
    let initrd = dir.path().join("initrd");
    std::fs::write(&initrd, b"an initrd of a few bytes").unwrap();
    let got = direct_boot_rtmr2("console=ttyS0", &initrd).unwrap();

    let options: Vec<u8> = "console=ttyS0 initrd=initrd\0"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let options_digest = Sha384::digest(&options);
    let initrd_digest = Sha384::digest(b"an initrd of a few bytes");
    let mut first = Sha384::new();
    first.update([0u8; 48]);
    first.update(options_digest);
    let first = first.finalize();
    let mut second = Sha384::new();
    second.update(first);
    second.update(initrd_digest);
    let rtmr2: [u8; 48] = second.finalize().into();

    assert_eq!(got.load_options, options);
    assert_eq!(got.load_options_sha384[..], options_digest[..]);
    assert_eq!(got.initrd_sha384[..], initrd_digest[..]);
    assert_eq!(got.rtmr2, rtmr2);
    // The order of the events matters.
    assert_ne!(
        rtmr_extend(
            &rtmr_extend(&[0; 48], &got.initrd_sha384),
            &got.load_options_sha384
        ),
        got.rtmr2
    );

    let err = direct_boot_rtmr2("console=ttyS0", &dir.path().join("absent")).unwrap_err();
    assert!(err.to_string().contains("cannot read the initrd"), "{err}");
}

#[test]
fn the_shipped_rtmr2_inputs_follow_from_the_command_line_and_the_initrd_digest() {
    let values = ReferenceValues::from_bytes(
        &std::fs::read(root().join("policy/reference-values.toml")).unwrap(),
    )
    .unwrap();
    let inputs = &values.inputs;
    let cmdline = &inputs["cmdline"];
    assert_eq!(
        inputs["tdx_load_options"],
        format!("{cmdline} initrd=initrd")
    );
    let options_digest: [u8; 48] = Sha384::digest(direct_boot_load_options(cmdline, true)).into();
    assert_eq!(
        inputs["tdx_load_options_sha384"],
        hex::encode(options_digest)
    );
    let initrd_digest: [u8; 48] = hex::decode(&inputs["initrd_sha384"])
        .unwrap()
        .try_into()
        .unwrap();
    let rtmr2 = rtmr_extend(&rtmr_extend(&[0; 48], &options_digest), &initrd_digest);
    assert_eq!(inputs["tdx_rtmr2_direct_boot"], hex::encode(rtmr2));
    // Recorded, not enforced: no TD launch has confirmed it.
    let tdx = values.tdx.as_ref().unwrap();
    assert_eq!((&tdx.rtmr0, &tdx.rtmr1, &tdx.rtmr2), (&None, &None, &None));
}

#[test]
#[ignore = "needs the production image's split artifacts: INFERNO_IMAGE_OUT=DIR with inferno.initrd and inferno.cmdline (image/build)"]
fn the_shipped_rtmr2_is_that_of_the_appliance_image() {
    let dir = PathBuf::from(std::env::var("INFERNO_IMAGE_OUT").expect("INFERNO_IMAGE_OUT"));
    let cmdline = std::fs::read_to_string(dir.join("inferno.cmdline")).unwrap();
    let got = direct_boot_rtmr2(&cmdline.replace('\0', ""), &dir.join("inferno.initrd")).unwrap();
    let values = ReferenceValues::from_bytes(
        &std::fs::read(root().join("policy/reference-values.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        values.inputs["initrd_sha384"],
        hex::encode(got.initrd_sha384)
    );
    assert_eq!(
        values.inputs["tdx_rtmr2_direct_boot"],
        hex::encode(got.rtmr2)
    );
}
