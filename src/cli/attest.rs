//! `inferno attest`.

use std::process::ExitCode;

/// Arguments of `inferno attest`.
#[derive(Debug, clap::Args)]
pub struct AttestArgs {}

/// Runs `inferno attest`.
pub fn run(_args: AttestArgs) -> ExitCode {
    super::fail(&anyhow::anyhow!(
        "`inferno attest` is not available in this build yet"
    ))
}
