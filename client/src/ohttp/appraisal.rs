//! Judging a gateway reached over Oblivious HTTP: no TLS channel reaches the server, so the
//! fresh evidence alone speaks for it. It must pass the client policy, name the key
//! configuration the client seals to (`ohttp.key_config`) and answer the nonce the client sent
//! sealed to that key (`ohttp.challenge`).

use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::report::{AppraisalReport, CheckList};
use inferno_attestation::runtime_data::{RuntimeData, ohttp_challenge_binding};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::appraisal::{RuntimeDataSource, TrustReport, conclude};
use crate::policy::LoadedClientPolicy;

/// What a client observed of a gateway: the inputs of [`appraise_gateway`].
#[derive(Debug, Clone)]
pub struct GatewayObservation {
    /// The encoded key configuration (RFC 9458 §3.1) the client seals its requests to.
    pub key_config: Vec<u8>,
    /// The nonce the client sent, sealed to that configuration, in `POST /v1/attestation`.
    pub nonce: Vec<u8>,
    /// The evidence envelope the sealed answer carried.
    pub fresh_evidence: Evidence,
}

/// Judges a gateway observation against a client policy at `now`. Never fails: every problem
/// is a failed check.
pub fn appraise_gateway(
    observed: &GatewayObservation,
    policy: &LoadedClientPolicy,
    collateral: Option<&CollateralBundle>,
    now: OffsetDateTime,
) -> TrustReport {
    let mut checks = CheckList::default();
    let fresh_appraisal =
        inferno_attestation::appraise::appraise(&inferno_attestation::appraise::AppraisalInput {
            evidence: &observed.fresh_evidence,
            policy: &policy.appraisal,
            collateral,
            now,
            clock_floor: None,
            gpu_ready_pending: false,
        });
    checks.record("evidence.appraisal", appraisal_outcome(&fresh_appraisal));
    let fresh = fresh_appraisal.claims.runtime_data.as_ref();
    checks.record("ohttp.key_config", key_config_outcome(observed, fresh));
    checks.record("ohttp.challenge", challenge_outcome(observed, fresh));

    conclude(
        checks,
        policy,
        RuntimeDataSource::Fresh,
        None,
        fresh_appraisal,
        now,
    )
}

fn appraisal_outcome(fresh: &AppraisalReport) -> Result<String, String> {
    if fresh.passed() {
        Ok(format!(
            "fresh evidence: all {} checks pass{}",
            fresh.checks.len(),
            if fresh.simulated {
                " (SIMULATED TEE: test keys, no hardware protection)"
            } else {
                ""
            }
        ))
    } else {
        Err(format!(
            "fresh evidence: {}",
            fresh
                .failures()
                .map(|c| format!("{} ({})", c.id, c.reason))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

fn key_config_outcome(
    observed: &GatewayObservation,
    fresh: Option<&RuntimeData>,
) -> Result<String, String> {
    let doc = fresh.ok_or("no verified runtime data in the fresh evidence")?;
    let ours = hex::encode(Sha256::digest(&observed.key_config));
    match &doc.ohttp_key_config_sha256 {
        Some(bound) if *bound == ours => Ok(format!(
            "the evidence binds key configuration SHA-256 {bound}, the configuration requests are sealed to"
        )),
        Some(bound) => Err(format!(
            "the evidence binds key configuration SHA-256 {bound}, but the configuration served has {ours}: it is not the attested gateway's key"
        )),
        None => Err("the evidence binds no Oblivious HTTP key configuration".to_owned()),
    }
}

fn challenge_outcome(
    observed: &GatewayObservation,
    fresh: Option<&RuntimeData>,
) -> Result<String, String> {
    let doc = fresh.ok_or("no verified runtime data in the fresh evidence")?;
    let (key_id, public_key) = key_id_and_public_key(&observed.key_config)
        .ok_or("the key configuration is too short to hold a key id and an X25519 key")?;
    let binding = hex::encode(ohttp_challenge_binding(&observed.nonce, key_id, public_key));
    let count = doc.challenge_bindings.len();
    if doc.challenge_bindings.contains(&binding) {
        Ok(format!(
            "SHA-256(nonce ‖ key id ‖ public key) = {binding} is among the fresh evidence's {count} challenge binding(s)"
        ))
    } else {
        Err(format!(
            "SHA-256(nonce ‖ key id ‖ public key) = {binding} is not among the fresh evidence's {count} challenge binding(s): the evidence answers another nonce or was requested under another key"
        ))
    }
}

/// The key id and the X25519 public key of an encoded key configuration.
pub(crate) fn key_id_and_public_key(config: &[u8]) -> Option<(u8, &[u8])> {
    Some((*config.first()?, config.get(3..35)?))
}
