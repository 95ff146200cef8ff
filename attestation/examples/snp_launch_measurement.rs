//! Prints the expected SEV-SNP launch measurements of measured direct boot, computed by
//! [`inferno_attestation::snp_measurement`] (the `sev` crate), one line per vCPU type and count:
//!
//! ```text
//! cargo run -p inferno-attestation --example snp_launch_measurement -- \
//!     OVMF KERNEL INITRD CMDLINE VCPU_TYPE[,VCPU_TYPE...] VCPUS[,VCPUS...]
//! EPYC-Genoa 4 <96 hex digits>
//! ```
//!
//! `scripts/image-reference-values.sh` compares these lines with sev-snp-measure's results and
//! refuses to write a measurement the two implementations disagree on.

use std::process::ExitCode;

use inferno_attestation::snp_measurement::DirectBoot;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("snp_launch_measurement: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let [ovmf, kernel, initrd, cmdline, vcpu_types, counts] = <[String; 6]>::try_from(args)
        .map_err(|_| {
            "usage: snp_launch_measurement OVMF KERNEL INITRD CMDLINE VCPU_TYPES VCPUS".to_string()
        })?;
    let boot = DirectBoot {
        ovmf: ovmf.into(),
        kernel: kernel.into(),
        initrd: initrd.into(),
        cmdline,
    };
    for vcpu_type in vcpu_types.split(',') {
        for count in counts.split(',') {
            let vcpus: u32 = count
                .parse()
                .map_err(|_| format!("vCPU count {count:?} is not a number"))?;
            let measurement = boot
                .launch_measurement(vcpu_type, vcpus)
                .map_err(|e| e.to_string())?;
            println!("{vcpu_type} {vcpus} {}", hex::encode(measurement));
        }
    }
    Ok(())
}
