//! NVIDIA: the driver and VBIOS RIMs named by a GPU report (RIM service
//! `{base}/v1/rim/{id}`, JSON with the SWID tag in base64), and an OCSP response (RFC 6960 POST,
//! SHA-384 CertID) for every certificate the appraisal's `gpu.ocsp` check covers: the device
//! chain from its second certificate and each RIM's signing chain from its signer, roots
//! excepted.
//!
//! RIM ids follow NVIDIA's naming for Hopper: `NV_GPU_DRIVER_GH100_{driver version}` and
//! `NV_GPU_VBIOS_{project}_{project SKU}_{chip SKU}_{VBIOS version without dots}`.

use der::{Decode as _, Encode as _};
use x509_ocsp::Request;
use x509_ocsp::builder::OcspRequestBuilder;

use super::{FetchError, FetchLog, Http, VendorUrls, join};
use crate::bundle::{NamedBlob, NvidiaCollateral, RimComponent, RimFile};
use crate::evidence::Base64Bytes;
use crate::nvidia::GpuEvidence;
use crate::nvidia::opaque::{FIELD_CHIP_SKU, FIELD_PROJECT, FIELD_PROJECT_SKU, OpaqueData};
use crate::nvidia::rim::{ParsedRim, RimKind};
use crate::nvidia::spdm::SpdmReport;
use crate::ocsp::OcspResponses;

/// The RIM ids of the driver and VBIOS a GPU report names.
pub fn rim_ids(gpu: &GpuEvidence) -> Result<[(RimKind, String); 2], FetchError> {
    let bad = |e: crate::nvidia::GpuError| FetchError::Evidence(format!("GPU report: {e}"));
    let report = SpdmReport::parse(&gpu.report).map_err(bad)?;
    let opaque = OpaqueData::parse(report.opaque).map_err(bad)?;
    let field = |kind: u16, name: &str| {
        opaque
            .text(kind)
            .map(|t| t.trim_end_matches('\0').to_ascii_uppercase())
            .ok_or_else(|| FetchError::Evidence(format!("the GPU report has no {name}")))
    };
    let driver = opaque.driver_version().map_err(bad)?;
    let vbios = opaque
        .vbios_version()
        .map_err(bad)?
        .replace('.', "")
        .to_ascii_uppercase();
    Ok([
        (RimKind::Driver, format!("NV_GPU_DRIVER_GH100_{driver}")),
        (
            RimKind::Vbios,
            format!(
                "NV_GPU_VBIOS_{}_{}_{}_{vbios}",
                field(FIELD_PROJECT, "project")?,
                field(FIELD_PROJECT_SKU, "project SKU")?,
                field(FIELD_CHIP_SKU, "chip SKU")?
            ),
        ),
    ])
}

/// Fetches the RIMs and the OCSP responses for `gpu` into `nvidia`.
pub fn fetch(
    http: &Http,
    gpu: &GpuEvidence,
    urls: &VendorUrls,
    nvidia: &mut NvidiaCollateral,
    log: &mut FetchLog,
) -> Result<(), FetchError> {
    let mut chains = vec![("device".to_owned(), gpu.cert_chain.clone(), 1)];
    for (kind, id) in rim_ids(gpu)? {
        let url = join(&urls.nvidia_rim, &format!("v1/rim/{id}"));
        let xml = rim_xml(&http.get(&url)?.body).map_err(|reason| FetchError::Content {
            url: url.clone(),
            reason,
        })?;
        let parsed = ParsedRim::parse(&xml, kind).map_err(|e| FetchError::Content {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        chains.push((format!("{}-rim", kind.name()), parsed.signer_chain, 0));
        nvidia.rims.push(RimFile {
            name: format!("{id}.swidtag"),
            component: match kind {
                RimKind::Driver => RimComponent::Driver,
                RimKind::Vbios => RimComponent::Vbios,
            },
            data: Base64Bytes(xml),
        });
        log.push(format!("NVIDIA {} RIM {id}: {url}", kind.name()));
    }
    for (name, chain, first) in chains {
        for index in first..chain.len().saturating_sub(1) {
            let request = ocsp_request(&chain[index], &chain[index + 1]).map_err(|reason| {
                FetchError::Evidence(format!("{name} certificate {index}: {reason}"))
            })?;
            let url = &urls.nvidia_ocsp;
            let body = http.post(url, "application/ocsp-request", &request)?.body;
            let blob_name = format!("ocsp-{name}-{index}.der");
            OcspResponses::parse([(blob_name.as_str(), body.as_slice())]).map_err(|e| {
                FetchError::Content {
                    url: url.clone(),
                    reason: e.to_string(),
                }
            })?;
            nvidia.ocsp.push(NamedBlob {
                name: blob_name,
                data: Base64Bytes(body),
            });
            log.push(format!("NVIDIA OCSP for {name} certificate {index}: {url}"));
        }
    }
    Ok(())
}

/// The SWID tag from a RIM service answer: JSON whose `rim` member is the base64 XML.
fn rim_xml(body: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let rim = value
        .get("rim")
        .and_then(serde_json::Value::as_str)
        .ok_or("no `rim` string member")?;
    base64::engine::general_purpose::STANDARD
        .decode(rim.as_bytes())
        .map_err(|e| format!("`rim` is not base64: {e}"))
}

/// A DER OCSPRequest for `cert` issued by `issuer` (SHA-384 CertID).
fn ocsp_request(cert: &[u8], issuer: &[u8]) -> Result<Vec<u8>, String> {
    let cert = x509_cert::Certificate::from_der(cert).map_err(|e| e.to_string())?;
    let issuer = x509_cert::Certificate::from_der(issuer).map_err(|e| e.to_string())?;
    let request = Request::from_cert::<sha2::Sha384>(&issuer, &cert).map_err(|e| e.to_string())?;
    OcspRequestBuilder::default()
        .with_request(request)
        .build()
        .to_der()
        .map_err(|e| e.to_string())
}
