//! The SEV-SNP attestation report (AMD SEV-SNP ABI, `ATTESTATION_REPORT`), versions 2 to 5.
//!
//! Fields are read at their fixed offsets; the raw bytes are kept so that the signature is
//! checked over exactly what the firmware signed. TCB values are kept as raw 64-bit words
//! because their layout depends on the product (Turin moved the fields and added FMC), which
//! for version-2 reports is only known from the endorsement key.

use crate::report::TcbClaims;

/// Length of a report.
pub const REPORT_LEN: usize = 1184;
/// End of the signed region (exclusive).
pub const SIGNED_LEN: usize = 0x2A0;
/// Offset of REPORT_DATA.
pub const REPORT_DATA_OFFSET: usize = 0x50;
/// The only signature algorithm defined: ECDSA P-384 with SHA-384.
pub const SIG_ALGO_ECDSA_P384_SHA384: u32 = 1;

/// Errors when parsing a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnpAbiError {
    /// Wrong length.
    #[error("SNP report is {0} bytes, expected {REPORT_LEN}")]
    Length(usize),
    /// Version outside 2..=5.
    #[error("SNP report version {0} is not supported (2 to 5)")]
    Version(u32),
}

/// An AMD processor product line with SEV-SNP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Product {
    /// EPYC 7003 (Zen 3).
    Milan,
    /// EPYC 9004 (Zen 4).
    Genoa,
    /// EPYC 9005 (Zen 5).
    Turin,
}

impl Product {
    /// The product name as AMD's KDS spells it.
    pub fn name(self) -> &'static str {
        match self {
            Product::Milan => "Milan",
            Product::Genoa => "Genoa",
            Product::Turin => "Turin",
        }
    }

    /// Parses a product name (`Milan`, or a VCEK productName such as `Milan-B0`).
    pub fn from_name(name: &str) -> Option<Self> {
        let base = name.split('-').next().unwrap_or(name);
        match base {
            "Milan" => Some(Product::Milan),
            "Genoa" => Some(Product::Genoa),
            "Turin" => Some(Product::Turin),
            _ => None,
        }
    }

    /// The product for a CPUID family and model (reports version 3 and later).
    pub fn from_cpuid(family: u8, model: u8) -> Option<Self> {
        match (family, model) {
            (0x19, 0x00..=0x0F) => Some(Product::Milan),
            (0x19, 0x10..=0x1F | 0xA0..=0xAF) => Some(Product::Genoa),
            (0x1A, 0x00..=0x11) => Some(Product::Turin),
            _ => None,
        }
    }

    /// Whether TCB words use the Turin layout (FMC, bootloader, TEE, SNP, ..., microcode).
    pub fn turin_tcb_layout(self) -> bool {
        matches!(self, Product::Turin)
    }

    /// Decodes a raw TCB word for this product.
    pub fn decode_tcb(self, raw: u64) -> TcbClaims {
        let b = raw.to_le_bytes();
        if self.turin_tcb_layout() {
            TcbClaims {
                fmc: Some(b[0]),
                bootloader: b[1],
                tee: b[2],
                snp: b[3],
                microcode: b[7],
            }
        } else {
            TcbClaims {
                fmc: None,
                bootloader: b[0],
                tee: b[1],
                snp: b[6],
                microcode: b[7],
            }
        }
    }

    /// Encodes TCB components into this product's raw word.
    pub fn encode_tcb(self, tcb: &TcbClaims) -> u64 {
        let b = if self.turin_tcb_layout() {
            [
                tcb.fmc.unwrap_or(0),
                tcb.bootloader,
                tcb.tee,
                tcb.snp,
                0,
                0,
                0,
                tcb.microcode,
            ]
        } else {
            [tcb.bootloader, tcb.tee, 0, 0, 0, 0, tcb.snp, tcb.microcode]
        };
        u64::from_le_bytes(b)
    }
}

/// Which key signed the report (KEY_INFO bits 4:2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigningKey {
    /// The chip's VCEK.
    Vcek,
    /// A VLEK loaded by the cloud provider.
    Vlek,
    /// No key: the report is unsigned.
    None,
    /// A reserved value.
    Reserved(u8),
}

/// A parsed SEV-SNP report, with its raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnpReport {
    raw: Box<[u8; REPORT_LEN]>,
}

fn u32_at(b: &[u8; REPORT_LEN], off: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8; REPORT_LEN], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

fn array_at<const N: usize>(b: &[u8; REPORT_LEN], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[off..off + N]);
    out
}

impl SnpReport {
    /// Parses a report of exactly [`REPORT_LEN`] bytes, version 2 to 5.
    pub fn parse(bytes: &[u8]) -> Result<Self, SnpAbiError> {
        let raw: [u8; REPORT_LEN] = bytes
            .try_into()
            .map_err(|_| SnpAbiError::Length(bytes.len()))?;
        let report = Self { raw: Box::new(raw) };
        let version = report.version();
        if !(2..=5).contains(&version) {
            return Err(SnpAbiError::Version(version));
        }
        Ok(report)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; REPORT_LEN] {
        &self.raw
    }

    /// The signed region, 0x000..0x2A0.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.raw[..SIGNED_LEN]
    }

    /// Report format version.
    pub fn version(&self) -> u32 {
        u32_at(&self.raw, 0x00)
    }

    /// Guest SVN.
    pub fn guest_svn(&self) -> u32 {
        u32_at(&self.raw, 0x04)
    }

    /// Guest policy word.
    pub fn guest_policy(&self) -> u64 {
        u64_at(&self.raw, 0x08)
    }

    /// Guest policy bit 19: debugging allowed.
    pub fn debug_allowed(&self) -> bool {
        self.guest_policy() & (1 << 19) != 0
    }

    /// Guest policy bit 16: SMT allowed.
    pub fn smt_allowed(&self) -> bool {
        self.guest_policy() & (1 << 16) != 0
    }

    /// Guest policy bit 18: association with a migration agent allowed.
    pub fn migration_agent_allowed(&self) -> bool {
        self.guest_policy() & (1 << 18) != 0
    }

    /// VMPL of the requesting code.
    pub fn vmpl(&self) -> u32 {
        u32_at(&self.raw, 0x30)
    }

    /// Signature algorithm.
    pub fn signature_algo(&self) -> u32 {
        u32_at(&self.raw, 0x34)
    }

    /// KEY_INFO: which key signed the report.
    pub fn signing_key(&self) -> SigningKey {
        match (u32_at(&self.raw, 0x48) >> 2) & 0x7 {
            0 => SigningKey::Vcek,
            1 => SigningKey::Vlek,
            7 => SigningKey::None,
            other => SigningKey::Reserved(other as u8),
        }
    }

    /// REPORT_DATA.
    pub fn report_data(&self) -> [u8; 64] {
        array_at(&self.raw, REPORT_DATA_OFFSET)
    }

    /// Launch measurement.
    pub fn measurement(&self) -> [u8; 48] {
        array_at(&self.raw, 0x90)
    }

    /// HOST_DATA.
    pub fn host_data(&self) -> [u8; 32] {
        array_at(&self.raw, 0xC0)
    }

    /// REPORTED_TCB as a raw word.
    pub fn reported_tcb_raw(&self) -> u64 {
        u64_at(&self.raw, 0x180)
    }

    /// CPUID family and model (reports version 3 and later).
    pub fn cpuid(&self) -> Option<(u8, u8)> {
        (self.version() >= 3).then(|| (self.raw[0x188], self.raw[0x189]))
    }

    /// The product named by CPUID (reports version 3 and later).
    pub fn product_from_cpuid(&self) -> Option<Product> {
        self.cpuid().and_then(|(f, m)| Product::from_cpuid(f, m))
    }

    /// CHIP_ID (zeros when the host masked it).
    pub fn chip_id(&self) -> [u8; 64] {
        array_at(&self.raw, 0x1A0)
    }

    /// The signature as big-endian `r ‖ s` (96 bytes), or `None` when a component does not fit
    /// in 48 bytes (the upper 24 bytes of each 72-byte little-endian field must be zero).
    pub fn signature_p1363(&self) -> Option<[u8; 96]> {
        let r = &self.raw[0x2A0..0x2A0 + 72];
        let s = &self.raw[0x2A0 + 72..0x2A0 + 144];
        if r[48..].iter().chain(&s[48..]).any(|b| *b != 0) {
            return None;
        }
        let mut out = [0u8; 96];
        for i in 0..48 {
            out[i] = r[47 - i];
            out[48 + i] = s[47 - i];
        }
        Some(out)
    }

    /// Writes a big-endian `r ‖ s` signature into the report's little-endian fields.
    pub fn set_signature_p1363(&mut self, sig: &[u8; 96]) {
        let base = 0x2A0;
        self.raw[base..base + 144].fill(0);
        for i in 0..48 {
            self.raw[base + i] = sig[47 - i];
            self.raw[base + 72 + i] = sig[95 - i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank(version: u32) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..4].copy_from_slice(&version.to_le_bytes());
        b
    }

    #[test]
    fn rejects_bad_length_and_version() {
        assert_eq!(SnpReport::parse(&[0; 100]), Err(SnpAbiError::Length(100)));
        assert_eq!(SnpReport::parse(&blank(1)), Err(SnpAbiError::Version(1)));
        assert_eq!(SnpReport::parse(&blank(6)), Err(SnpAbiError::Version(6)));
        assert!(SnpReport::parse(&blank(5)).is_ok());
    }

    #[test]
    fn tcb_layouts_round_trip() {
        let tcb = TcbClaims {
            fmc: Some(1),
            bootloader: 2,
            tee: 3,
            snp: 4,
            microcode: 5,
        };
        let raw = Product::Turin.encode_tcb(&tcb);
        assert_eq!(Product::Turin.decode_tcb(raw), tcb);
        let legacy = TcbClaims { fmc: None, ..tcb };
        let raw = Product::Milan.encode_tcb(&legacy);
        assert_eq!(raw.to_le_bytes(), [2, 3, 0, 0, 0, 0, 4, 5]);
        assert_eq!(Product::Genoa.decode_tcb(raw), legacy);
    }

    #[test]
    fn signature_conversion_round_trips() {
        let mut report = SnpReport::parse(&blank(2)).unwrap();
        let mut sig = [0u8; 96];
        for (i, b) in sig.iter_mut().enumerate() {
            *b = i as u8;
        }
        report.set_signature_p1363(&sig);
        assert_eq!(report.signature_p1363(), Some(sig));
        assert_eq!(report.as_bytes()[0x2A0], 47);
    }
}
