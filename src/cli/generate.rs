//! `inferno generate`.

use std::process::ExitCode;

/// Arguments of `inferno generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {}

/// Runs `inferno generate`.
pub fn run(_args: GenerateArgs) -> ExitCode {
    super::fail(&anyhow::anyhow!(
        "`inferno generate` is not available in this build yet"
    ))
}
