//! The model key wrapped under an SEV-SNP derived key (`inferno seal --snp-seal BLOB`,
//! `[model.key] source = "snp"`), for single-host deployments.
//!
//! The AMD secure processor derives a 256-bit key (SNP firmware ABI, MSG_KEY_REQ) from a root
//! key (the chip's VCEK, or the VM root key) mixed with guest fields the request selects: the
//! launch measurement, the guest policy, image and family ids, guest SVN, a TCB version and the
//! launch mitigation vector. The same guest image on the same chip derives the same key; a
//! different measurement or policy derives another one. The model key is wrapped with that
//! derived key (AES-256-GCM, ring), and the blob records the request's parameters so that the
//! appliance derives the same key at start.
//!
//! **Never run on hardware**: there is no SEV-SNP machine here. The request construction
//! (through the `sev` crate's `DerivedKey` / `GuestFieldSelect`), the wrapping and the refusal
//! without `/dev/sev-guest` are tested; the ioctl path is not.

use std::path::Path;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::{Deserialize, Serialize};
use sev::firmware::guest::{DerivedKey, GuestFieldSelect};
use zeroize::Zeroizing;

use super::key::{KEY_LEN, ModelKey};

/// The guest device the derived key is requested from.
pub const DEVICE: &str = "/dev/sev-guest";
/// The blob's `format`.
pub const BLOB_FORMAT: &str = "inferno-snp-sealed-key";
/// The blob format version.
pub const BLOB_VERSION: u32 = 1;
/// Domain separation of the wrapping's associated data.
const AAD_LABEL: &[u8] = b"inferno-snp-sealed-key-v1";

/// Deriving, wrapping or unwrapping failed. One line each.
#[derive(Debug, thiserror::Error)]
pub enum SnpKeyError {
    /// No SEV-SNP guest device: not an SEV-SNP guest.
    #[error(
        "SEV-SNP derived key: {DEVICE} is absent: this is not an SEV-SNP guest (the derived key exists only on SNP hardware)"
    )]
    NoDevice,
    /// The device or the firmware refused the request.
    #[error("SEV-SNP derived key: {0}")]
    Firmware(String),
    /// The parameters are invalid.
    #[error("SEV-SNP derived key request: {0}")]
    Request(String),
    /// The wrapped key does not open with the derived key: another chip, measurement, policy
    /// or TCB, or a changed blob.
    #[error(
        "SEV-SNP derived key: the model key does not unwrap (another chip, launch measurement, guest policy or TCB than at sealing, or a changed blob)"
    )]
    Unwrap,
    /// The blob file is unusable.
    #[error("SEV-SNP sealed key {path}: {reason}")]
    Blob {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The root key a derived key comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RootKey {
    /// The chip's VCEK (ROOT_KEY_SELECT 0): bound to this chip and its TCB.
    #[default]
    Vcek,
    /// The VM root key (ROOT_KEY_SELECT 1): from the migration agent, follows a migrated VM.
    Vmrk,
}

/// What MSG_KEY_REQ mixes into the key (GUEST_FIELD_SELECT) and with which values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpKeyParams {
    /// ROOT_KEY_SELECT.
    pub root_key: RootKey,
    /// Mix in the guest policy (bit 0).
    pub guest_policy: bool,
    /// Mix in the image id (bit 1).
    pub image_id: bool,
    /// Mix in the family id (bit 2).
    pub family_id: bool,
    /// Mix in the launch measurement (bit 3).
    pub measurement: bool,
    /// Mix in `guest_svn` (bit 4) when set; it must not exceed the ID block's SVN.
    pub guest_svn: Option<u32>,
    /// Mix in `tcb_version` (bit 5) when set; it must not exceed the committed TCB, so older
    /// (rolled-back) firmware cannot derive the key.
    pub tcb_version: Option<u64>,
    /// Mix in `launch_mit_vector` (bit 6) when set (message version 2, firmware 1.58 and later).
    pub launch_mit_vector: Option<u64>,
    /// VMPL: must be at least the guest's current VMPL.
    pub vmpl: u32,
}

impl Default for SnpKeyParams {
    /// The launch measurement and the guest policy of this guest on this chip (VCEK), VMPL 0.
    fn default() -> Self {
        Self {
            root_key: RootKey::Vcek,
            guest_policy: true,
            image_id: false,
            family_id: false,
            measurement: true,
            guest_svn: None,
            tcb_version: None,
            launch_mit_vector: None,
            vmpl: 0,
        }
    }
}

impl SnpKeyParams {
    /// GUEST_FIELD_SELECT for these parameters.
    pub fn field_select(&self) -> GuestFieldSelect {
        let mut select = GuestFieldSelect::default();
        select.set_guest_policy(self.guest_policy);
        select.set_image_id(self.image_id);
        select.set_family_id(self.family_id);
        select.set_measurement(self.measurement);
        select.set_svn(self.guest_svn.is_some());
        select.set_tcb_version(self.tcb_version.is_some());
        select.set_launch_mit_vector(self.launch_mit_vector.is_some());
        select
    }

    /// The MSG_KEY_REQ message version: 2 when the launch mitigation vector is mixed in
    /// (firmware 1.58 and later), else 1.
    pub fn message_version(&self) -> u32 {
        if self.launch_mit_vector.is_some() {
            2
        } else {
            1
        }
    }

    /// The MSG_KEY_REQ request (the `sev` crate's `DerivedKey`). Refuses a request that mixes
    /// in neither the measurement nor anything else about the guest: such a key would be the
    /// same for every guest on the chip.
    pub fn request(&self) -> Result<DerivedKey, SnpKeyError> {
        if !self.measurement && !self.image_id && !self.family_id {
            return Err(SnpKeyError::Request(
                "neither the measurement nor the image or family id is mixed in: every guest on this chip would derive the same key".into(),
            ));
        }
        if self.vmpl > 3 {
            return Err(SnpKeyError::Request(format!("VMPL {} (0..=3)", self.vmpl)));
        }
        Ok(DerivedKey::new(
            self.root_key == RootKey::Vmrk,
            self.field_select(),
            self.vmpl,
            self.guest_svn.unwrap_or(0),
            self.tcb_version.unwrap_or(0),
            self.launch_mit_vector,
        ))
    }
}

/// Asks the SEV-SNP firmware for the key `params` describe. Without `/dev/sev-guest`, refuses.
pub fn derive(params: &SnpKeyParams) -> Result<Zeroizing<[u8; 32]>, SnpKeyError> {
    let request = params.request()?;
    if !Path::new(DEVICE).exists() {
        return Err(SnpKeyError::NoDevice);
    }
    let mut firmware = sev::firmware::guest::Firmware::open()
        .map_err(|e| SnpKeyError::Firmware(format!("opening {DEVICE}: {e}")))?;
    firmware
        .get_derived_key(Some(params.message_version()), request)
        .map(Zeroizing::new)
        .map_err(|e| SnpKeyError::Firmware(format!("MSG_KEY_REQ: {e}")))
}

/// The sealed-key blob (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpSealedKey {
    /// Always [`BLOB_FORMAT`].
    pub format: String,
    /// [`BLOB_VERSION`].
    pub version: u32,
    /// The wrapped model key's id.
    pub key_id: String,
    /// The derived-key request.
    pub request: SnpKeyParams,
    /// The AES-256-GCM nonce, hex (12 bytes).
    pub nonce: String,
    /// The wrapped model key and its tag, hex (48 bytes).
    pub ciphertext: String,
}

/// The associated data: label, the request (JSON) and the key id.
fn aad(params: &SnpKeyParams, key_id: &str) -> Vec<u8> {
    let mut aad = AAD_LABEL.to_vec();
    aad.extend_from_slice(&serde_json::to_vec(params).unwrap_or_default());
    aad.extend_from_slice(key_id.as_bytes());
    aad
}

fn aead_key(kek: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, kek).expect("a 32-byte AES-256 key"))
}

/// Wraps `key` under the derived key `kek` obtained with `params`.
pub fn wrap(key: &ModelKey, params: &SnpKeyParams, kek: &[u8; 32]) -> SnpSealedKey {
    let mut nonce = [0u8; 12];
    SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system random generator works");
    let mut buffer = key.expose().to_vec();
    aead_key(kek)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(params, &key.id())),
            &mut buffer,
        )
        .expect("sealing 32 bytes cannot fail");
    SnpSealedKey {
        format: BLOB_FORMAT.to_owned(),
        version: BLOB_VERSION,
        key_id: key.id(),
        request: params.clone(),
        nonce: hex::encode(nonce),
        ciphertext: hex::encode(buffer),
    }
}

/// Unwraps the model key of `blob` with the derived key `kek`.
pub fn unwrap(blob: &SnpSealedKey, kek: &[u8; 32]) -> Result<ModelKey, SnpKeyError> {
    let bad = |reason: &str| SnpKeyError::Blob {
        path: "blob".into(),
        reason: reason.to_owned(),
    };
    let mut nonce = [0u8; 12];
    hex::decode_to_slice(&blob.nonce, &mut nonce).map_err(|_| bad("nonce: not 12 bytes of hex"))?;
    let mut buffer =
        Zeroizing::new(hex::decode(&blob.ciphertext).map_err(|_| bad("ciphertext: not hex"))?);
    let plain = aead_key(kek)
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(&blob.request, &blob.key_id)),
            &mut buffer,
        )
        .map_err(|_| SnpKeyError::Unwrap)?;
    let bytes = <[u8; KEY_LEN]>::try_from(&*plain).map_err(|_| bad("not a 32-byte key"))?;
    let key = ModelKey::from_bytes(bytes);
    if key.id() != blob.key_id {
        return Err(bad("the unwrapped key does not have the blob's key id"));
    }
    Ok(key)
}

/// Unwraps the model key of `blob` with the key the SEV-SNP firmware derives now.
pub fn unseal(blob: &SnpSealedKey) -> Result<ModelKey, SnpKeyError> {
    let kek = derive(&blob.request)?;
    unwrap(blob, &kek)
}

impl SnpSealedKey {
    /// Writes the blob to `path` (mode 0600, never overwriting).
    pub fn write(&self, path: &Path) -> Result<(), SnpKeyError> {
        super::write_json_blob(path, self).map_err(|reason| SnpKeyError::Blob {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Reads and checks a blob file.
    pub fn read(path: &Path) -> Result<Self, SnpKeyError> {
        let fail = |reason: String| SnpKeyError::Blob {
            path: path.display().to_string(),
            reason,
        };
        let blob: Self = super::read_json_blob(path, BLOB_FORMAT, BLOB_VERSION, |b: &Self| {
            (b.format.as_str(), b.version)
        })
        .map_err(fail)?;
        Ok(blob)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GUEST_FIELD_SELECT as an integer, read bit by bit through the `sev` crate's getters.
    fn bits(request: &DerivedKey) -> u64 {
        let f = &request.guest_field_select;
        [
            f.get_guest_policy(),
            f.get_image_id(),
            f.get_family_id(),
            f.get_measurement(),
            f.get_svn(),
            f.get_tcb_version(),
            f.get_launch_mit_vector(),
        ]
        .iter()
        .enumerate()
        .map(|(bit, set)| u64::from(*set) << bit)
        .sum()
    }

    #[test]
    fn the_default_request_mixes_in_measurement_and_policy_from_the_vcek() {
        let params = SnpKeyParams::default();
        let request = params.request().unwrap();
        // GUEST_FIELD_SELECT: bit 0 guest policy, bit 3 measurement.
        assert_eq!(bits(&request), 0b1001);
        assert_eq!(request.get_root_key_select(), 0);
        assert_eq!(request.vmpl, 0);
        assert_eq!(request.tcb_version, 0);
        assert_eq!(request.launch_mit_vector, None);
        assert_eq!(params.message_version(), 1);
    }

    #[test]
    fn every_field_lands_in_its_bit_and_value() {
        let params = SnpKeyParams {
            root_key: RootKey::Vmrk,
            guest_policy: false,
            image_id: true,
            family_id: true,
            measurement: true,
            guest_svn: Some(7),
            tcb_version: Some(0x1b00_0000_0000_0304),
            launch_mit_vector: Some(0b11),
            vmpl: 2,
        };
        let request = params.request().unwrap();
        assert_eq!(bits(&request), 0b111_1110);
        assert_eq!(request.get_root_key_select(), 1);
        assert_eq!(request.vmpl, 2);
        assert_eq!(request.guest_svn, 7);
        assert_eq!(request.tcb_version, 0x1b00_0000_0000_0304);
        assert_eq!(request.launch_mit_vector, Some(0b11));
        assert_eq!(params.message_version(), 2);
    }

    #[test]
    fn requests_that_bind_no_guest_identity_or_a_bad_vmpl_are_refused() {
        let anonymous = SnpKeyParams {
            measurement: false,
            ..SnpKeyParams::default()
        };
        assert!(matches!(anonymous.request(), Err(SnpKeyError::Request(_))));
        let vmpl = SnpKeyParams {
            vmpl: 4,
            ..SnpKeyParams::default()
        };
        assert!(matches!(vmpl.request(), Err(SnpKeyError::Request(_))));
    }

    #[test]
    fn without_the_guest_device_deriving_refuses_in_one_line() {
        if Path::new(DEVICE).exists() {
            eprintln!("SKIPPED: {DEVICE} exists on this machine");
            return;
        }
        let err = derive(&SnpKeyParams::default()).unwrap_err();
        assert!(matches!(err, SnpKeyError::NoDevice), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("/dev/sev-guest is absent") && !text.contains('\n'),
            "{text}"
        );
    }

    #[test]
    fn a_wrapped_key_opens_only_with_the_same_derived_key_and_request() {
        let key = ModelKey::from_bytes([3; 32]);
        let params = SnpKeyParams::default();
        let kek = [0x42; 32];
        let blob = wrap(&key, &params, &kek);
        assert_eq!(unwrap(&blob, &kek).unwrap().id(), key.id());
        // Another chip or measurement derives another key.
        assert!(matches!(
            unwrap(&blob, &[0x43; 32]),
            Err(SnpKeyError::Unwrap)
        ));
        // The request is bound: a blob edited to ask for a weaker key does not open.
        let mut weaker = blob.clone();
        weaker.request.guest_policy = false;
        assert!(matches!(unwrap(&weaker, &kek), Err(SnpKeyError::Unwrap)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snp.json");
        blob.write(&path).unwrap();
        assert_eq!(SnpSealedKey::read(&path).unwrap(), blob);
        assert!(blob.write(&path).is_err(), "never overwritten");
    }
}
