//! `inferno bench`.

use std::process::ExitCode;

/// Arguments of `inferno bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs `inferno bench`.
pub fn run(_args: BenchArgs) -> ExitCode {
    super::fail(&anyhow::anyhow!(
        "`inferno bench` is not available in this build yet"
    ))
}
