//! NVIDIA opaque data in the MEASUREMENTS response: little-endian `type u16, size u16, value`
//! fields carrying the driver and VBIOS versions, the FWID and board identifiers.

use std::collections::BTreeMap;

use super::error::GpuError;

/// Field type of the driver version (NUL-terminated ASCII).
pub const FIELD_DRIVER_VERSION: u16 = 3;
/// Field type of the GPU info.
pub const FIELD_GPU_INFO: u16 = 4;
/// Field type of the VBIOS version (8 bytes).
pub const FIELD_VBIOS_VERSION: u16 = 6;
/// Field type of the board id.
pub const FIELD_BOARD_ID: u16 = 14;
/// Field type of the chip SKU (ASCII).
pub const FIELD_CHIP_SKU: u16 = 15;
/// Field type of the project (ASCII).
pub const FIELD_PROJECT: u16 = 17;
/// Field type of the project SKU (ASCII).
pub const FIELD_PROJECT_SKU: u16 = 18;
/// Field type of the firmware id (48 bytes, equal to the leaf certificate's DICE FWID).
pub const FIELD_FWID: u16 = 20;

/// Decoded opaque data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpaqueData {
    /// Raw value of every field by type (the last occurrence wins; duplicates are rejected).
    pub fields: BTreeMap<u16, Vec<u8>>,
}

impl OpaqueData {
    /// Parses the opaque-data TLV sequence.
    pub fn parse(data: &[u8]) -> Result<Self, GpuError> {
        let mut fields = BTreeMap::new();
        let mut pos = 0usize;
        while pos < data.len() {
            let header = data.get(pos..pos + 4).ok_or_else(|| {
                GpuError::OpaqueData(format!("truncated field header at offset {pos}"))
            })?;
            let kind = u16::from_le_bytes([header[0], header[1]]);
            let size = usize::from(u16::from_le_bytes([header[2], header[3]]));
            let value = data.get(pos + 4..pos + 4 + size).ok_or_else(|| {
                GpuError::OpaqueData(format!(
                    "field type {kind} at offset {pos}: {size} bytes overrun the data"
                ))
            })?;
            if fields.insert(kind, value.to_vec()).is_some() {
                return Err(GpuError::OpaqueData(format!(
                    "field type {kind} appears twice"
                )));
            }
            pos += 4 + size;
        }
        Ok(Self { fields })
    }

    /// The raw value of a required field.
    fn required(&self, kind: u16, name: &str) -> Result<&[u8], GpuError> {
        self.fields
            .get(&kind)
            .map(Vec::as_slice)
            .ok_or_else(|| GpuError::OpaqueData(format!("no {name} field (type {kind})")))
    }

    /// The driver version, e.g. `550.90.07`.
    pub fn driver_version(&self) -> Result<String, GpuError> {
        ascii(
            self.required(FIELD_DRIVER_VERSION, "driver version")?,
            "driver version",
        )
    }

    /// The VBIOS version as NVIDIA prints it, e.g. `96.00.9F.00.01`: the first four bytes
    /// as a little-endian word split into bytes, then the fifth byte.
    pub fn vbios_version(&self) -> Result<String, GpuError> {
        let v = self.required(FIELD_VBIOS_VERSION, "VBIOS version")?;
        if v.len() < 5 {
            return Err(GpuError::OpaqueData(format!(
                "VBIOS version has {} bytes, need at least 5",
                v.len()
            )));
        }
        Ok(format!(
            "{:02X}.{:02X}.{:02X}.{:02X}.{:02X}",
            v[3], v[2], v[1], v[0], v[4]
        ))
    }

    /// The firmware id (FWID).
    pub fn fwid(&self) -> Result<&[u8], GpuError> {
        self.required(FIELD_FWID, "FWID")
    }

    /// An optional ASCII field (chip SKU, project, project SKU), trimmed of NULs.
    pub fn text(&self, kind: u16) -> Option<String> {
        self.fields
            .get(&kind)
            .and_then(|v| ascii(v, "text field").ok())
    }

    /// An optional binary field as lower-case hex (board id, GPU info).
    pub fn hex(&self, kind: u16) -> Option<String> {
        self.fields.get(&kind).map(hex::encode)
    }
}

/// Decodes NUL-padded ASCII.
fn ascii(bytes: &[u8], name: &str) -> Result<String, GpuError> {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let text = &bytes[..end];
    if !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err(GpuError::OpaqueData(format!(
            "{name} is not printable ASCII"
        )));
    }
    Ok(String::from_utf8_lossy(text).into_owned())
}
