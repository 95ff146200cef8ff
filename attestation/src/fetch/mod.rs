//! Fetching collateral from the vendors' services (feature `fetch`), for `inferno attest
//! bundle --fetch` on a connected machine: AMD KDS ([`amd`]), Intel PCS v4 ([`intel`]), and
//! NVIDIA's RIM service and OCSP responder ([`nvidia`]). Verification never calls this; it
//! reads the resulting bundle offline.
//!
//! Every base URL is a parameter ([`VendorUrls`]) so that an on-site mirror can stand in for
//! the vendor. Any failure is one [`FetchError`] naming the URL.

pub mod amd;
pub mod intel;
pub mod nvidia;

use std::time::Duration;

use crate::bundle::CollateralBundle;
use crate::evidence::Evidence;

/// AMD's Key Distribution Service.
pub const AMD_KDS_URL: &str = "https://kdsintf.amd.com";
/// Intel's Provisioning Certification Service (v4 API below it).
pub const INTEL_PCS_URL: &str = "https://api.trustedservices.intel.com";
/// NVIDIA's RIM service.
pub const NVIDIA_RIM_URL: &str = "https://rim.attestation.nvidia.com";
/// NVIDIA's OCSP responder (the AIA of the GPU and RIM chains).
pub const NVIDIA_OCSP_URL: &str = "https://ocsp.ndis.nvidia.com";

/// The largest response body accepted (the largest collateral item is a RIM of a few hundred
/// KiB).
const MAX_BODY: u64 = 16 << 20;
/// Time limit of one request.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request failed or the service answered with an error status.
    #[error("fetching {url}: {reason}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong (transport error, or `HTTP 404`).
        reason: String,
    },
    /// The service answered with something that is not the expected collateral.
    #[error("{url}: {reason}")]
    Content {
        /// The URL.
        url: String,
        /// What is wrong with the answer.
        reason: String,
    },
    /// The evidence lacks what is needed to know what to fetch.
    #[error("cannot tell what to fetch: {0}")]
    Evidence(String),
}

/// The base URLs of the services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorUrls {
    /// AMD KDS.
    pub amd_kds: String,
    /// Intel PCS (or a PCCS speaking the v4 API).
    pub intel_pcs: String,
    /// NVIDIA RIM service.
    pub nvidia_rim: String,
    /// NVIDIA OCSP responder.
    pub nvidia_ocsp: String,
}

impl Default for VendorUrls {
    fn default() -> Self {
        Self {
            amd_kds: AMD_KDS_URL.to_owned(),
            intel_pcs: INTEL_PCS_URL.to_owned(),
            nvidia_rim: NVIDIA_RIM_URL.to_owned(),
            nvidia_ocsp: NVIDIA_OCSP_URL.to_owned(),
        }
    }
}

/// What to fetch for, besides the evidence.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// The base URLs.
    pub urls: VendorUrls,
    /// The SEV-SNP product, for reports (version 2) that do not name it through CPUID.
    pub amd_product: Option<crate::abi::snp::Product>,
}

/// A successful response: its headers and body.
#[derive(Debug)]
pub struct Response {
    /// The body.
    pub body: Vec<u8>,
    headers: Vec<(String, String)>,
}

impl Response {
    /// A header's value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A blocking HTTP client (ureq with rustls) that turns every failure into a [`FetchError`].
#[derive(Debug, Clone)]
pub struct Http {
    agent: ureq::Agent,
}

impl Default for Http {
    fn default() -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        Self { agent }
    }
}

impl Http {
    /// GET `url`; a non-2xx status is an error.
    pub fn get(&self, url: &str) -> Result<Response, FetchError> {
        tracing::info!(url, "fetching");
        let response = self.agent.get(url).call();
        Self::finish(url, response)
    }

    /// POST `body` with `content_type` to `url`; a non-2xx status is an error.
    pub fn post(&self, url: &str, content_type: &str, body: &[u8]) -> Result<Response, FetchError> {
        tracing::info!(url, "posting");
        let response = self
            .agent
            .post(url)
            .header("Content-Type", content_type)
            .send(body);
        Self::finish(url, response)
    }

    fn finish(
        url: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Response, FetchError> {
        let http = |reason: String| FetchError::Http {
            url: url.to_owned(),
            reason,
        };
        let mut response = response.map_err(|e| http(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(http(format!("HTTP {}", status.as_u16())));
        }
        let headers = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| http(format!("reading the body: {e}")))?;
        Ok(Response { body, headers })
    }
}

/// Joins a base URL and a path with exactly one slash.
fn join(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// What was fetched, one line per item, for the CLI to print.
pub type FetchLog = Vec<String>;

/// Fetches everything `evidence` needs into `bundle`: the VCEK, cert_chain and CRL for an SNP
/// report; PCS collateral for a TDX quote; the RIMs and OCSP responses for a GPU section.
pub fn fetch_for_evidence(
    http: &Http,
    evidence: &Evidence,
    options: &FetchOptions,
    bundle: &mut CollateralBundle,
) -> Result<FetchLog, FetchError> {
    let mut log = Vec::new();
    if let Some(snp) = &evidence.sev_snp {
        amd::fetch(http, &snp.report.0, options, &mut bundle.amd, &mut log)?;
    }
    if let Some(tdx) = &evidence.tdx {
        bundle.intel.push(intel::fetch(
            http,
            &tdx.quote.0,
            &options.urls.intel_pcs,
            &mut log,
        )?);
    }
    if let Some(gpu) = &evidence.gpu {
        nvidia::fetch(http, gpu, &options.urls, &mut bundle.nvidia, &mut log)?;
    }
    if log.is_empty() {
        return Err(FetchError::Evidence(
            "the evidence has no SEV-SNP, TDX or GPU section".into(),
        ));
    }
    Ok(log)
}
