//! The SEV-SNP extended-report certificate table (GHCB `SNP_GUEST_REQUEST` extended request,
//! and configfs-tsm's `auxblob`): entries of (GUID, offset, length), ended by an all-zero
//! entry, followed by the certificates they point to.

use crate::evidence::SnpCertKind;

/// GUID of the ARK entry.
pub const GUID_ARK: [u8; 16] = guid(0xc0b406a4, 0xa803, 0x4952, 0x9743_3fb6014cd0ae);
/// GUID of the ASK entry.
pub const GUID_ASK: [u8; 16] = guid(0x4ab7b379, 0xbbac, 0x4fe4, 0xa02f_05aef327c782);
/// GUID of the VCEK entry.
pub const GUID_VCEK: [u8; 16] = guid(0x63da758d, 0xe664, 0x4564, 0xadc5_f4b93be8accd);
/// GUID of the VLEK entry.
pub const GUID_VLEK: [u8; 16] = guid(0xa8074bc2, 0xa25a, 0x483e, 0xaae6_39c045a0b8a1);

const fn guid(a: u32, b: u16, c: u16, d: u64) -> [u8; 16] {
    let a = a.to_be_bytes();
    let b = b.to_be_bytes();
    let c = c.to_be_bytes();
    let d = d.to_be_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

const ENTRY_LEN: usize = 24;

/// Errors when parsing a certificate table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertTableError {
    /// The table runs past the buffer or lacks its terminator.
    #[error("certificate table is truncated (no terminating entry within {0} bytes)")]
    Truncated(usize),
    /// An entry points outside the buffer.
    #[error(
        "certificate table entry {index} points outside the buffer ({offset}+{length} > {len})"
    )]
    OutOfBounds {
        /// The entry index.
        index: usize,
        /// Its offset.
        offset: usize,
        /// Its length.
        length: usize,
        /// The buffer length.
        len: usize,
    },
}

/// One certificate from the table; `kind` is `None` for GUIDs this crate does not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertTableEntry {
    /// The entry's GUID.
    pub guid: [u8; 16],
    /// The role, when the GUID is a known one.
    pub kind: Option<SnpCertKind>,
    /// The certificate bytes.
    pub data: Vec<u8>,
}

fn kind_of(guid: &[u8; 16]) -> Option<SnpCertKind> {
    match *guid {
        GUID_ARK => Some(SnpCertKind::Ark),
        GUID_ASK => Some(SnpCertKind::Ask),
        GUID_VCEK => Some(SnpCertKind::Vcek),
        GUID_VLEK => Some(SnpCertKind::Vlek),
        _ => None,
    }
}

fn u32_le(b: &[u8]) -> usize {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    u32::from_le_bytes(w) as usize
}

/// Parses a certificate table. An empty buffer is an empty table.
pub fn parse(buf: &[u8]) -> Result<Vec<CertTableEntry>, CertTableError> {
    let mut out = Vec::new();
    if buf.is_empty() {
        return Ok(out);
    }
    let mut index = 0;
    loop {
        let start = index * ENTRY_LEN;
        let Some(entry) = buf.get(start..start + ENTRY_LEN) else {
            return Err(CertTableError::Truncated(buf.len()));
        };
        let mut guid = [0u8; 16];
        guid.copy_from_slice(&entry[..16]);
        let offset = u32_le(&entry[16..20]);
        let length = u32_le(&entry[20..24]);
        if guid == [0; 16] && offset == 0 && length == 0 {
            return Ok(out);
        }
        let data = offset
            .checked_add(length)
            .and_then(|end| buf.get(offset..end))
            .ok_or(CertTableError::OutOfBounds {
                index,
                offset,
                length,
                len: buf.len(),
            })?;
        out.push(CertTableEntry {
            guid,
            kind: kind_of(&guid),
            data: data.to_vec(),
        });
        index += 1;
    }
}

/// Serialises certificates into a table (used by the simulated TEE and tests).
pub fn serialise(entries: &[([u8; 16], &[u8])]) -> Vec<u8> {
    let header = (entries.len() + 1) * ENTRY_LEN;
    let mut table = Vec::with_capacity(header);
    let mut data = Vec::new();
    for (guid, bytes) in entries {
        table.extend_from_slice(guid);
        let offset = u32::try_from(header + data.len()).unwrap_or(u32::MAX);
        let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        table.extend_from_slice(&offset.to_le_bytes());
        table.extend_from_slice(&length.to_le_bytes());
        data.extend_from_slice(bytes);
    }
    table.extend_from_slice(&[0u8; ENTRY_LEN]);
    table.extend_from_slice(&data);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_known_guids() {
        let table = serialise(&[(GUID_VCEK, b"vcek"), (GUID_ASK, b"ask!"), ([9; 16], b"x")]);
        let entries = parse(&table).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].kind, Some(SnpCertKind::Vcek));
        assert_eq!(entries[0].data, b"vcek");
        assert_eq!(entries[1].kind, Some(SnpCertKind::Ask));
        assert_eq!(entries[2].kind, None);
        assert_eq!(hex::encode(GUID_VCEK), "63da758de6644564adc5f4b93be8accd");
    }

    #[test]
    fn rejects_truncation_and_out_of_bounds() {
        let table = serialise(&[(GUID_VCEK, b"vcek")]);
        assert!(matches!(
            parse(&table[..20]),
            Err(CertTableError::Truncated(_))
        ));
        assert!(matches!(
            parse(&table[..table.len() - 1]),
            Err(CertTableError::OutOfBounds { .. })
        ));
        assert_eq!(parse(&[]).unwrap(), vec![]);
    }
}
