//! NVIDIA Reference Integrity Manifests (RIMs): ISO SWID tags whose `Payload` lists golden
//! measurements, signed with an enveloped XML-DSig whose `KeyInfo` carries the signer chain.

use serde::{Deserialize, Serialize};

use super::error::GpuError;

/// Namespace of the XML-DSig elements.
const DSIG_NS: &str = "http://www.w3.org/2000/09/xmldsig#";
/// Namespace of the `HashN` attributes (SHA-384).
const SHA384_NS: &str = "http://www.w3.org/2001/04/xmlenc#sha384";

/// Which component a RIM describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RimKind {
    /// The GPU driver (its version is the driver version, e.g. `550.90.07`).
    Driver,
    /// The VBIOS (its version is the VBIOS version, e.g. `96.00.9F.00.01`).
    Vbios,
}

impl RimKind {
    /// Name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Vbios => "VBIOS",
        }
    }
}

/// A RIM document supplied by the collateral bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rim {
    /// Which component it describes.
    pub kind: RimKind,
    /// The SWID tag XML exactly as signed.
    #[serde(with = "crate::serde_b64")]
    pub xml: Vec<u8>,
}

/// One golden measurement of a RIM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Golden {
    /// 0-based RIM index (report block index minus one).
    pub index: u8,
    /// Whether the verifier must compare it.
    pub active: bool,
    /// Accepted values.
    pub alternatives: Vec<Vec<u8>>,
}

/// The parts of a RIM the verifier uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRim {
    /// `tagId` of the SWID tag.
    pub tag_id: String,
    /// `Meta/@colloquialVersion`: the driver or VBIOS version it describes.
    pub version: String,
    /// Golden measurements.
    pub golden: Vec<Golden>,
    /// Signer chain from `KeyInfo/X509Data`, leaf first, DER.
    pub signer_chain: Vec<Vec<u8>>,
}

impl ParsedRim {
    /// Parses a SWID tag.
    pub fn parse(xml: &[u8], kind: RimKind) -> Result<Self, GpuError> {
        let err = |reason: String| GpuError::Rim {
            rim: kind.name().to_string(),
            reason,
        };
        let text = std::str::from_utf8(xml).map_err(|e| err(format!("not UTF-8: {e}")))?;
        let doc = roxmltree::Document::parse(text).map_err(|e| err(format!("not XML: {e}")))?;
        let root = doc.root_element();
        if root.tag_name().name() != "SoftwareIdentity" {
            return Err(err("root element is not SoftwareIdentity".into()));
        }
        let tag_id = root.attribute("tagId").unwrap_or_default().to_string();
        let version = root
            .descendants()
            .find(|n| n.tag_name().name() == "Meta")
            .and_then(|m| m.attribute("colloquialVersion"))
            .ok_or_else(|| err("no Meta/@colloquialVersion".into()))?
            .to_string();
        let mut golden = Vec::new();
        for res in root.descendants().filter(|n| {
            n.tag_name().name() == "Resource" && n.attribute("type") == Some("Measurement")
        }) {
            let index: u8 = res
                .attribute("index")
                .and_then(|i| i.parse().ok())
                .ok_or_else(|| err("Resource without a valid index".into()))?;
            let active = res
                .attribute("active")
                .is_some_and(|a| a.eq_ignore_ascii_case("true"));
            let count: usize = res
                .attribute("alternatives")
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| {
                    err(format!(
                        "Resource {index} without a valid alternatives count"
                    ))
                })?;
            let mut alternatives = Vec::with_capacity(count);
            for alt in 0..count {
                let name = format!("Hash{alt}");
                let value = res
                    .attributes()
                    .find(|a| a.name() == name && a.namespace() == Some(SHA384_NS))
                    .ok_or_else(|| err(format!("Resource {index} lacks SHA-384 {name}")))?;
                alternatives.push(
                    hex::decode(value.value())
                        .map_err(|_| err(format!("Resource {index} {name} is not hex")))?,
                );
            }
            golden.push(Golden {
                index,
                active,
                alternatives,
            });
        }
        let signer_chain = root
            .descendants()
            .filter(|n| {
                n.tag_name().name() == "X509Certificate"
                    && n.tag_name().namespace() == Some(DSIG_NS)
            })
            .map(|n| {
                let b64: String = n.text().unwrap_or_default().split_whitespace().collect();
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64)
                    .map_err(|e| err(format!("KeyInfo certificate is not base64: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            tag_id,
            version,
            golden,
            signer_chain,
        })
    }
}
