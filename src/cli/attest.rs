//! `inferno attest`: verify attestation evidence offline, build collateral bundles, and produce
//! simulated evidence for development.
//!
//! `verify` exits 0 when the evidence passes the policy, 1 when it is rejected and 2 on a usage
//! or parse error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use inferno_attestation::abi::snp::Product;
use inferno_attestation::appraise::{
    AppraisalInput, Expectations, StandaloneInput, appraise_standalone, appraise_with,
};
use inferno_attestation::bundle::{
    CollateralBundle, IntelCollateral, NamedBlob, QuoteCollateralV3, RimComponent, RimFile,
};
use inferno_attestation::evidence::{AnyEvidence, Base64Bytes, Evidence};
use inferno_attestation::fetch;
use inferno_attestation::pki;
use inferno_attestation::policy::LoadedPolicy;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Arguments of `inferno attest`.
#[derive(Debug, clap::Args)]
pub struct AttestArgs {
    #[command(subcommand)]
    command: AttestCommand,
}

#[derive(Debug, clap::Subcommand)]
enum AttestCommand {
    /// Verify evidence against a policy: a JSON envelope (CPU-TEE evidence, or standalone vTPM
    /// or GPU evidence), or a raw or hex SNP report or TDX quote.
    Verify(Box<VerifyArgs>),
    /// Build an offline collateral bundle from vendor files and, with `--fetch`, from the
    /// vendors' services.
    Bundle(Box<BundleArgs>),
    /// Produce simulated SEV-SNP (and GPU) evidence (test keys; only a development policy accepts it).
    Simulate(Box<SimulateArgs>),
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    /// The evidence file.
    evidence: PathBuf,
    /// The policy file (TOML).
    #[arg(long)]
    policy: PathBuf,
    /// The offline collateral bundle.
    #[arg(long)]
    collateral: Option<PathBuf>,
    /// The time to judge at (RFC 3339); defaults to the system clock.
    #[arg(long)]
    now: Option<String>,
    /// The nonce the verifier chose (hex): the vTPM quotes' qualifying data and the GPU
    /// reports' SPDM nonce when the evidence has no runtime-data document (required for
    /// standalone evidence), else a challenge the runtime data's `challenge_bindings` must bind.
    #[arg(long, value_name = "HEX", conflicts_with = "no_freshness")]
    nonce: Option<String>,
    /// Appraise evidence that carries no nonce (vTPM quotes or GPU reports taken without one):
    /// the verdict says NOT FRESH and fails unless the policy sets
    /// `[time] allow_unfresh_evidence = true` (offline audit).
    #[arg(long)]
    no_freshness: bool,
    /// The TLS exporter value (hex) of the connection the evidence was asked for on: with
    /// `--nonce`, the challenge binding covers both (docs/attestation-protocol.md).
    #[arg(long, value_name = "HEX", requires = "nonce")]
    tls_exporter: Option<String>,
    /// A root (DER or PEM) for the AK certificate chain of standalone vTPM evidence; repeatable.
    #[arg(long, value_name = "FILE")]
    tpm_root: Vec<PathBuf>,
    /// Print the appraisal as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct BundleArgs {
    /// Where to write the bundle.
    #[arg(long, short)]
    out: PathBuf,
    /// A VCEK certificate (DER or PEM); repeatable.
    #[arg(long)]
    vcek: Vec<PathBuf>,
    /// A VLEK certificate (DER or PEM); repeatable.
    #[arg(long)]
    vlek: Vec<PathBuf>,
    /// An ASK or ASVK certificate, or a KDS cert_chain PEM (ASK then ARK); repeatable.
    #[arg(long)]
    amd_chain: Vec<PathBuf>,
    /// An AMD CRL (DER or PEM); repeatable.
    #[arg(long)]
    amd_crl: Vec<PathBuf>,
    /// Intel collateral in dcap-qvl's QuoteCollateralV3 JSON layout; repeatable.
    #[arg(long)]
    tdx_collateral: Vec<PathBuf>,
    /// An NVIDIA driver RIM (SWID tag); repeatable.
    #[arg(long)]
    driver_rim: Vec<PathBuf>,
    /// An NVIDIA VBIOS RIM (SWID tag); repeatable.
    #[arg(long)]
    vbios_rim: Vec<PathBuf>,
    /// A DER OCSP response; repeatable.
    #[arg(long)]
    ocsp: Vec<PathBuf>,
    /// Also fetch what `--evidence` needs from AMD KDS, Intel PCS and NVIDIA's RIM service and
    /// OCSP responder (a connected machine only; verification never fetches).
    #[arg(long, requires = "evidence")]
    fetch: bool,
    /// The evidence to fetch collateral for (JSON envelope, SNP report or TDX quote).
    #[arg(long)]
    evidence: Option<PathBuf>,
    /// The SEV-SNP product (Milan, Genoa, Turin) for version-2 reports, which do not name it.
    #[arg(long)]
    amd_product: Option<String>,
    /// Base URL of AMD KDS (or a mirror).
    #[arg(long, default_value = fetch::AMD_KDS_URL)]
    amd_kds_url: String,
    /// Base URL of Intel PCS, or of a PCCS speaking the v4 API.
    #[arg(long, default_value = fetch::INTEL_PCS_URL)]
    intel_pcs_url: String,
    /// Base URL of NVIDIA's RIM service (or a mirror).
    #[arg(long, default_value = fetch::NVIDIA_RIM_URL)]
    nvidia_rim_url: String,
    /// URL of NVIDIA's OCSP responder (or a mirror).
    #[arg(long, default_value = fetch::NVIDIA_OCSP_URL)]
    nvidia_ocsp_url: String,
}

#[derive(Debug, clap::Args)]
struct SimulateArgs {
    /// The server policy whose digest the runtime data names.
    #[arg(long)]
    policy: PathBuf,
    /// A verifier nonce (hex) whose challenge binding the runtime data carries.
    #[arg(long)]
    nonce: Option<String>,
    /// The TLS exporter value (hex) that the challenge binding covers with the nonce.
    #[arg(long, value_name = "HEX", requires = "nonce")]
    tls_exporter: Option<String>,
    /// Also include evidence from a simulated GPU (its test chain).
    #[arg(long)]
    gpu: bool,
    /// Where to write the evidence envelope (stdout when absent).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// Exit status for a usage or parse error.
const EXIT_USAGE: u8 = 2;

/// Runs `inferno attest`.
pub fn run(args: AttestArgs) -> ExitCode {
    match args.command {
        AttestCommand::Verify(a) => verify(&a),
        AttestCommand::Bundle(a) => match bundle(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => usage_error(&e),
        },
        AttestCommand::Simulate(a) => match simulate(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => super::fail(&e),
        },
    }
}

fn usage_error(err: &anyhow::Error) -> ExitCode {
    eprintln!("error: {err:#}");
    ExitCode::from(EXIT_USAGE)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn verify(args: &VerifyArgs) -> ExitCode {
    let inputs = (|| -> anyhow::Result<_> {
        let evidence = AnyEvidence::from_bytes(&read(&args.evidence)?)
            .with_context(|| format!("evidence {}", args.evidence.display()))?;
        let policy = LoadedPolicy::from_file(&args.policy)
            .with_context(|| format!("policy {}", args.policy.display()))?;
        let collateral = args
            .collateral
            .as_deref()
            .map(|p| {
                CollateralBundle::from_file(p)
                    .with_context(|| format!("collateral {}", p.display()))
            })
            .transpose()?;
        let now = match &args.now {
            Some(text) => OffsetDateTime::parse(text, &Rfc3339)
                .with_context(|| format!("--now {text:?} is not an RFC 3339 time"))?,
            None => OffsetDateTime::now_utc(),
        };
        let nonce = args
            .nonce
            .as_deref()
            .map(|text| {
                hex::decode(text.trim())
                    .ok()
                    .filter(|n| !n.is_empty())
                    .with_context(|| format!("--nonce {text:?} is not non-empty hex"))
            })
            .transpose()?;
        let tls_exporter = args
            .tls_exporter
            .as_deref()
            .map(|text| {
                hex::decode(text.trim())
                    .with_context(|| format!("--tls-exporter {text:?} is not hex"))
            })
            .transpose()?;
        let mut tpm_roots = Vec::new();
        for p in &args.tpm_root {
            tpm_roots.extend(certificate(p)?);
        }
        Ok((
            evidence,
            policy,
            collateral,
            now,
            nonce,
            tls_exporter,
            tpm_roots,
        ))
    })();
    let (evidence, policy, collateral, now, nonce, tls_exporter, tpm_roots) = match inputs {
        Ok(v) => v,
        Err(e) => return usage_error(&e),
    };
    let expected = Expectations {
        nonce: nonce.as_deref(),
        tls_exporter: tls_exporter.as_deref(),
        no_freshness: args.no_freshness,
    };
    let report = match &evidence {
        AnyEvidence::Platform(evidence) => appraise_with(
            &AppraisalInput {
                evidence,
                policy: &policy,
                collateral: collateral.as_ref(),
                now,
                clock_floor: None,
                gpu_ready_pending: false,
            },
            &expected,
        ),
        AnyEvidence::Standalone(evidence) => appraise_standalone(
            &StandaloneInput {
                evidence,
                policy: &policy,
                collateral: collateral.as_ref(),
                now,
                tpm_roots: &tpm_roots,
            },
            &expected,
        ),
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => return usage_error(&anyhow::anyhow!("cannot serialise the appraisal: {e}")),
        }
    } else {
        print!("{report}");
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn certificate(path: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let bytes = read(path)?;
    let what = path.display().to_string();
    let ders = if bytes.starts_with(b"-----BEGIN") {
        pki::pem_blocks(&bytes, &what)?
    } else {
        vec![bytes]
    };
    for der in &ders {
        pki::parse_certificate(der, &what)?;
    }
    Ok(ders)
}

fn bundle(args: &BundleArgs) -> anyhow::Result<()> {
    let created = OffsetDateTime::now_utc().format(&Rfc3339)?;
    let mut out = CollateralBundle::empty(created);
    for p in &args.vcek {
        out.amd
            .vcek
            .extend(certificate(p)?.into_iter().map(Base64Bytes));
    }
    for p in &args.vlek {
        out.amd
            .vlek
            .extend(certificate(p)?.into_iter().map(Base64Bytes));
    }
    for p in &args.amd_chain {
        // Self-signed certificates are ARKs, trusted only if built in or named by a policy, so
        // keeping them is harmless.
        let what = p.display().to_string();
        fetch::amd::add_cert_chain(&mut out.amd, certificate(p)?, &what)?;
    }
    for p in &args.amd_crl {
        let bytes = read(p)?;
        let what = p.display().to_string();
        let ders = if bytes.starts_with(b"-----BEGIN") {
            pki::pem_blocks(&bytes, &what)?
        } else {
            vec![bytes]
        };
        for der in ders {
            pki::parse_crl(&der, &what)?;
            out.amd.crl.push(Base64Bytes(der));
        }
    }
    for p in &args.tdx_collateral {
        let collateral: QuoteCollateralV3 = serde_json::from_slice(&read(p)?)
            .with_context(|| format!("{} is not QuoteCollateralV3 JSON", p.display()))?;
        out.intel.push(IntelCollateral {
            fmspc: tcb_info_fmspc(&collateral.tcb_info),
            collateral,
        });
    }
    let file_name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    for (component, paths) in [
        (RimComponent::Driver, &args.driver_rim),
        (RimComponent::Vbios, &args.vbios_rim),
    ] {
        for p in paths {
            out.nvidia.rims.push(RimFile {
                name: file_name(p),
                component,
                data: Base64Bytes(read(p)?),
            });
        }
    }
    for p in &args.ocsp {
        out.nvidia.ocsp.push(NamedBlob {
            name: file_name(p),
            data: Base64Bytes(read(p)?),
        });
    }
    if args.fetch {
        fetch_collateral(args, &mut out)?;
    }
    std::fs::write(&args.out, out.to_json())
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!("wrote collateral bundle {}", args.out.display());
    Ok(())
}

/// Fetches what `--evidence` needs into `out`, printing each item fetched.
fn fetch_collateral(args: &BundleArgs, out: &mut CollateralBundle) -> anyhow::Result<()> {
    let path = args
        .evidence
        .as_deref()
        .context("--fetch needs --evidence")?;
    let evidence = Evidence::from_bytes(&read(path)?)
        .with_context(|| format!("evidence {}", path.display()))?;
    let amd_product = args
        .amd_product
        .as_deref()
        .map(|name| {
            Product::from_name(name)
                .with_context(|| format!("--amd-product {name:?} is not Milan, Genoa or Turin"))
        })
        .transpose()?;
    let options = fetch::FetchOptions {
        urls: fetch::VendorUrls {
            amd_kds: args.amd_kds_url.clone(),
            intel_pcs: args.intel_pcs_url.clone(),
            nvidia_rim: args.nvidia_rim_url.clone(),
            nvidia_ocsp: args.nvidia_ocsp_url.clone(),
        },
        amd_product,
    };
    let log = fetch::fetch_for_evidence(&fetch::Http::default(), &evidence, &options, out)?;
    for line in log {
        eprintln!("fetched {line}");
    }
    Ok(())
}

fn tcb_info_fmspc(tcb_info: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(tcb_info).ok()?;
    value.get("fmspc")?.as_str().map(str::to_ascii_lowercase)
}

#[cfg(feature = "simulated-tee")]
fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    use inferno_attestation::collect::{collect_evidence, simulated::SimulatedSnp};
    use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
    use inferno_attestation::runtime_data::{RuntimeData, challenge_binding};

    let policy = LoadedPolicy::from_file(&args.policy)?;
    let mut doc = RuntimeData::new(
        policy.digest,
        concat!("inferno/", env!("CARGO_PKG_VERSION")),
    );
    if let Some(nonce) = &args.nonce {
        let nonce =
            hex::decode(nonce.trim()).with_context(|| format!("--nonce {nonce:?} is not hex"))?;
        let exporter = match &args.tls_exporter {
            Some(text) => hex::decode(text.trim())
                .with_context(|| format!("--tls-exporter {text:?} is not hex"))?,
            None => Vec::new(),
        };
        doc.set_challenge_bindings([challenge_binding(&nonce, &exporter)])?;
    }
    let sim = SimulatedSnp::new()?;
    let mut evidence = collect_evidence(&sim, &doc)?;
    if args.gpu {
        let gpu = SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default())?;
        evidence.gpu = Some(gpu.evidence(&doc.gpu_nonce())?);
    }
    match &args.out {
        Some(path) => std::fs::write(path, evidence.to_json())
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{}", evidence.to_json()),
    }
    Ok(())
}

#[cfg(not(feature = "simulated-tee"))]
fn simulate(_args: &SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "inferno attest simulate needs the simulated TEE, which this build leaves out (built without the `simulated-tee` feature)"
    )
}
