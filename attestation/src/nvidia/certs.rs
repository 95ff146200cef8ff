//! X.509 chain checks for the GPU device chain and the RIM signer chain: signatures by the
//! next certificate, CA flags, validity at the caller's `now`, and anchoring in a trusted root.

use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer as _;

use super::error::GpuError;

/// OID of the TCG DICE TcbInfo extension, which carries the FWID.
pub const OID_TCG_DICE_TCB_INFO: &str = "2.23.133.5.4.1";

/// A verified chain: the leaf and the index of the trusted root that anchors it.
#[derive(Debug)]
pub struct VerifiedChain<'a> {
    /// The end-entity certificate.
    pub leaf: X509Certificate<'a>,
    /// Index into the roots passed to [`verify_chain`].
    pub root_index: usize,
}

/// Parses one DER certificate, rejecting trailing bytes.
pub fn parse_der<'a>(
    der: &'a [u8],
    chain: &'static str,
    position: usize,
) -> Result<X509Certificate<'a>, GpuError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(GpuError::CertChain {
            chain,
            reason: format!("certificate {position} has trailing bytes"),
        }),
        Err(e) => Err(GpuError::CertChain {
            chain,
            reason: format!("certificate {position} is not DER X.509: {e}"),
        }),
    }
}

/// Splits PEM text into DER certificates, in order.
pub fn pem_chain(text: &[u8], chain: &'static str) -> Result<Vec<Vec<u8>>, GpuError> {
    x509_parser::pem::Pem::iter_from_buffer(text)
        .map(|pem| {
            pem.map(|p| p.contents).map_err(|e| GpuError::CertChain {
                chain,
                reason: format!("invalid PEM: {e}"),
            })
        })
        .collect()
}

/// Whether the certificate says it is a CA.
fn is_ca(cert: &X509Certificate<'_>) -> bool {
    matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca)
}

/// Checks validity at `now`.
fn check_validity(
    cert: &X509Certificate<'_>,
    now: OffsetDateTime,
    chain: &'static str,
    what: &str,
) -> Result<(), GpuError> {
    let t = now.unix_timestamp();
    let v = cert.validity();
    if t < v.not_before.timestamp() || t > v.not_after.timestamp() {
        return Err(GpuError::CertChain {
            chain,
            reason: format!(
                "{what} ({}) is not valid at {now}: valid {} to {}",
                cert.subject(),
                v.not_before,
                v.not_after
            ),
        });
    }
    Ok(())
}

/// Verifies `chain` (leaf first) up to one of `roots` at `now`.
///
/// The leaf must not be a CA; every other certificate must be a CA, be valid at `now`, and
/// have issued the one before it. The last certificate must be one of the roots, or be
/// issued by one.
pub fn verify_chain<'a>(
    chain: &'a [Vec<u8>],
    roots: &[Vec<u8>],
    now: OffsetDateTime,
    name: &'static str,
) -> Result<VerifiedChain<'a>, GpuError> {
    let fail = |reason: String| GpuError::CertChain {
        chain: name,
        reason,
    };
    if chain.is_empty() {
        return Err(fail("no certificates".into()));
    }
    let certs = chain
        .iter()
        .enumerate()
        .map(|(i, der)| parse_der(der, name, i))
        .collect::<Result<Vec<_>, _>>()?;
    if is_ca(&certs[0]) {
        return Err(fail(format!(
            "certificate 0 ({}) is a CA, not a device leaf: the leaf is missing",
            certs[0].subject()
        )));
    }
    for (i, cert) in certs.iter().enumerate() {
        check_validity(cert, now, name, &format!("certificate {i}"))?;
    }
    for (i, pair) in certs.windows(2).enumerate() {
        let (child, issuer) = (&pair[0], &pair[1]);
        if !is_ca(issuer) {
            return Err(fail(format!(
                "certificate {} ({}) is not a CA",
                i + 1,
                issuer.subject()
            )));
        }
        if child.issuer() != issuer.subject() {
            return Err(fail(format!(
                "certificate {i} is issued by {}, but certificate {} is {}",
                child.issuer(),
                i + 1,
                issuer.subject()
            )));
        }
        child
            .verify_signature(Some(issuer.public_key()))
            .map_err(|e| {
                fail(format!(
                    "certificate {i} is not signed by certificate {}: {e}",
                    i + 1
                ))
            })?;
    }
    let top_der = &chain[chain.len() - 1];
    let top = &certs[certs.len() - 1];
    for (index, root_der) in roots.iter().enumerate() {
        if root_der == top_der {
            return Ok(VerifiedChain {
                leaf: certs
                    .into_iter()
                    .next()
                    .ok_or_else(|| fail("empty".into()))?,
                root_index: index,
            });
        }
    }
    for (index, root_der) in roots.iter().enumerate() {
        let root = parse_der(root_der, name, usize::MAX)?;
        if top.issuer() == root.subject() && top.verify_signature(Some(root.public_key())).is_ok() {
            check_validity(&root, now, name, "trusted root")?;
            return Ok(VerifiedChain {
                leaf: certs
                    .into_iter()
                    .next()
                    .ok_or_else(|| fail("empty".into()))?,
                root_index: index,
            });
        }
    }
    Err(fail(format!(
        "the chain ends at {}, which is neither a trusted root nor issued by one",
        top.subject()
    )))
}

/// The FWID of a device leaf: the last 48 bytes of its TCG DICE TcbInfo extension.
pub fn leaf_fwid(leaf: &X509Certificate<'_>) -> Result<Vec<u8>, GpuError> {
    let ext = leaf
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == OID_TCG_DICE_TCB_INFO)
        .ok_or_else(|| {
            GpuError::Fwid(format!(
                "leaf has no TCG DICE TcbInfo extension ({OID_TCG_DICE_TCB_INFO})"
            ))
        })?;
    let value = ext.value;
    if value.len() < 48 {
        return Err(GpuError::Fwid(format!(
            "TcbInfo extension has {} bytes, fewer than 48",
            value.len()
        )));
    }
    Ok(value[value.len() - 48..].to_vec())
}
