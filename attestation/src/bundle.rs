//! The offline collateral bundle: one versioned JSON file holding every piece of vendor
//! collateral a verifier needs, so that nothing reaches the network at verification time.
//! `docs/collateral-bundle.md` is the normative description.

use serde::{Deserialize, Serialize};

use crate::evidence::Base64Bytes;

/// Intel collateral in dcap-qvl's layout, re-exported for bundle builders.
pub use dcap_qvl::QuoteCollateralV3;

/// The only bundle version this crate produces and accepts.
pub const BUNDLE_VERSION: u32 = 1;

/// Errors when loading a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The file could not be read.
    #[error("cannot read collateral bundle {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Malformed JSON.
    #[error("collateral bundle is not valid JSON of version {BUNDLE_VERSION}: {0}")]
    Json(#[from] serde_json::Error),
    /// Another version.
    #[error("collateral bundle version {found} is not supported (expected {BUNDLE_VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
}

/// AMD KDS collateral: endorsement keys, intermediates and CRLs (all DER, base64).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmdCollateral {
    /// VCEK certificates.
    #[serde(default)]
    pub vcek: Vec<Base64Bytes>,
    /// VLEK certificates.
    #[serde(default)]
    pub vlek: Vec<Base64Bytes>,
    /// ASK and ASVK certificates (intermediates). Built-in ASKs need not be included.
    #[serde(default)]
    pub intermediates: Vec<Base64Bytes>,
    /// Extra ARK certificates. They are trusted only when a policy names their fingerprint.
    #[serde(default)]
    pub ark: Vec<Base64Bytes>,
    /// CRLs signed by an ARK.
    #[serde(default)]
    pub crl: Vec<Base64Bytes>,
}

/// Intel PCS collateral for one platform (dcap-qvl's `QuoteCollateralV3` JSON layout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntelCollateral {
    /// The FMSPC (hex) this collateral is for, when known; used to pick collateral for a quote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fmspc: Option<String>,
    /// The collateral.
    pub collateral: QuoteCollateralV3,
}

/// A named opaque file (an OCSP response).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedBlob {
    /// The file name it was built from.
    pub name: String,
    /// Its bytes, base64.
    pub data: Base64Bytes,
}

/// Which component an NVIDIA RIM describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RimComponent {
    /// The GPU driver.
    Driver,
    /// The VBIOS.
    Vbios,
}

/// An NVIDIA reference integrity manifest (SWID tag XML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RimFile {
    /// The file name it was built from.
    pub name: String,
    /// The component it describes.
    pub component: RimComponent,
    /// The XML bytes, base64.
    pub data: Base64Bytes,
}

/// NVIDIA collateral: reference integrity manifests and OCSP responses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvidiaCollateral {
    /// RIMs (SWID tags, XML).
    #[serde(default)]
    pub rims: Vec<RimFile>,
    /// DER OCSP responses for the GPU and RIM certificate chains.
    #[serde(default)]
    pub ocsp: Vec<NamedBlob>,
}

/// The collateral bundle, version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollateralBundle {
    /// Always [`BUNDLE_VERSION`].
    pub version: u32,
    /// When the bundle was assembled (RFC 3339; informational, not signed).
    pub created: String,
    /// AMD collateral.
    #[serde(default)]
    pub amd: AmdCollateral,
    /// Intel collateral, one entry per platform.
    #[serde(default)]
    pub intel: Vec<IntelCollateral>,
    /// NVIDIA collateral.
    #[serde(default)]
    pub nvidia: NvidiaCollateral,
}

impl CollateralBundle {
    /// An empty bundle stamped with `created`.
    pub fn empty(created: String) -> Self {
        Self {
            version: BUNDLE_VERSION,
            created,
            amd: AmdCollateral::default(),
            intel: Vec::new(),
            nvidia: NvidiaCollateral::default(),
        }
    }

    /// Decodes and version-checks a bundle.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, BundleError> {
        let bundle: Self = serde_json::from_slice(bytes)?;
        if bundle.version != BUNDLE_VERSION {
            return Err(BundleError::Version {
                found: bundle.version,
            });
        }
        Ok(bundle)
    }

    /// Reads and decodes a bundle file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, BundleError> {
        let bytes = std::fs::read(path).map_err(|source| BundleError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// The bundle as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_version() {
        let mut b = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
        b.amd.vcek.push(Base64Bytes(vec![1, 2, 3]));
        b.nvidia.rims.push(RimFile {
            name: "x.swidtag".into(),
            component: RimComponent::Driver,
            data: Base64Bytes(b"<x/>".to_vec()),
        });
        let json = b.to_json();
        assert_eq!(CollateralBundle::from_bytes(json.as_bytes()).unwrap(), b);
        let v2 = json.replace("\"version\": 1", "\"version\": 2");
        assert!(matches!(
            CollateralBundle::from_bytes(v2.as_bytes()),
            Err(BundleError::Version { found: 2 })
        ));
    }
}
