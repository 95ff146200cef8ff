//! AMD KDS: the VCEK for a report's chip and reported TCB, the product's cert_chain (ASK and
//! ARK) and its CRL, under `{base}/vcek/v1/{product}/`.

use super::{FetchError, FetchLog, FetchOptions, Http, join};
use crate::abi::snp::{Product, SigningKey, SnpReport};
use crate::bundle::AmdCollateral;
use crate::evidence::Base64Bytes;
use crate::pki;

/// The KDS paths for one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdsPaths {
    /// `vcek/v1/{product}/{hwid}?blSPL=..&teeSPL=..&snpSPL=..&ucodeSPL=..` (and `fmcSPL` on
    /// Turin, whose hwID is the first 8 bytes of CHIP_ID).
    pub vcek: String,
    /// `vcek/v1/{product}/cert_chain`.
    pub cert_chain: String,
    /// `vcek/v1/{product}/crl`.
    pub crl: String,
}

impl KdsPaths {
    /// The paths for `report`, whose product comes from CPUID (version 3 and later) or else
    /// from `product`.
    pub fn for_report(report: &SnpReport, product: Option<Product>) -> Result<Self, FetchError> {
        if report.signing_key() != SigningKey::Vcek {
            return Err(FetchError::Evidence(
                "the SNP report is not VCEK-signed; VLEK certificates come from the cloud provider, not from KDS (pass them with --vlek)".into(),
            ));
        }
        let product = report.product_from_cpuid().or(product).ok_or_else(|| {
            FetchError::Evidence(format!(
                "the SNP report (version {}) does not name its product; pass --amd-product Milan, Genoa or Turin",
                report.version()
            ))
        })?;
        let tcb = product.decode_tcb(report.reported_tcb_raw());
        let chip_id = report.chip_id();
        let hwid = if product.turin_tcb_layout() {
            hex::encode(&chip_id[..8])
        } else {
            hex::encode(chip_id)
        };
        let mut query = format!(
            "blSPL={:02}&teeSPL={:02}&snpSPL={:02}&ucodeSPL={:02}",
            tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode
        );
        if let Some(fmc) = tcb.fmc {
            query = format!("fmcSPL={fmc:02}&{query}");
        }
        let name = product.name();
        Ok(Self {
            vcek: format!("vcek/v1/{name}/{hwid}?{query}"),
            cert_chain: format!("vcek/v1/{name}/cert_chain"),
            crl: format!("vcek/v1/{name}/crl"),
        })
    }
}

/// Adds KDS cert_chain certificates: self-signed ones (ARKs, trusted only when built in or
/// named by a policy) to `ark`, the others (ASK, ASVK) to `intermediates`.
pub fn add_cert_chain(
    amd: &mut AmdCollateral,
    ders: Vec<Vec<u8>>,
    what: &str,
) -> Result<(), pki::PkiError> {
    for der in ders {
        let cert = pki::parse_certificate(&der, what)?;
        if cert.subject().as_raw() == cert.issuer().as_raw() {
            amd.ark.push(Base64Bytes(der));
        } else {
            amd.intermediates.push(Base64Bytes(der));
        }
    }
    Ok(())
}

/// Fetches the VCEK, cert_chain and CRL for the SNP `report` bytes into `amd`.
pub fn fetch(
    http: &Http,
    report: &[u8],
    options: &FetchOptions,
    amd: &mut AmdCollateral,
    log: &mut FetchLog,
) -> Result<(), FetchError> {
    let report =
        SnpReport::parse(report).map_err(|e| FetchError::Evidence(format!("SNP report: {e}")))?;
    let paths = KdsPaths::for_report(&report, options.amd_product)?;
    let base = &options.urls.amd_kds;
    let content = |url: &str, e: pki::PkiError| FetchError::Content {
        url: url.to_owned(),
        reason: e.to_string(),
    };

    let url = join(base, &paths.vcek);
    let vcek = http.get(&url)?.body;
    pki::parse_certificate(&vcek, "VCEK").map_err(|e| content(&url, e))?;
    amd.vcek.push(Base64Bytes(vcek));
    log.push(format!("AMD VCEK: {url}"));

    let url = join(base, &paths.cert_chain);
    let pem = http.get(&url)?.body;
    let ders = pki::pem_blocks(&pem, "KDS cert_chain").map_err(|e| content(&url, e))?;
    add_cert_chain(amd, ders, "KDS cert_chain").map_err(|e| content(&url, e))?;
    log.push(format!("AMD cert_chain: {url}"));

    let url = join(base, &paths.crl);
    let crl = http.get(&url)?.body;
    let crl = if crl.starts_with(b"-----BEGIN") {
        pki::pem_blocks(&crl, "KDS CRL")
            .map_err(|e| content(&url, e))?
            .into_iter()
            .next()
            .unwrap_or_default()
    } else {
        crl
    };
    pki::parse_crl(&crl, "KDS CRL").map_err(|e| content(&url, e))?;
    amd.crl.push(Base64Bytes(crl));
    log.push(format!("AMD CRL: {url}"));
    Ok(())
}
