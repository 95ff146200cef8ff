//! SPDM 1.1 GET_MEASUREMENTS request and MEASUREMENTS response, as returned by an H100/H200.
//!
//! The evidence is the 37-byte request followed by the response. The signature (ECDSA P-384,
//! raw r‖s, 96 bytes) covers the request and the response up to the signature. It is located
//! by walking the response fields, because some reports carry trailing bytes after it.

use super::error::GpuError;

/// Length of a GET_MEASUREMENTS request with a nonce and a slot id.
pub const REQUEST_LEN: usize = 37;
/// Length of the SPDM nonce.
pub const NONCE_LEN: usize = 32;
/// Length of a raw ECDSA P-384 signature.
pub const SIGNATURE_LEN: usize = 96;
/// GET_MEASUREMENTS request code.
const GET_MEASUREMENTS: u8 = 0xE0;
/// MEASUREMENTS response code.
const MEASUREMENTS: u8 = 0x60;
/// DMTF measurement specification bit.
const DMTF_SPEC: u8 = 0x01;

/// One measurement block (DMTF measurement specification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasurementBlock {
    /// 1-based block index.
    pub index: u8,
    /// DMTFSpecMeasurementValueType.
    pub value_type: u8,
    /// The measurement value (a SHA-384 digest on Hopper).
    pub value: Vec<u8>,
}

/// A parsed request/response pair with the positions needed to check the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpdmReport<'a> {
    /// SPDM version of the request (0x11 for 1.1).
    pub version: u8,
    /// The requester's nonce.
    pub request_nonce: [u8; NONCE_LEN],
    /// The responder's nonce.
    pub response_nonce: [u8; NONCE_LEN],
    /// Measurement blocks in report order.
    pub blocks: Vec<MeasurementBlock>,
    /// Opaque data (NVIDIA TLV fields).
    pub opaque: &'a [u8],
    /// Everything the signature covers: request ‖ response up to the signature.
    pub signed: &'a [u8],
    /// The raw r‖s signature.
    pub signature: &'a [u8],
    /// Number of bytes after the signature (ignored, but reported).
    pub trailing: usize,
}

/// Cursor over little-endian SPDM fields.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    message: &'static str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], GpuError> {
        let end = self.pos.checked_add(len).filter(|e| *e <= self.data.len());
        let end = end.ok_or_else(|| GpuError::Spdm {
            message: self.message,
            field,
            reason: format!(
                "truncated: needs {len} bytes at offset {}, {} left",
                self.pos,
                self.data.len().saturating_sub(self.pos)
            ),
        })?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, GpuError> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, GpuError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u24(&mut self, field: &'static str) -> Result<usize, GpuError> {
        let b = self.take(3, field)?;
        Ok(usize::from(b[0]) | usize::from(b[1]) << 8 | usize::from(b[2]) << 16)
    }

    fn bad(&self, field: &'static str, reason: String) -> GpuError {
        GpuError::Spdm {
            message: self.message,
            field,
            reason,
        }
    }
}

impl<'a> SpdmReport<'a> {
    /// Parses `request ‖ response`.
    pub fn parse(evidence: &'a [u8]) -> Result<Self, GpuError> {
        const REQ: &str = "GET_MEASUREMENTS request";
        const RESP: &str = "MEASUREMENTS response";
        if evidence.len() < REQUEST_LEN {
            return Err(GpuError::Spdm {
                message: REQ,
                field: "length",
                reason: format!("{} bytes, need {REQUEST_LEN}", evidence.len()),
            });
        }
        let mut req = Cursor {
            data: &evidence[..REQUEST_LEN],
            pos: 0,
            message: REQ,
        };
        let version = req.u8("SPDMVersion")?;
        let code = req.u8("RequestResponseCode")?;
        if code != GET_MEASUREMENTS {
            return Err(req.bad("RequestResponseCode", format!("{code:#04x} is not 0xE0")));
        }
        let attributes = req.u8("Param1")?;
        if attributes & 0x01 == 0 {
            return Err(req.bad("Param1", "signature was not requested".into()));
        }
        req.u8("Param2")?;
        let mut request_nonce = [0u8; NONCE_LEN];
        request_nonce.copy_from_slice(req.take(NONCE_LEN, "Nonce")?);
        req.u8("SlotIDParam")?;

        let mut resp = Cursor {
            data: &evidence[REQUEST_LEN..],
            pos: 0,
            message: RESP,
        };
        let resp_version = resp.u8("SPDMVersion")?;
        if resp_version != version {
            return Err(resp.bad(
                "SPDMVersion",
                format!("{resp_version:#04x} differs from the request's {version:#04x}"),
            ));
        }
        let code = resp.u8("RequestResponseCode")?;
        if code != MEASUREMENTS {
            return Err(resp.bad("RequestResponseCode", format!("{code:#04x} is not 0x60")));
        }
        resp.u8("Param1")?;
        resp.u8("Param2")?;
        let count = resp.u8("NumberOfBlocks")?;
        let record_len = resp.u24("MeasurementRecordLength")?;
        let record = resp.take(record_len, "MeasurementRecord")?;
        let blocks = parse_blocks(record, count)?;
        let mut response_nonce = [0u8; NONCE_LEN];
        response_nonce.copy_from_slice(resp.take(NONCE_LEN, "Nonce")?);
        let opaque_len = resp.u16("OpaqueLength")?;
        let opaque = resp.take(usize::from(opaque_len), "OpaqueData")?;
        let signed_len = REQUEST_LEN + resp.pos;
        let signature = resp.take(SIGNATURE_LEN, "Signature")?;
        Ok(Self {
            version,
            request_nonce,
            response_nonce,
            blocks,
            opaque,
            signed: &evidence[..signed_len],
            signature,
            trailing: resp.data.len() - resp.pos,
        })
    }
}

/// Parses `count` measurement blocks that must fill `record` exactly.
fn parse_blocks(record: &[u8], count: u8) -> Result<Vec<MeasurementBlock>, GpuError> {
    let mut c = Cursor {
        data: record,
        pos: 0,
        message: "MEASUREMENTS response",
    };
    let mut blocks = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let index = c.u8("MeasurementBlock.Index")?;
        let spec = c.u8("MeasurementBlock.MeasurementSpecification")?;
        if spec != DMTF_SPEC {
            return Err(c.bad(
                "MeasurementBlock.MeasurementSpecification",
                format!("block {index}: {spec:#04x} is not DMTF"),
            ));
        }
        let size = c.u16("MeasurementBlock.MeasurementSize")?;
        let body = c.take(usize::from(size), "MeasurementBlock.Measurement")?;
        let mut m = Cursor {
            data: body,
            pos: 0,
            message: "MEASUREMENTS response",
        };
        let value_type = m.u8("DMTFSpecMeasurementValueType")?;
        let value_size = m.u16("DMTFSpecMeasurementValueSize")?;
        let value = m.take(usize::from(value_size), "DMTFSpecMeasurementValue")?;
        if m.pos != body.len() {
            return Err(c.bad(
                "MeasurementBlock.MeasurementSize",
                format!("block {index}: size disagrees with its DMTF value size"),
            ));
        }
        if blocks.iter().any(|b: &MeasurementBlock| b.index == index) {
            return Err(c.bad("MeasurementBlock.Index", format!("duplicate index {index}")));
        }
        blocks.push(MeasurementBlock {
            index,
            value_type,
            value: value.to_vec(),
        });
    }
    if c.pos != record.len() {
        return Err(c.bad(
            "MeasurementRecordLength",
            format!("{} bytes left after {count} blocks", record.len() - c.pos),
        ));
    }
    Ok(blocks)
}
