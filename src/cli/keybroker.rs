//! `inferno keybroker`: release sealed models' keys to appliances whose evidence passes the
//! release policy, auditing every release and refusal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use inferno_audit::{AuditConfig, AuditSink, ContentMode};

use crate::keybroker::server::{self, DEFAULT_CHALLENGE_TTL, PUBLIC_FILE};
use crate::keybroker::{Broker, ReleasePolicy};

/// Arguments of `inferno keybroker`.
#[derive(Debug, clap::Args)]
pub struct KeybrokerArgs {
    /// The address to listen on (plain HTTP: the released key is HPKE-sealed to the
    /// appliance's attested ephemeral key, so the channel needs no confidentiality).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The broker's key directory: `broker.key` (0600) and `broker.pub` (the key models are
    /// sealed to, `inferno seal --recipient DIR/broker.pub`); created when absent.
    #[arg(long, value_name = "DIR")]
    keys: PathBuf,
    /// The release policy (TOML; docs/sealed-model.md "Key broker").
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// The broker's audit log directory (verify it with `inferno audit verify DIR`).
    #[arg(long, value_name = "DIR")]
    audit: PathBuf,
    /// How long a challenge stays valid, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_CHALLENGE_TTL.as_secs())]
    challenge_ttl: u64,
}

/// Runs `inferno keybroker` until SIGTERM or SIGINT.
pub fn run(args: KeybrokerArgs) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return super::fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(keybroker(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

async fn keybroker(args: KeybrokerArgs) -> anyhow::Result<()> {
    if args.challenge_ttl == 0 {
        anyhow::bail!("--challenge-ttl must be at least 1 second");
    }
    let policy = ReleasePolicy::from_file(&args.policy)?;
    let digest = policy.digest.clone();
    let ids: Vec<&str> = policy.models.iter().map(|m| m.id.as_str()).collect();
    let models = if ids.is_empty() {
        "none (every request is refused)".to_owned()
    } else {
        ids.join(", ")
    };
    let (secret, public, created) = server::load_or_create_keys(&args.keys)?;
    let audit = AuditSink::open(
        &AuditConfig {
            dir: args.audit.clone(),
            ..AuditConfig::default()
        },
        ContentMode::None,
        &format!("inferno-keybroker/{}", env!("CARGO_PKG_VERSION")),
    )
    .with_context(|| format!("cannot open the audit log {}", args.audit.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let broker = Arc::new(Broker::new(
        secret,
        policy,
        audit,
        Duration::from_secs(args.challenge_ttl),
    ));
    eprintln!(
        "inferno keybroker {version} ready\n  public key:  {public} ({keyfile}{new})\n  policy:      SHA-256 {digest}\n  models:      {models}\n  audit log:   {audit}\n  listening:   http://{addr}",
        version = env!("CARGO_PKG_VERSION"),
        public = public.to_hex(),
        keyfile = args.keys.join(PUBLIC_FILE).display(),
        new = if created { ", new" } else { "" },
        audit = args.audit.display(),
    );
    let shutdown = async {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => std::future::pending().await,
        }
    };
    let served = server::serve(listener, Arc::clone(&broker), shutdown).await;
    let closed = broker.audit().shutdown("key broker stopped").await;
    served.context("the listener failed")?;
    closed.context("closing the audit log")?;
    Ok(())
}
