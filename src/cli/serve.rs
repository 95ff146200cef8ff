//! `inferno serve`.

use std::process::ExitCode;

/// Arguments of `inferno serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Runs `inferno serve`.
pub fn run(_args: ServeArgs) -> ExitCode {
    super::fail(&anyhow::anyhow!(
        "`inferno serve` is not available in this build yet"
    ))
}
