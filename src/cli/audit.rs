//! `inferno audit`.

use std::process::ExitCode;

/// Arguments of `inferno audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {}

/// Runs `inferno audit`.
pub fn run(_args: AuditArgs) -> ExitCode {
    super::fail(&anyhow::anyhow!(
        "`inferno audit` is not available in this build yet"
    ))
}
