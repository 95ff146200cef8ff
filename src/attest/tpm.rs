//! The vTPM part of start-up attestation, in key-first order: open the TPM and read its AK
//! before the CPU-TEE report, so that the AK's hash goes into the runtime-data document the
//! report binds; then quote the policy's PCRs with the document's SHA-256 as qualifying data.
//!
//! The TPM is the configured TCTI (`[attestation] tpm_tcti`) or, without one, `/dev/tpmrm0`
//! when that device exists. A policy requiring a vTPM refuses to start without one; a TPM that
//! was configured or is required must work, while an auto-detected one that cannot be used is
//! skipped with a warning (the evidence then has no vTPM section, as on a machine without one).

use std::path::Path;

use inferno_attestation::policy::{DEFAULT_TPM_PCRS, LoadedPolicy};
use inferno_attestation::runtime_data::RuntimeData;
use inferno_attestation::tpm::collect::{AkKind, DEFAULT_EVENT_LOG_PATH, TpmSession};
use inferno_attestation::tpm::{HashAlg, TpmEvidence};

use super::{AttestationError, TPM_DEVICE};

/// The bank the server quotes.
const QUOTE_BANK: HashAlg = HashAlg::Sha256;

/// An opened vTPM whose AK is bound into the runtime data before the CPU report is taken.
#[derive(Debug)]
pub(super) struct TpmAttester {
    session: TpmSession,
    pcrs: Vec<u8>,
}

impl TpmAttester {
    /// Opens the vTPM and loads the AK, or returns `None` when there is none to use. Refuses
    /// when the policy requires a vTPM and there is none, or when a configured or required
    /// TPM cannot be opened.
    pub(super) fn open(
        tcti: Option<&str>,
        policy: &LoadedPolicy,
    ) -> Result<Option<Self>, AttestationError> {
        let tpm_policy = policy.policy.tpm.as_ref();
        let required = tpm_policy.is_some_and(|t| t.required);
        let device_tcti = format!("device:{TPM_DEVICE}");
        let (tcti, configured) = match tcti {
            Some(tcti) => (tcti, true),
            None if Path::new(TPM_DEVICE).exists() => (device_tcti.as_str(), false),
            None if required => {
                return Err(AttestationError::NoTpm {
                    policy: policy.policy.name.clone(),
                    device: TPM_DEVICE,
                });
            }
            None => return Ok(None),
        };
        match TpmSession::open(tcti, None, AkKind::Rsa2048) {
            Ok(session) => Ok(Some(Self {
                session,
                pcrs: tpm_policy.map_or_else(|| DEFAULT_TPM_PCRS.to_vec(), |t| t.pcrs.clone()),
            })),
            Err(e) if configured || required => Err(AttestationError::Tpm(e.to_string())),
            Err(e) => {
                tracing::warn!(tcti, error = %e, "the vTPM cannot be used; no vTPM evidence");
                Ok(None)
            }
        }
    }

    /// Names the AK in the runtime-data document (`tpm_ak_sha256`).
    pub(super) fn bind_ak(&self, runtime_data: &mut RuntimeData) -> Result<(), AttestationError> {
        let digest = self
            .session
            .ak_public()
            .key()
            .and_then(|key| key.spki_sha256())
            .map_err(|e| AttestationError::Tpm(e.to_string()))?;
        runtime_data.tpm_ak_sha256 = Some(hex::encode(digest));
        Ok(())
    }

    /// Quotes the policy's PCRs over the document's `tpm_qualifying_data()`, with the event
    /// log when it is readable.
    pub(super) fn quote(
        &mut self,
        runtime_data: &RuntimeData,
    ) -> Result<TpmEvidence, AttestationError> {
        self.session
            .evidence(
                &[QUOTE_BANK],
                &self.pcrs,
                &runtime_data.tpm_qualifying_data(),
                Some(Path::new(DEFAULT_EVENT_LOG_PATH)),
            )
            .map_err(|e| AttestationError::Tpm(e.to_string()))
    }
}
