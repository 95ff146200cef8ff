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
mod serve_flags;
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
    eprintln!("error: {}", one_line(err));
    ExitCode::FAILURE
}

/// The error and its causes on one line, `: `-separated, each cause once: a cause whose text
/// an outer message already includes (an error that prints its source) is not repeated.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal (and `NO_COLOR` is unset).
    #[default]
    Text,
    /// One JSON object a line (`timestamp`, `level`, `target`, `message` and the fields), for
    /// log shippers.
    Json,
}

/// Logs to stderr as text under `RUST_LOG` (default `info`).
fn init_tracing() {
    init_tracing_as(LogFormat::Text);
}

/// Logs to stderr in `format` under `RUST_LOG` (default `info`); ANSI colours only on a
/// terminal. A second initialisation (tests in one process) keeps the first subscriber.
fn init_tracing_as(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_printed_by_its_parent_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file (os error 2)");
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read p.toml: {source}")]
        struct Read {
            source: std::io::Error,
        }
        let err = anyhow::Error::new(Read { source: io }).context("cannot start");
        assert_eq!(
            one_line(&err),
            "cannot start: cannot read p.toml: No such file (os error 2)"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&plain), "outer: inner");
    }
}
