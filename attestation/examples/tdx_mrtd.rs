//! Prints the TDVF's metadata sections and the MRTD of a TD built from it, computed by
//! [`inferno_attestation::tdx_measurement`] and cross-checked against the `igvm` crate's
//! independent implementation of the TDX module's hashing (`mrtd`, the upstream KVM order), and
//! the MRTD of hosts that add a section's pages before extending them (`mrtd_per_section`,
//! which the `igvm` crate cannot express); given an initrd and a command line,
//! also RTMR2 of measured direct boot and its two event digests:
//!
//! ```text
//! cargo run -p inferno-attestation --example tdx_mrtd -- OVMF.inteltdx.fd [INITRD CMDLINE]
//! section 0 BFV raw 0x84000+0x37c000 memory 0xffc84000+0x37c000 attributes 0x1
//! ...
//! mrtd <96 hex digits>
//! mrtd_per_section <96 hex digits>
//! load_options_sha384 <96 hex digits>
//! initrd_sha384 <96 hex digits>
//! rtmr2 <96 hex digits>
//! ```
//!
//! It exits with status 2 and one error line if the firmware has no TDX metadata or the two
//! implementations disagree; `scripts/image-reference-values.sh` (INFERNO_TDVF) uses the
//! `mrtd` line.

use std::path::PathBuf;
use std::process::ExitCode;

use inferno_attestation::tdx_measurement::{PageOrder, Tdvf, direct_boot_rtmr2};

#[path = "../tests/tdx_support/igvm_mrtd.rs"]
mod igvm_mrtd;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tdx_mrtd: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (firmware, boot) = match <[String; 3]>::try_from(args) {
        Ok([firmware, initrd, cmdline]) => (firmware, Some((initrd, cmdline))),
        Err(args) => match <[String; 1]>::try_from(args) {
            Ok([firmware]) => (firmware, None),
            Err(_) => return Err("usage: tdx_mrtd TDVF [INITRD CMDLINE]".to_string()),
        },
    };
    let tdvf = Tdvf::from_file(&PathBuf::from(&firmware)).map_err(|e| e.to_string())?;
    for (i, s) in tdvf.sections().iter().enumerate() {
        println!(
            "section {i} {} raw {:#x}+{:#x} memory {:#x}+{:#x} attributes {:#x}",
            s.section_type,
            s.data_offset,
            s.raw_data_size,
            s.memory_address,
            s.memory_data_size,
            s.attributes
        );
    }
    let mrtd = tdvf.mrtd().map_err(|e| e.to_string())?;
    let independent = igvm_mrtd::igvm_mrtd(&tdvf);
    if mrtd != independent {
        return Err(format!(
            "MRTD {} disagrees with the igvm crate's {}",
            hex::encode(mrtd),
            hex::encode(independent)
        ));
    }
    println!("mrtd {}", hex::encode(mrtd));
    let per_section = tdvf
        .mrtd_in_order(PageOrder::PerSection)
        .map_err(|e| e.to_string())?;
    println!("mrtd_per_section {}", hex::encode(per_section));
    if let Some((initrd, cmdline)) = boot {
        let rtmr2 =
            direct_boot_rtmr2(&cmdline, &PathBuf::from(initrd)).map_err(|e| e.to_string())?;
        println!(
            "load_options_sha384 {}",
            hex::encode(rtmr2.load_options_sha384)
        );
        println!("initrd_sha384 {}", hex::encode(rtmr2.initrd_sha384));
        println!("rtmr2 {}", hex::encode(rtmr2.rtmr2));
    }
    Ok(())
}
