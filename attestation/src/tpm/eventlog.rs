//! TCG PC Client event log parsing (crypto-agile `Spec ID Event03` and legacy SHA-1 formats)
//! and PCR replay.

use std::collections::BTreeMap;

use super::alg::HashAlg;
use super::error::TpmError;
use super::reader::Reader;

/// EV_NO_ACTION: informational, never extended into a PCR.
const EV_NO_ACTION: u32 = 0x0000_0003;
/// Signature of the crypto-agile header event.
const SPEC_ID_SIGNATURE: &[u8] = b"Spec ID Event03\0";
/// Signature of the startup-locality event, which sets PCR 0's initial value.
const STARTUP_LOCALITY_SIGNATURE: &[u8] = b"StartupLocality\0";
/// Number of PCRs of a PC Client TPM.
pub const PCR_COUNT: u8 = 24;

/// One measured event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Byte offset of the event in the log.
    pub offset: usize,
    /// PCR the event extends.
    pub pcr: u8,
    /// TCG event type.
    pub event_type: u32,
    /// Digests per supported bank (banks with an unsupported algorithm are skipped).
    pub digests: BTreeMap<HashAlg, Vec<u8>>,
    /// Event data.
    pub data: Vec<u8>,
}

/// A parsed event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    /// Every event after the header, in order.
    pub events: Vec<Event>,
    /// Banks the log carries digests for (supported algorithms only).
    pub banks: Vec<HashAlg>,
    /// Locality that the startup-locality event declares (0 when absent).
    pub startup_locality: u8,
}

impl EventLog {
    /// Parses a binary event log (`binary_bios_measurements`).
    pub fn parse(bytes: &[u8]) -> Result<Self, TpmError> {
        let mut r = Reader::new(bytes, "TCG event log");
        let first = read_sha1_event(&mut r)?;
        let spec_sizes =
            if first.event_type == EV_NO_ACTION && first.data.starts_with(SPEC_ID_SIGNATURE) {
                Some(parse_spec_id(&first.data)?)
            } else {
                None
            };
        let mut log = Self {
            events: Vec::new(),
            banks: Vec::new(),
            startup_locality: 0,
        };
        match spec_sizes {
            Some(sizes) => {
                log.banks = sizes
                    .iter()
                    .filter_map(|(alg, _)| HashAlg::from_tpm_alg(*alg))
                    .collect();
                while !r.is_empty() {
                    let event = read_agile_event(&mut r, &sizes)?;
                    log.push(event);
                }
            }
            None => {
                log.banks = vec![HashAlg::Sha1];
                log.push(first);
                while !r.is_empty() {
                    let event = read_sha1_event(&mut r)?;
                    log.push(event);
                }
            }
        }
        Ok(log)
    }

    /// Records an event, noting the startup locality.
    fn push(&mut self, event: Event) {
        if event.event_type == EV_NO_ACTION
            && event.pcr == 0
            && event.data.len() > STARTUP_LOCALITY_SIGNATURE.len()
            && event.data.starts_with(STARTUP_LOCALITY_SIGNATURE)
        {
            self.startup_locality = event.data[STARTUP_LOCALITY_SIGNATURE.len()];
        }
        self.events.push(event);
    }

    /// Replays the log for `bank`: the value of every PCR (0–23) after extending each
    /// measured event, starting from the PC Client reset values (zero, all-ones for 17–22,
    /// PCR 0 ending in the startup locality). Returns the values and the set of PCRs that
    /// at least one event extended.
    pub fn replay(&self, bank: HashAlg) -> Result<Replay, TpmError> {
        if !self.banks.contains(&bank) {
            return Err(TpmError::EventLog {
                reason: format!("the log has no {bank} digests"),
                offset: 0,
            });
        }
        let len = bank.digest_len();
        let mut values: BTreeMap<u8, Vec<u8>> = (0..PCR_COUNT)
            .map(|pcr| {
                let fill = if (17..=22).contains(&pcr) { 0xff } else { 0x00 };
                (pcr, vec![fill; len])
            })
            .collect();
        if let Some(pcr0) = values.get_mut(&0) {
            pcr0[len - 1] = self.startup_locality;
        }
        let mut extended = std::collections::BTreeSet::new();
        for event in &self.events {
            if event.event_type == EV_NO_ACTION {
                continue;
            }
            let digest = event.digests.get(&bank).ok_or_else(|| TpmError::EventLog {
                reason: format!("event for PCR {} has no {bank} digest", event.pcr),
                offset: event.offset,
            })?;
            let current = values
                .get_mut(&event.pcr)
                .ok_or_else(|| TpmError::EventLog {
                    reason: format!("event names PCR {} (at most 23)", event.pcr),
                    offset: event.offset,
                })?;
            let mut input = current.clone();
            input.extend_from_slice(digest);
            *current = bank.digest(&input);
            extended.insert(event.pcr);
        }
        Ok(Replay { values, extended })
    }
}

/// The result of replaying a log for one bank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Replayed value of every PCR 0–23.
    pub values: BTreeMap<u8, Vec<u8>>,
    /// PCRs that at least one event extended.
    pub extended: std::collections::BTreeSet<u8>,
}

/// Reads a TCG_PCR_EVENT (SHA-1 format).
fn read_sha1_event(r: &mut Reader<'_>) -> Result<Event, TpmError> {
    let offset = r.position();
    let pcr = read_pcr(r)?;
    let event_type = r.u32_le("eventType")?;
    let digest = r.bytes(20, "digest")?.to_vec();
    let size = r.u32_le("eventSize")?;
    let data = r.bytes(to_len(size, r)?, "event")?.to_vec();
    Ok(Event {
        offset,
        pcr,
        event_type,
        digests: BTreeMap::from([(HashAlg::Sha1, digest)]),
        data,
    })
}

/// Reads a TCG_PCR_EVENT2 (crypto-agile format).
fn read_agile_event(r: &mut Reader<'_>, sizes: &[(u16, u16)]) -> Result<Event, TpmError> {
    let event_offset = r.position();
    let pcr = read_pcr(r)?;
    let event_type = r.u32_le("eventType")?;
    let count = r.u32_le("digests.count")?;
    let mut digests = BTreeMap::new();
    for _ in 0..count {
        let offset = r.position();
        let alg = r.u16_le("digests.hashAlg")?;
        let size = sizes
            .iter()
            .find(|(id, _)| *id == alg)
            .map(|(_, size)| *size)
            .ok_or_else(|| TpmError::EventLog {
                reason: format!("digest algorithm {alg:#06x} not declared in Spec ID event"),
                offset,
            })?;
        let digest = r.bytes(usize::from(size), "digests.digest")?;
        if let Some(hash) = HashAlg::from_tpm_alg(alg) {
            digests.insert(hash, digest.to_vec());
        }
    }
    let size = r.u32_le("eventSize")?;
    let data = r.bytes(to_len(size, r)?, "event")?.to_vec();
    Ok(Event {
        offset: event_offset,
        pcr,
        event_type,
        digests,
        data,
    })
}

/// Reads a PCR index and checks its range.
fn read_pcr(r: &mut Reader<'_>) -> Result<u8, TpmError> {
    let offset = r.position();
    let pcr = r.u32_le("pcrIndex")?;
    u8::try_from(pcr)
        .ok()
        .filter(|p| *p < PCR_COUNT)
        .ok_or(TpmError::EventLog {
            reason: format!("PCR index {pcr} out of range"),
            offset,
        })
}

/// Converts an event size to `usize`.
fn to_len(size: u32, r: &Reader<'_>) -> Result<usize, TpmError> {
    usize::try_from(size).map_err(|_| TpmError::EventLog {
        reason: format!("event size {size} too large"),
        offset: r.position(),
    })
}

/// Parses a TCG_EfiSpecIDEventStruct, returning (algorithmId, digestSize) pairs.
fn parse_spec_id(data: &[u8]) -> Result<Vec<(u16, u16)>, TpmError> {
    let mut r = Reader::new(data, "TCG_EfiSpecIDEvent");
    r.bytes(16, "signature")?;
    r.u32_le("platformClass")?;
    r.u8("specVersionMinor")?;
    r.u8("specVersionMajor")?;
    r.u8("specErrata")?;
    r.u8("uintnSize")?;
    let count = r.u32_le("numberOfAlgorithms")?;
    let mut sizes = Vec::new();
    for _ in 0..count {
        let alg = r.u16_le("digestSizes.algorithmId")?;
        let size = r.u16_le("digestSizes.digestSize")?;
        if let Some(hash) = HashAlg::from_tpm_alg(alg)
            && usize::from(size) != hash.digest_len()
        {
            return Err(TpmError::EventLog {
                reason: format!("Spec ID event gives {hash} a digest size of {size}"),
                offset: 0,
            });
        }
        sizes.push((alg, size));
    }
    Ok(sizes)
}
