//! Intel PCS v4: for a quote's FMSPC and PCK CA, the PCK CRL, the TCB info, the QE identity and
//! the root CA CRL, assembled into dcap-qvl's `QuoteCollateralV3` (with the quote's PCK chain).
//!
//! dcap-qvl's own collateral fetcher is asynchronous and brings reqwest 0.13 with it; this one
//! reads the same PCS v4 endpoints through the blocking client and keeps the signed JSON text
//! of the TCB info and QE identity byte for byte (their signatures cover those bytes).

use dcap_qvl::QuoteCollateralV3;
use dcap_qvl::quote::Quote;

use super::{FetchError, FetchLog, Http, INTEL_PCS_URL, Response, join};
use crate::bundle::IntelCollateral;
use crate::pki;

/// Fetches the PCS collateral for `quote` (raw DCAP quote bytes) from `base`.
pub fn fetch(
    http: &Http,
    quote: &[u8],
    base: &str,
    log: &mut FetchLog,
) -> Result<IntelCollateral, FetchError> {
    let parsed = Quote::parse(quote).map_err(|e| evidence("TDX quote", e))?;
    let fmspc = hex::encode_upper(
        dcap_qvl::intel::quote_fmspc(&parsed).map_err(|e| evidence("the quote's PCK FMSPC", e))?,
    );
    let ca = dcap_qvl::intel::quote_ca(&parsed)
        .map_err(|e| evidence("the quote's PCK CA", e))?
        .as_id_str();
    let pck_chain = parsed
        .raw_cert_chain()
        .map_err(|e| evidence("the quote's PCK chain", e))
        .map(|pem| {
            String::from_utf8_lossy(pem)
                .trim_end_matches('\0')
                .to_owned()
        })?;
    let tee = if parsed.header.is_sgx() { "sgx" } else { "tdx" };

    let url = join(
        base,
        &format!("sgx/certification/v4/pckcrl?ca={ca}&encoding=der"),
    );
    let response = http.get(&url)?;
    let pck_crl_issuer_chain = issuer_chain(&response, &url, &["SGX-PCK-CRL-Issuer-Chain"])?;
    let pck_crl = response.body;
    log.push(format!("Intel PCK CRL: {url}"));

    let url = join(
        base,
        &format!("{tee}/certification/v4/tcb?fmspc={fmspc}&update=standard"),
    );
    let response = http.get(&url)?;
    let tcb_info_issuer_chain = issuer_chain(
        &response,
        &url,
        &["TCB-Info-Issuer-Chain", "SGX-TCB-Info-Issuer-Chain"],
    )?;
    let (tcb_info, tcb_info_signature) = signed_json(&response, &url, "tcbInfo")?;
    log.push(format!("Intel TCB info: {url}"));

    let url = join(
        base,
        &format!("{tee}/certification/v4/qe/identity?update=standard"),
    );
    let response = http.get(&url)?;
    let qe_identity_issuer_chain =
        issuer_chain(&response, &url, &["SGX-Enclave-Identity-Issuer-Chain"])?;
    let (qe_identity, qe_identity_signature) = signed_json(&response, &url, "enclaveIdentity")?;
    log.push(format!("Intel QE identity: {url}"));

    let root_ca_crl = root_ca_crl(http, base, &qe_identity_issuer_chain, log)?;
    Ok(IntelCollateral {
        fmspc: Some(fmspc.to_ascii_lowercase()),
        collateral: QuoteCollateralV3 {
            pck_crl_issuer_chain,
            root_ca_crl,
            pck_crl,
            tcb_info_issuer_chain,
            tcb_info,
            tcb_info_signature,
            qe_identity_issuer_chain,
            qe_identity,
            qe_identity_signature,
            pck_certificate_chain: Some(pck_chain),
        },
    })
}

/// A quote that cannot be read: `what` and dcap-qvl's error chain.
fn evidence(what: &str, e: impl std::fmt::Display) -> FetchError {
    FetchError::Evidence(format!("{what}: {e:#}"))
}

/// The root CA CRL: a PCCS (any base but Intel's PCS) serves it, hex or DER, at
/// `sgx/certification/v4/rootcacrl`; Intel's PCS does not, so it comes from the root
/// certificate's CRL distribution point.
fn root_ca_crl(
    http: &Http,
    base: &str,
    chain: &str,
    log: &mut FetchLog,
) -> Result<Vec<u8>, FetchError> {
    let url = if base.trim_end_matches('/') == INTEL_PCS_URL {
        crl_distribution_point(chain)?
    } else {
        join(base, "sgx/certification/v4/rootcacrl")
    };
    let body = http.get(&url)?.body;
    let text = std::str::from_utf8(&body)
        .map(str::trim)
        .unwrap_or_default();
    let der = match hex::decode(text) {
        Ok(der) if !text.is_empty() => der,
        _ => body,
    };
    pki::parse_crl(&der, "Intel root CA CRL").map_err(|e| FetchError::Content {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    log.push(format!("Intel root CA CRL: {url}"));
    Ok(der)
}

/// The first CRL distribution point URI of the last (root) certificate of a PEM chain.
fn crl_distribution_point(chain: &str) -> Result<String, FetchError> {
    let bad = |reason: String| FetchError::Evidence(format!("Intel root certificate: {reason}"));
    let ders = pki::pem_blocks(chain.as_bytes(), "QE identity issuer chain")
        .map_err(|e| bad(e.to_string()))?;
    let root = ders.last().ok_or_else(|| bad("empty chain".into()))?;
    let cert =
        pki::parse_certificate(root, "Intel root certificate").map_err(|e| bad(e.to_string()))?;
    for ext in cert.extensions() {
        if let x509_parser::extensions::ParsedExtension::CRLDistributionPoints(points) =
            ext.parsed_extension()
        {
            for point in points.iter() {
                if let Some(x509_parser::extensions::DistributionPointName::FullName(names)) =
                    &point.distribution_point
                {
                    for name in names {
                        if let x509_parser::extensions::GeneralName::URI(uri) = name {
                            return Ok((*uri).to_owned());
                        }
                    }
                }
            }
        }
    }
    Err(bad("no CRL distribution point".into()))
}

/// A URL-encoded PEM issuer chain from the first present header of `names`.
fn issuer_chain(response: &Response, url: &str, names: &[&str]) -> Result<String, FetchError> {
    let value = names
        .iter()
        .find_map(|name| response.header(name))
        .ok_or_else(|| FetchError::Content {
            url: url.to_owned(),
            reason: format!("no {} header", names.join(" or ")),
        })?;
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .map(|chain| chain.into_owned())
        .map_err(|e| FetchError::Content {
            url: url.to_owned(),
            reason: format!("{}: {e}", names.join("/")),
        })
}

/// The exact text of the signed member `key` of a PCS JSON body, and its hex signature.
fn signed_json(response: &Response, url: &str, key: &str) -> Result<(String, Vec<u8>), FetchError> {
    let bad = |reason: String| FetchError::Content {
        url: url.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(&response.body).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let signature = value
        .get("signature")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| bad("no `signature` string".into()))?;
    let signature = hex::decode(signature).map_err(|e| bad(format!("signature: {e}")))?;
    let raw = raw_member(text, key).ok_or_else(|| bad(format!("no `{key}` member")))?;
    Ok((raw.to_owned(), signature))
}

/// The raw text of member `key` of the top-level JSON object `text`, tokenised by serde_json.
fn raw_member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = text.trim_start().strip_prefix('{')?;
    loop {
        rest = rest.trim_start();
        let mut names = serde_json::Deserializer::from_str(rest).into_iter::<String>();
        let name = names.next()?.ok()?;
        rest = rest
            .get(names.byte_offset()..)?
            .trim_start()
            .strip_prefix(':')?;
        rest = rest.trim_start();
        let mut values =
            serde_json::Deserializer::from_str(rest).into_iter::<serde::de::IgnoredAny>();
        values.next()?.ok()?;
        let (value, after) = rest.split_at(values.byte_offset());
        if name == key {
            return Some(value);
        }
        rest = after.trim_start().strip_prefix(',')?;
    }
}

#[cfg(test)]
mod tests {
    use super::raw_member;

    #[test]
    fn raw_member_keeps_the_exact_bytes() {
        let text = r#" {"a" : [1, 2] ,"tcbInfo":{"z":1,"b":"x\"}"} , "signature":"00"}"#;
        assert_eq!(raw_member(text, "tcbInfo"), Some(r#"{"z":1,"b":"x\"}"}"#));
        assert_eq!(raw_member(text, "a"), Some("[1, 2]"));
        assert_eq!(raw_member(text, "signature"), Some(r#""00""#));
        assert_eq!(raw_member(text, "missing"), None);
        assert_eq!(raw_member("[]", "a"), None);
    }
}
