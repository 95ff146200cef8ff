//! The `inferno` command line: `serve`, `generate`, `bench`, `audit`, `attest`, `keybroker`,
//! `seal`, `verify` and `proxy`.

mod attest;
mod audit;
mod bench;
mod generate;
mod keybroker;
mod proxy;
mod seal;
mod serve;
mod setup;
mod thread_cpu;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Confidential-computing LLM inference appliance.
#[derive(Debug, Parser)]
#[command(name = "inferno", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the OpenAI API over TLS.
    Serve(serve::ServeArgs),
    /// Generate a completion locally, without a server.
    Generate(generate::GenerateArgs),
    /// Benchmark the engine or a running server.
    Bench(bench::BenchArgs),
    /// Verify, inspect and witness audit logs.
    Audit(audit::AuditArgs),
    /// Verify attestation evidence and build collateral bundles.
    Attest(attest::AttestArgs),
    /// Release sealed models' keys to appliances whose evidence passes a release policy.
    Keybroker(keybroker::KeybrokerArgs),
    /// Seal (encrypt) a model directory for serving as a sealed model.
    Seal(seal::SealArgs),
    /// Verify a running server's attestation over TLS against a client policy.
    Verify(verify::VerifyArgs),
    /// A local plain-HTTP OpenAI endpoint that forwards only to a verified server.
    Proxy(proxy::ProxyArgs),
}

/// Parses the command line, runs the subcommand and maps its outcome to an exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Attest(args) => attest::run(args),
        Command::Keybroker(args) => keybroker::run(args),
        Command::Seal(args) => seal::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Proxy(args) => proxy::run(args),
    }
}

/// Prints a one-line error cause (with its chain) and returns exit status 1.
pub(crate) fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("error: {err:#}");
    ExitCode::FAILURE
}

/// Logs to stderr under `RUST_LOG` (default `info`). A second initialisation (tests in one
/// process) keeps the first subscriber.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
