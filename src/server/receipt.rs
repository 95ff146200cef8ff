//! Audit receipts: every answered `/v1` request learns where its request record lies in the audit
//! log (response headers `inferno-audit-index` and `inferno-audit-leaf`), and
//! `GET /v1/audit/proof?index=N` returns that record's inclusion proof against the latest signed
//! checkpoint. `inferno audit receipt` checks the pair offline against the attested audit key.
//! The format is specified in `docs/attestation-protocol.md` (section "Receipts").

use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use http::{HeaderValue, Response, header};
use inferno_audit::merkle::{self, TreeView};
use inferno_audit::note::SignedNote;
use inferno_audit::{Appended, InclusionProof, RecordBody};
use serde::{Deserialize, Serialize};

use super::app::App;
use super::body::{Body, full};
use super::error::ApiError;

/// Response header carrying the request record's leaf index.
pub const INDEX_HEADER: &str = "inferno-audit-index";
/// Response header carrying the request record's leaf hash (lowercase hex).
pub const LEAF_HEADER: &str = "inferno-audit-leaf";

/// Adds the receipt headers for `receipt` (nothing when the audit log is off).
pub fn add_headers(response: &mut Response<Body>, receipt: Option<Appended>) {
    let Some(receipt) = receipt else {
        return;
    };
    let headers = response.headers_mut();
    headers.insert(INDEX_HEADER, HeaderValue::from(receipt.index));
    if let Ok(value) = HeaderValue::from_str(&hex::encode(receipt.leaf)) {
        headers.insert(LEAF_HEADER, value);
    }
}

/// The body of `GET /v1/audit/proof`: a record's inclusion proof against a signed checkpoint.
/// It is also the receipt file `inferno audit receipt` reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProofResponse {
    /// The record's leaf index.
    pub index: u64,
    /// The record's leaf hash, lowercase hex.
    pub leaf: String,
    /// The inclusion proof in the audit log's proof-file format (`inferno-audit-inclusion/v1`).
    pub proof: String,
    /// The signed checkpoint (C2SP signed note) the proof leads to.
    pub checkpoint: String,
    /// The record's payload (base64), only for the principal the record names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
}

/// `GET /v1/audit/proof?index=N` for `caller`: 404 without an audit log or for an index the log
/// does not hold, 503 (with Retry-After) while no signed checkpoint covers it yet.
pub async fn proof(
    app: &App,
    query: Option<&str>,
    caller: &str,
) -> Result<Response<Body>, ApiError> {
    let sink = app
        .audit()
        .ok_or_else(|| ApiError::route_not_found("/v1/audit/proof"))?;
    let index = parse_index(query)?;
    let note = sink
        .latest_checkpoint()
        .ok_or_else(|| not_covered("no checkpoint has been written yet"))?;
    let checkpoint = SignedNote::parse(&note)
        .and_then(|signed| signed.checkpoint())
        .map_err(|err| ApiError::internal(format!("the latest checkpoint is unreadable: {err}")))?;
    if index >= checkpoint.size {
        return Err(not_covered(&format!(
            "record {index} is not covered by the latest checkpoint (size {}) yet",
            checkpoint.size
        )));
    }
    let dir = app
        .config()
        .audit
        .as_ref()
        .map(|audit| audit.dir.clone())
        .ok_or_else(|| ApiError::route_not_found("/v1/audit/proof"))?;
    let caller = caller.to_owned();
    let built = tokio::task::spawn_blocking(move || build(dir, index, checkpoint.size, &caller))
        .await
        .map_err(|err| ApiError::internal(format!("building the proof panicked: {err}")))??;
    let body = ProofResponse {
        checkpoint: note,
        ..built
    };
    let json = serde_json::to_string(&body)
        .map_err(|err| ApiError::internal(format!("cannot render the proof: {err}")))?;
    let mut response = Response::new(full(json));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn parse_index(query: Option<&str>) -> Result<u64, ApiError> {
    let value = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("index="))
        .ok_or_else(|| {
            ApiError::invalid_param("index", "the query parameter `index` is required")
        })?;
    value.parse().map_err(|_| {
        ApiError::invalid_param(
            "index",
            "`index` must be a non-negative integer record index",
        )
    })
}

fn not_covered(message: &str) -> ApiError {
    ApiError::unavailable(format!("{message}; retry after the next checkpoint"))
}

/// Reads the log (once per call: the cost grows with the log; see docs/attestation-protocol.md)
/// and builds the proof of `index` in the tree of `size` leaves.
fn build(dir: PathBuf, index: u64, size: u64, caller: &str) -> Result<ProofResponse, ApiError> {
    let unreadable = |err: &dyn std::fmt::Display| {
        ApiError::internal("the audit log cannot be read").with_cause(err)
    };
    let (prefix, leaves) = inferno_audit::load_tree(&dir).map_err(|e| unreadable(&e))?;
    let view = TreeView::new(&prefix, &leaves);
    let hashes = view
        .inclusion_proof(index, size)
        .map_err(|_| ApiError::route_not_found("/v1/audit/proof"))?;
    let pruned = prefix.size();
    let leaf = index
        .checked_sub(pruned)
        .and_then(|i| leaves.get(usize::try_from(i).ok()?))
        .copied()
        .ok_or_else(|| ApiError::route_not_found("/v1/audit/proof"))?;
    let record = inferno_audit::read_records(&dir)
        .map_err(|e| unreadable(&e))?
        .into_iter()
        .find(|stored| stored.record.index == index)
        .filter(|stored| match &stored.record.body {
            RecordBody::Request(request) => request.principal == caller,
            _ => false,
        })
        .filter(|stored| merkle::leaf_hash(&stored.payload) == leaf)
        .map(|stored| B64.encode(&stored.payload));
    let proof = InclusionProof {
        index,
        size,
        leaf,
        hashes,
    };
    Ok(ProofResponse {
        index,
        leaf: hex::encode(leaf),
        proof: proof.render(),
        checkpoint: String::new(),
        record,
    })
}

/// Why a receipt did not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReceiptError {
    /// The receipt file is malformed.
    #[error("malformed receipt: {0}")]
    Malformed(String),
    /// The checkpoint is not signed by the given audit key.
    #[error("the checkpoint is not signed by the audit key: {0}")]
    Signature(String),
    /// The proof does not lead from the leaf to the checkpoint's root.
    #[error("the inclusion proof does not lead to the checkpoint's root: {0}")]
    Proof(String),
    /// The record's payload does not hash to the receipt's leaf.
    #[error("the record does not hash to the receipt's leaf hash")]
    Record,
    /// The leaf hash differs from the one the response header gave.
    #[error("the leaf hash {got} is not the one the response carried ({expected})")]
    Leaf {
        /// The response header's leaf hash.
        expected: String,
        /// The receipt's leaf hash.
        got: String,
    },
}

/// What a verified receipt establishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedReceipt {
    /// The record's leaf index.
    pub index: u64,
    /// The size of the signed checkpoint that includes it.
    pub checkpoint_size: u64,
    /// Whether the record's payload was present and checked.
    pub record_checked: bool,
}

/// Checks that `note` is signed by `audit_key`: a note verifier key (`name+hash+base64`), or the
/// 32-byte Ed25519 public key in hex as the runtime data's `audit_key` states it (then under the
/// name its signature line gives).
fn check_signature(note: &SignedNote, audit_key: &str) -> Result<(), ReceiptError> {
    use inferno_audit::note::{ALG_ED25519, VerifierKey};
    let keys = match hex::decode(audit_key.trim()) {
        Ok(public) => {
            let public: [u8; 32] = public
                .try_into()
                .map_err(|_| ReceiptError::Malformed("a hex audit key must be 32 bytes".into()))?;
            note.signatures
                .iter()
                .map(|sig| VerifierKey {
                    name: sig.name.clone(),
                    alg: ALG_ED25519,
                    public,
                })
                .collect()
        }
        Err(_) => vec![
            VerifierKey::parse(audit_key)
                .map_err(|e| ReceiptError::Malformed(format!("audit key: {e}")))?,
        ],
    };
    let mut last = String::from("the checkpoint has no signature");
    for key in keys {
        match key.verify(note) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(ReceiptError::Signature(last))
}

/// Verifies `receipt` offline: the checkpoint is signed by `audit_key` (see `check_signature`),
/// the proof leads from the leaf to its root, the record (when present) hashes to the leaf, and
/// the leaf is `expected_leaf` (the response header's value) when given.
pub fn verify(
    receipt: &ProofResponse,
    audit_key: &str,
    expected_leaf: Option<&str>,
) -> Result<VerifiedReceipt, ReceiptError> {
    let note = SignedNote::parse(&receipt.checkpoint)
        .map_err(|e| ReceiptError::Malformed(format!("checkpoint: {e}")))?;
    check_signature(&note, audit_key)?;
    let checkpoint = note
        .checkpoint()
        .map_err(|e| ReceiptError::Malformed(format!("checkpoint: {e}")))?;
    let proof = InclusionProof::parse(&receipt.proof)
        .map_err(|e| ReceiptError::Malformed(format!("proof: {e}")))?;
    if proof.index != receipt.index || hex::encode(proof.leaf) != receipt.leaf {
        return Err(ReceiptError::Malformed(
            "the proof names another index or leaf than the receipt".into(),
        ));
    }
    if proof.size != checkpoint.size {
        return Err(ReceiptError::Proof(format!(
            "the proof is for a tree of {} leaves, the checkpoint has {}",
            proof.size, checkpoint.size
        )));
    }
    merkle::verify_inclusion(
        proof.index,
        proof.size,
        &proof.leaf,
        &proof.hashes,
        &checkpoint.root,
    )
    .map_err(|e| ReceiptError::Proof(e.to_string()))?;
    let record_checked = match &receipt.record {
        Some(record) => {
            let payload = B64
                .decode(record)
                .map_err(|e| ReceiptError::Malformed(format!("record: {e}")))?;
            if merkle::leaf_hash(&payload) != proof.leaf {
                return Err(ReceiptError::Record);
            }
            true
        }
        None => false,
    };
    if let Some(expected) = expected_leaf
        && !expected.eq_ignore_ascii_case(&receipt.leaf)
    {
        return Err(ReceiptError::Leaf {
            expected: expected.to_owned(),
            got: receipt.leaf.clone(),
        });
    }
    Ok(VerifiedReceipt {
        index: receipt.index,
        checkpoint_size: checkpoint.size,
        record_checked,
    })
}
