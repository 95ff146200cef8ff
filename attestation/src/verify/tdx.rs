//! TDX authenticity: DCAP quote verification (v4 and v5) against offline Intel collateral with
//! `dcap-qvl` — the PCK chain to the Intel SGX Root CA, the CRLs, the signed TCB info and QE
//! identity — yielding the TCB status, the advisories and the TD report.
//!
//! Collateral freshness: `dcap-qvl` rejects TCB info or QE identity past its next update. A
//! policy's grace period is applied by verifying at the earliest next-update instant when `now`
//! lies within the grace window; beyond it the quote is rejected.

use time::{Duration, OffsetDateTime};

use crate::bundle::IntelCollateral;
use crate::pki::{self, PkiError};

/// Errors of TDX verification; [`TdxVerifyError::check_id`] names the failed check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TdxVerifyError {
    /// The quote does not parse.
    #[error("TDX quote does not parse: {0}")]
    Parse(String),
    /// No collateral for the quote's platform.
    #[error("{0}")]
    NoCollateral(String),
    /// The collateral's signed JSON is malformed or stale.
    #[error("{0}")]
    Freshness(PkiError),
    /// DCAP verification failed (signature, chain, CRL, or no matching TCB level).
    #[error("DCAP quote verification failed: {0}")]
    Dcap(String),
    /// The quote is not a TD quote.
    #[error("quote carries an SGX enclave report, not a TD report")]
    NotTd,
}

impl TdxVerifyError {
    /// The check identifier this error fails.
    pub fn check_id(&self) -> &'static str {
        match self {
            TdxVerifyError::Parse(_) | TdxVerifyError::NotTd => "tdx.quote_format",
            TdxVerifyError::NoCollateral(_) | TdxVerifyError::Freshness(_) => {
                "tdx.collateral_freshness"
            }
            TdxVerifyError::Dcap(_) => "tdx.quote_signature",
        }
    }
}

/// The TD report fields the appraisal uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TdReport {
    /// TD attributes (8 bytes, as in the quote).
    pub td_attributes: [u8; 8],
    /// MRTD.
    pub mr_td: [u8; 48],
    /// RTMR0 to RTMR3.
    pub rtmrs: [[u8; 48]; 4],
    /// MRCONFIGID.
    pub mr_config_id: [u8; 48],
    /// REPORTDATA.
    pub report_data: [u8; 64],
}

impl TdReport {
    /// TD attribute bit 0: DEBUG.
    pub fn debug(&self) -> bool {
        self.td_attributes[0] & 1 != 0
    }
}

/// The outcome of successful TDX verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedTdx {
    /// Quote format version.
    pub quote_version: u16,
    /// Intel TCB status (`UpToDate`, `OutOfDate`, ...).
    pub tcb_status: String,
    /// Applicable Intel security advisories.
    pub advisory_ids: Vec<String>,
    /// FMSPC, hex.
    pub fmspc: String,
    /// The TD report.
    pub report: TdReport,
    /// Signed timestamps seen (collateral issue dates), for the clock floor.
    pub signed_timestamps: Vec<(OffsetDateTime, String)>,
    /// Each verification step that passed, as (check id, reason).
    pub passed: Vec<(&'static str, String)>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dates {
    issue_date: String,
    next_update: String,
}

fn dates(json: &str, what: &str) -> Result<(OffsetDateTime, OffsetDateTime), TdxVerifyError> {
    let bad = |reason: String| {
        TdxVerifyError::Freshness(PkiError::Der {
            what: what.to_owned(),
            reason,
        })
    };
    let d: Dates =
        serde_json::from_str(json).map_err(|e| bad(format!("no issueDate/nextUpdate: {e}")))?;
    let parse = |s: &str| {
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map_err(|e| bad(format!("bad timestamp {s:?}: {e}")))
    };
    Ok((parse(&d.issue_date)?, parse(&d.next_update)?))
}

/// Verifies a quote against the collateral entries, at `now` with `grace` past next-update.
pub fn verify(
    quote_bytes: &[u8],
    collateral: &[IntelCollateral],
    now: OffsetDateTime,
    grace: Duration,
) -> Result<VerifiedTdx, TdxVerifyError> {
    let quote = dcap_qvl::quote::Quote::parse(quote_bytes)
        .map_err(|e| TdxVerifyError::Parse(format!("{e:#}")))?;
    if !matches!(quote.header.version, 4 | 5) {
        return Err(TdxVerifyError::Parse(format!(
            "quote version {} (expected 4 or 5)",
            quote.header.version
        )));
    }
    let fmspc = dcap_qvl::intel::quote_fmspc(&quote)
        .map(hex::encode)
        .map_err(|e| TdxVerifyError::Parse(format!("no FMSPC in the PCK certificate: {e:#}")))?;
    let candidates: Vec<&IntelCollateral> = collateral
        .iter()
        .filter(|c| {
            c.fmspc
                .as_deref()
                .is_none_or(|f| f.eq_ignore_ascii_case(&fmspc))
        })
        .collect();
    if candidates.is_empty() {
        return Err(TdxVerifyError::NoCollateral(format!(
            "no Intel collateral for FMSPC {fmspc} in the collateral bundle"
        )));
    }

    let mut last_error = None;
    for entry in candidates {
        match verify_one(quote_bytes, &quote, entry, &fmspc, now, grace) {
            Ok(v) => return Ok(v),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| TdxVerifyError::NoCollateral("no collateral".into())))
}

/// The PCK and root CA CRLs' thisUpdate, each refused when it lies after `now` or when `now`
/// is more than `grace` past its nextUpdate (dcap-qvl checks their signatures and entries).
fn crl_this_updates(
    collateral: &dcap_qvl::QuoteCollateralV3,
    now: OffsetDateTime,
    grace: Duration,
) -> Result<Vec<(OffsetDateTime, String)>, TdxVerifyError> {
    let mut out = Vec::with_capacity(2);
    for (der, name) in [
        (&collateral.pck_crl, "Intel PCK CRL"),
        (&collateral.root_ca_crl, "Intel root CA CRL"),
    ] {
        let crl = pki::parse_crl(der, name).map_err(TdxVerifyError::Freshness)?;
        let issued = crl.last_update().to_datetime();
        let next = crl.next_update().map_or(issued, |t| t.to_datetime());
        pki::check_freshness(issued, next, grace, now, name).map_err(TdxVerifyError::Freshness)?;
        out.push((issued, format!("{name} thisUpdate")));
    }
    Ok(out)
}

fn verify_one(
    quote_bytes: &[u8],
    quote: &dcap_qvl::quote::Quote,
    entry: &IntelCollateral,
    fmspc: &str,
    now: OffsetDateTime,
    grace: Duration,
) -> Result<VerifiedTdx, TdxVerifyError> {
    let mut passed = Vec::new();
    let (tcb_issued, tcb_next) = dates(&entry.collateral.tcb_info, "TCB info")?;
    let (qe_issued, qe_next) = dates(&entry.collateral.qe_identity, "QE identity")?;
    let next = tcb_next.min(qe_next);
    let issued = tcb_issued.max(qe_issued);
    pki::check_freshness(issued, next, grace, now, "Intel TCB info / QE identity")
        .map_err(TdxVerifyError::Freshness)?;
    let crl_issued = crl_this_updates(&entry.collateral, now, grace)?;
    let at = now.min(next);
    passed.push((
        "tdx.collateral_freshness",
        if at < now {
            format!(
                "collateral next update {} has passed, within the policy's grace; verified at that instant",
                pki::rfc3339(next)
            )
        } else {
            format!("TCB info and QE identity current until {}", pki::rfc3339(next))
        },
    ));
    let at_secs = u64::try_from(at.unix_timestamp())
        .map_err(|_| TdxVerifyError::Dcap("verification time before 1970".into()))?;
    let verified = dcap_qvl::verify::QuoteVerifier::new_prod()
        .allow_debug(true)
        .verify(quote_bytes, &entry.collateral, at_secs)
        .map_err(|e| TdxVerifyError::Dcap(format!("{e:#}")))?;
    passed.push((
        "tdx.quote_signature",
        "quote, QE report and PCK chain to the Intel SGX Root CA verify; CRLs, TCB info and QE identity signatures verify".to_owned(),
    ));
    let td = match &verified.report {
        dcap_qvl::quote::Report::TD10(r) => r,
        dcap_qvl::quote::Report::TD15(r) => &r.base,
        dcap_qvl::quote::Report::TD15Ex(r) => &r.base.base,
        dcap_qvl::quote::Report::SgxEnclave(_) => return Err(TdxVerifyError::NotTd),
    };
    Ok(VerifiedTdx {
        quote_version: quote.header.version,
        tcb_status: verified.status.clone(),
        advisory_ids: verified.advisory_ids.clone(),
        fmspc: fmspc.to_owned(),
        report: TdReport {
            td_attributes: td.td_attributes,
            mr_td: td.mr_td,
            rtmrs: [td.rt_mr0, td.rt_mr1, td.rt_mr2, td.rt_mr3],
            mr_config_id: td.mr_config_id,
            report_data: td.report_data,
        },
        signed_timestamps: [
            (tcb_issued, "Intel TCB info issueDate".to_owned()),
            (qe_issued, "Intel QE identity issueDate".to_owned()),
        ]
        .into_iter()
        .chain(crl_issued)
        .collect(),
        passed,
    })
}
