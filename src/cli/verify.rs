//! `inferno verify https://HOST:PORT --policy CLIENT.toml`: connect to a server, verify its
//! certificate's evidence and fresh evidence bound to this connection against a client policy,
//! and print the appraisal naming each check.
//!
//! With `--ohttp` (and optionally `--relay URL`) the server is reached through whatever
//! terminates TLS in front of it: the key configuration is fetched, fresh evidence is asked for
//! with a nonce sealed to it, and the evidence must name that key (`docs/ohttp.md`).
//!
//! Exits 0 when the server is trusted, 1 when it is rejected, and 2 on bad input or when the
//! server cannot be reached or answers no evidence (one line on standard error).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use inferno_attestation::bundle::CollateralBundle;
use inferno_client::ohttp::{GatewayTarget, OhttpClient};
use inferno_client::policy::LoadedClientPolicy;
use inferno_client::{Client, ClientError, Target, TrustReport};

/// Arguments of `inferno verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The server: `https://HOST:PORT`.
    server: String,
    /// The client policy (TOML): policy/client-development.toml or a filled-in
    /// policy/client-production.toml.
    #[arg(long)]
    policy: PathBuf,
    /// An offline collateral bundle (`inferno attest bundle`) for the vendor chains.
    #[arg(long)]
    collateral: Option<PathBuf>,
    /// Print the appraisal as JSON.
    #[arg(long)]
    json: bool,
    /// Verify through Oblivious HTTP (RFC 9458): the server may sit behind a TLS-terminating
    /// gateway (`https://` or `http://` origin).
    #[arg(long)]
    ohttp: bool,
    /// An Oblivious relay resource that forwards the sealed requests (with `--ohttp`).
    #[arg(long, requires = "ohttp")]
    relay: Option<String>,
}

/// Runs `inferno verify`.
pub fn run(args: VerifyArgs) -> ExitCode {
    if args.ohttp {
        return run_ohttp(&args);
    }
    let client = match load_client(&args.policy, args.collateral.as_deref()) {
        Ok(client) => client,
        Err(err) => return input_error(&err),
    };
    let target = match Target::parse(&args.server) {
        Ok(target) => target,
        Err(err) => return input_error(&err.into()),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return input_error(&anyhow::Error::from(err).context("tokio runtime")),
    };
    let (report, trusted) = match runtime.block_on(client.connect(&target)) {
        Ok(connection) => (connection.report, true),
        Err(ClientError::Rejected { report, .. }) => (*report, false),
        Err(err) => return input_error(&err.into()),
    };
    print_report(&report, &target.to_string(), trusted, args.json)
}

fn print_report(report: &TrustReport, target: &str, trusted: bool, json: bool) -> ExitCode {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        println!("server: {target}");
        print!("{report}");
    }
    if trusted {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `inferno verify --ohttp`.
fn run_ohttp(args: &VerifyArgs) -> ExitCode {
    let client = match load_ohttp_client(
        &args.policy,
        args.collateral.as_deref(),
        &args.server,
        args.relay.as_deref(),
    ) {
        Ok(client) => client,
        Err(err) => return input_error(&err),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return input_error(&anyhow::Error::from(err).context("tokio runtime")),
    };
    let (report, trusted) = match runtime.block_on(client.verify()) {
        Ok(gateway) => (gateway.report, true),
        Err(ClientError::Rejected { report, .. }) => (*report, false),
        Err(err) => return input_error(&err.into()),
    };
    print_report(&report, &client.target().to_string(), trusted, args.json)
}

/// Loads the client policy and the optional collateral bundle into an Oblivious HTTP client of
/// the gateway at `upstream` (through `relay`, when given).
pub(crate) fn load_ohttp_client(
    policy: &Path,
    collateral: Option<&Path>,
    upstream: &str,
    relay: Option<&str>,
) -> anyhow::Result<OhttpClient> {
    let policy = LoadedClientPolicy::from_file(policy)?;
    let collateral = collateral
        .map(|path| {
            CollateralBundle::from_file(path)
                .with_context(|| format!("collateral {}", path.display()))
        })
        .transpose()?;
    let target = GatewayTarget::new(upstream, relay)?;
    Ok(OhttpClient::new(policy, collateral, target)?)
}

/// Loads the client policy and the optional collateral bundle into a verifying client.
pub(crate) fn load_client(policy: &Path, collateral: Option<&Path>) -> anyhow::Result<Client> {
    let policy = LoadedClientPolicy::from_file(policy)?;
    let collateral = collateral
        .map(|path| {
            CollateralBundle::from_file(path)
                .with_context(|| format!("collateral {}", path.display()))
        })
        .transpose()?;
    Ok(Client::new(policy, collateral))
}

/// Prints the error on one line (a TOML error's snippet is folded in) and returns status 2.
fn input_error(err: &anyhow::Error) -> ExitCode {
    let text = format!("{err:#}");
    let line: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    eprintln!("error: {}", line.join(" "));
    ExitCode::from(2)
}
