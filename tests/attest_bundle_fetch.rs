//! `inferno attest bundle --fetch` against a local HTTP server standing in for AMD KDS, Intel
//! PCS and NVIDIA's RIM service and OCSP responder, at the vendors' URL paths. It serves the
//! committed simulated SEV-SNP collateral (attestation/testdata/sim) and the real collateral of
//! `../shared/attestation-vectors` (those tests skip loudly without it); the bundle built from
//! it must give the verdicts those files give when bundled by hand.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::SimulatedSnp;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::nvidia::{CcMode, GpuEvidence, certs::pem_chain};
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::runtime_data::RuntimeData;

/// One canned answer: status, headers, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// A local HTTP/1.1 server answering from a path table (query strings included in the key);
/// every POST to `/ocsp` gets `ocsp`. It records each request as `METHOD target`.
struct Mirror {
    base: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Mirror {
    fn start(routes: BTreeMap<String, Answer>, ocsp: Option<Vec<u8>>) -> Mirror {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the mirror");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                serve(stream, &routes, ocsp.as_deref(), &log);
            }
        });
        Mirror { base, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("request log").clone()
    }
}

fn serve(
    stream: TcpStream,
    routes: &BTreeMap<String, Answer>,
    ocsp: Option<&[u8]>,
    log: &Mutex<Vec<String>>,
) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
    );
    let mut length = 0usize;
    let mut content_type = String::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or_default();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "content-type" => content_type = value.trim().to_owned(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    log.lock()
        .expect("request log")
        .push(format!("{method} {target}"));
    let answer = match (method.as_str(), ocsp) {
        ("POST", Some(response))
            if target == "/ocsp"
                && content_type == "application/ocsp-request"
                && !body.is_empty() =>
        {
            (
                200,
                vec![("Content-Type".into(), "application/ocsp-response".into())],
                response.to_vec(),
            )
        }
        ("GET", _) => {
            routes
                .get(&target)
                .cloned()
                .unwrap_or((404, Vec::new(), b"not found".to_vec()))
        }
        _ => (400, Vec::new(), b"bad request".to_vec()),
    };
    let (status, headers, body) = answer;
    let mut stream = reader.into_inner();
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}

fn ok(body: Vec<u8>) -> Answer {
    (200, Vec::new(), body)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sim_file(name: &str) -> Vec<u8> {
    std::fs::read(root().join("attestation/testdata/sim").join(name)).expect("simulated collateral")
}

/// `../shared/attestation-vectors`, or `None` after a loud skip.
fn vectors() -> Option<PathBuf> {
    let dir = root().join("../shared/attestation-vectors");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: {} is absent", dir.display());
        None
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let lines: Vec<String> = STANDARD
        .encode(der)
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno")
}

/// `inferno attest bundle --out BUNDLE --fetch --evidence EVIDENCE ARGS...`.
fn fetch_bundle(bundle: &Path, evidence: &Path, args: &[&str]) -> Output {
    let mut all = vec![
        "attest",
        "bundle",
        "--out",
        path(bundle),
        "--fetch",
        "--evidence",
        path(evidence),
    ];
    all.extend_from_slice(args);
    inferno(&all)
}

/// Asserts that the command succeeded, showing its stderr otherwise.
fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The development policy with `require_crl = true`, written into `dir`.
fn strict_policy(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("policy/development.toml"))
        .expect("policy")
        .replace("require_crl = false", "require_crl = true");
    let file = dir.join("strict.toml");
    std::fs::write(&file, text).expect("write policy");
    file
}

/// The KDS paths of the simulated report (Milan CPUID, TCB of testdata/sim/vcek.der).
fn kds_routes(crl: &str) -> BTreeMap<String, Answer> {
    let chip_id = String::from_utf8(sim_file("chip_id.hex")).expect("hex");
    let mut routes = BTreeMap::new();
    let tcb = simulated_tcb_query();
    routes.insert(
        format!("/vcek/v1/Milan/{}?{tcb}", chip_id.trim()),
        ok(sim_file("vcek.der")),
    );
    let chain =
        pem("CERTIFICATE", &sim_file("ask.der")) + &pem("CERTIFICATE", &sim_file("ark.der"));
    routes.insert("/vcek/v1/Milan/cert_chain".into(), ok(chain.into_bytes()));
    if !crl.is_empty() {
        routes.insert("/vcek/v1/Milan/crl".into(), ok(sim_file(crl)));
    }
    routes
}

/// The KDS TCB query of the simulated report, from its REPORTED_TCB (Milan layout).
fn simulated_tcb_query() -> String {
    let doc = RuntimeData::new([0; 32], "inferno/test");
    let evidence =
        collect_evidence(&SimulatedSnp::new().expect("simulated SNP"), &doc).expect("collect");
    let report = &evidence.sev_snp.expect("snp").report.0;
    let tcb = u64::from_le_bytes(report[0x180..0x188].try_into().expect("8 bytes")).to_le_bytes();
    format!(
        "blSPL={:02}&teeSPL={:02}&snpSPL={:02}&ucodeSPL={:02}",
        tcb[0], tcb[1], tcb[6], tcb[7]
    )
}

#[test]
fn amd_kds_collateral_fetched_for_a_report_passes_a_policy_requiring_the_crl() {
    let work = tempfile::tempdir().expect("tempdir");
    let policy = strict_policy(work.path());
    let evidence = work.path().join("evidence.json");
    let out = inferno(&[
        "attest",
        "simulate",
        "--policy",
        path(&policy),
        "--out",
        path(&evidence),
    ]);
    assert_success(&out);
    let bundle = work.path().join("bundle.json");
    let verify = |bundle: &Path| {
        inferno(&[
            "attest",
            "verify",
            path(&evidence),
            "--policy",
            path(&policy),
            "--collateral",
            path(bundle),
            "--now",
            "2026-01-01T00:00:00Z",
        ])
    };
    let fetch =
        |mirror: &Mirror| fetch_bundle(&bundle, &evidence, &["--amd-kds-url", &mirror.base]);

    let mirror = Mirror::start(kds_routes("ark.crl.der"), None);
    let out = fetch(&mirror);
    assert_success(&out);
    assert_eq!(mirror.requests().len(), 3, "{:?}", mirror.requests());
    let fetched = CollateralBundle::from_file(&bundle).expect("bundle");
    assert_eq!(fetched.amd.vcek[0].0, sim_file("vcek.der"));
    assert_eq!(fetched.amd.intermediates[0].0, sim_file("ask.der"));
    assert_eq!(fetched.amd.ark[0].0, sim_file("ark.der"));
    assert_eq!(fetched.amd.crl[0].0, sim_file("ark.crl.der"));
    let out = verify(&bundle);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");

    // A mirror serving a CRL that revokes the ASK: the bundle is built, the verdict rejects.
    let mirror = Mirror::start(kds_routes("ark-revokes-ask.crl.der"), None);
    assert!(fetch(&mirror).status.success());
    let out = verify(&bundle);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("revoked"), "{stdout}");

    // No CRL on the mirror: one line naming the URL, and no bundle written.
    std::fs::remove_file(&bundle).expect("remove the bundle");
    let mirror = Mirror::start(kds_routes(""), None);
    let out = fetch(&mirror);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains(&format!("{}/vcek/v1/Milan/crl", mirror.base))
            && lines[0].contains("HTTP 404"),
        "{stderr}"
    );
    assert!(!bundle.exists());
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn intel_pcs_collateral_fetched_for_a_tdx_quote_equals_the_published_collateral() {
    let Some(dir) = vectors() else { return };
    let quote = dir.join("tdx/dcap-qvl/tdx_quote");
    let published: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("tdx/dcap-qvl/tdx_quote_collateral.json")).expect("collateral"),
    )
    .expect("JSON");
    let field = |name: &str| published[name].as_str().expect("string field").to_owned();
    let chain_header = |name: &str, chain: &str| (name.to_owned(), encode_uri(chain));
    let signed = |member: &str, text: &str, sig: &str| {
        format!("{{\"{member}\":{text},\"signature\":\"{sig}\"}}")
    };
    let mut routes = BTreeMap::new();
    let pck_crl = hex::decode(field("pck_crl")).expect("hex");
    for ca in ["processor", "platform"] {
        routes.insert(
            format!("/sgx/certification/v4/pckcrl?ca={ca}&encoding=der"),
            (
                200,
                vec![chain_header(
                    "SGX-PCK-CRL-Issuer-Chain",
                    &field("pck_crl_issuer_chain"),
                )],
                pck_crl.clone(),
            ),
        );
    }
    routes.insert(
        "/tdx/certification/v4/tcb?fmspc=B0C06F000000&update=standard".into(),
        (
            200,
            vec![chain_header(
                "TCB-Info-Issuer-Chain",
                &field("tcb_info_issuer_chain"),
            )],
            signed("tcbInfo", &field("tcb_info"), &field("tcb_info_signature")).into_bytes(),
        ),
    );
    routes.insert(
        "/tdx/certification/v4/qe/identity?update=standard".into(),
        (
            200,
            vec![chain_header(
                "SGX-Enclave-Identity-Issuer-Chain",
                &field("qe_identity_issuer_chain"),
            )],
            signed(
                "enclaveIdentity",
                &field("qe_identity"),
                &field("qe_identity_signature"),
            )
            .into_bytes(),
        ),
    );
    // A PCCS serves the root CA CRL as hex text.
    routes.insert(
        "/sgx/certification/v4/rootcacrl".into(),
        ok(field("root_ca_crl").into_bytes()),
    );
    let mirror = Mirror::start(routes, None);

    let work = tempfile::tempdir().expect("tempdir");
    let bundle = work.path().join("bundle.json");
    let out = fetch_bundle(
        &bundle,
        &quote,
        &["--intel-pcs-url", &format!("{}/", mirror.base)],
    );
    assert_success(&out);
    assert_eq!(mirror.requests().len(), 4, "{:?}", mirror.requests());
    let fetched = CollateralBundle::from_file(&bundle).expect("bundle");
    let intel = &fetched.intel[0];
    assert_eq!(intel.fmspc.as_deref(), Some("b0c06f000000"));
    let c = &intel.collateral;
    assert_eq!(
        c.tcb_info,
        field("tcb_info"),
        "the signed TCB info text, byte for byte"
    );
    assert_eq!(c.qe_identity, field("qe_identity"));
    assert_eq!(
        hex::encode(&c.tcb_info_signature),
        field("tcb_info_signature")
    );
    assert_eq!(hex::encode(&c.root_ca_crl), field("root_ca_crl"));
    assert_eq!(c.pck_crl_issuer_chain, field("pck_crl_issuer_chain"));
    assert!(
        c.pck_certificate_chain
            .as_deref()
            .is_some_and(|p| p.contains("BEGIN CERTIFICATE"))
    );

    // The README's verdict for this quote at 2025-07-19T10:00:34Z: UpToDate.
    let text = std::fs::read_to_string(root().join("policy/development.toml"))
        .expect("policy")
        .replace(
            "[runtime_data]\nrequired = true",
            "[runtime_data]\nrequired = false",
        );
    let policy = work.path().join("raw-quote.toml");
    std::fs::write(&policy, text).expect("write policy");
    LoadedPolicy::from_file(&policy).expect("valid policy");
    let out = inferno(&[
        "attest",
        "verify",
        path(&quote),
        "--policy",
        path(&policy),
        "--collateral",
        path(&bundle),
        "--now",
        "2025-07-19T10:00:34Z",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("UpToDate"), "{stdout}");
}

/// Percent-encodes like Intel PCS's issuer-chain headers.
fn encode_uri(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn nvidia_rims_and_ocsp_are_fetched_for_a_gpu_report() {
    let Some(dir) = vectors() else { return };
    let nv = dir.join("nvidia-h100/nvtrust");
    let read = |name: &str| std::fs::read(nv.join(name)).expect("vector");
    let report_hex = String::from_utf8(read("hopperAttestationReport.txt")).expect("text");
    let gpu = GpuEvidence {
        report: hex::decode(report_hex.trim()).expect("hex"),
        cert_chain: pem_chain(&read("hopperCertChain.txt"), "device").expect("chain"),
        cc_mode: CcMode::On,
        ready_state: false,
    };
    let doc = RuntimeData::new([0; 32], "inferno/test");
    let mut evidence: Evidence =
        collect_evidence(&SimulatedSnp::new().expect("simulated SNP"), &doc).expect("collect");
    evidence.gpu = Some(gpu.clone());
    let work = tempfile::tempdir().expect("tempdir");
    let evidence_path = work.path().join("evidence.json");
    std::fs::write(&evidence_path, evidence.to_json()).expect("write evidence");

    // RIM ids for driver 550.90.07 and VBIOS 96.00.9F.00.01 of project 1010, SKU 0200, chip 882
    // (trustee's claims for this report). The mirror has the published RIMs of the vectors.
    let rim = |file: &str| {
        ok(format!(
            "{{\"id\":\"x\",\"rim\":\"{}\"}}",
            STANDARD.encode(read(file))
        )
        .into_bytes())
    };
    let mut routes = kds_routes("ark.crl.der");
    routes.insert(
        "/v1/rim/NV_GPU_DRIVER_GH100_550.90.07".into(),
        rim("Driver_RIM_test_no_gpu.swidtag"),
    );
    routes.insert(
        "/v1/rim/NV_GPU_VBIOS_1010_0200_882_96009F0001".into(),
        rim("1010_0200_882_96005E0001_PROD.swidtag"),
    );
    // No NVIDIA-signed OCSP response is among the vectors: the mirror answers every request
    // with one response for another hierarchy (the simulated GPU's).
    let sim = inferno_attestation::nvidia::simulated::SimulatedGpu::new(
        inferno_attestation::nvidia::simulated::TEST_SEED,
        Default::default(),
    )
    .expect("simulated GPU");
    let other = sim
        .ocsp_response(&inferno_attestation::nvidia::simulated::SimulatedOcsp {
            subject: inferno_attestation::nvidia::simulated::SimulatedCert::Ica,
            revoked: None,
            this_update: time::macros::datetime!(2024-12-31 0:00 UTC),
            next_update: time::macros::datetime!(2025-01-07 0:00 UTC),
            signer: inferno_attestation::nvidia::simulated::SimulatedCert::Root,
        })
        .expect("OCSP response");
    let mirror = Mirror::start(routes, Some(other));
    let bundle = work.path().join("bundle.json");
    let ocsp_url = format!("{}/ocsp", mirror.base);
    let out = fetch_bundle(
        &bundle,
        &evidence_path,
        &[
            "--amd-kds-url",
            &mirror.base,
            "--nvidia-rim-url",
            &mirror.base,
            "--nvidia-ocsp-url",
            &ocsp_url,
        ],
    );
    assert_success(&out);
    let requests = mirror.requests();
    let fetched = CollateralBundle::from_file(&bundle).expect("bundle");
    assert_eq!(fetched.nvidia.rims.len(), 2);
    assert_eq!(
        fetched.nvidia.rims[0].data.0,
        read("Driver_RIM_test_no_gpu.swidtag")
    );
    assert_eq!(
        fetched.nvidia.rims[1].data.0,
        read("1010_0200_882_96005E0001_PROD.swidtag")
    );
    // OCSP: device certificates 1 to 3 (of 5), and each RIM's chain from its signer, roots excepted.
    let posts = requests
        .iter()
        .filter(|r| r.starts_with("POST /ocsp"))
        .count();
    assert!(posts >= 3 + 2, "{requests:?}");
    assert_eq!(fetched.nvidia.ocsp.len(), posts);
    assert!(
        fetched
            .nvidia
            .ocsp
            .iter()
            .any(|b| b.name == "ocsp-device-1.der")
    );
    assert!(
        !fetched
            .nvidia
            .ocsp
            .iter()
            .any(|b| b.name == "ocsp-device-0.der")
    );

    // The verdicts the bundled files give: the PROD VBIOS RIM's signature verifies at
    // 2025-01-01, while neither RIM is for this report and no response covers NVIDIA's chain.
    let trust = inferno_attestation::nvidia::GpuTrust::nvidia().expect("NVIDIA roots");
    let now = time::macros::datetime!(2025-01-01 0:00 UTC);
    inferno_attestation::nvidia::verify_rim(
        &fetched.nvidia.rims[1].data.0,
        inferno_attestation::nvidia::rim::RimKind::Vbios,
        &trust.rim_roots,
        now,
    )
    .expect("the fetched VBIOS RIM verifies");
    let responses = inferno_attestation::ocsp::OcspResponses::parse(
        fetched
            .nvidia
            .ocsp
            .iter()
            .map(|b| (b.name.as_str(), b.data.0.as_slice())),
    )
    .expect("the fetched responses parse");
    let outcomes = inferno_attestation::ocsp::check_chain(
        &responses,
        &gpu.cert_chain,
        1,
        now,
        time::Duration::days(30),
        "device",
    )
    .expect("chain parses");
    assert_eq!(outcomes.len(), 3);
    for outcome in outcomes {
        assert!(
            matches!(
                outcome.status,
                Err(inferno_attestation::ocsp::OcspError::Missing { .. })
            ),
            "{outcome:?}"
        );
    }
}
