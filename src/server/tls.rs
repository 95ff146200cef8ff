//! The server's TLS configuration: TLS 1.3 only, ALPN `h2` and `http/1.1`, with a certificate
//! from PEM files or a self-signed one generated at start.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ring::digest;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use zeroize::Zeroizing;

use crate::config::TlsConfig;

/// The certificate the server presents, ready for a TLS acceptor.
pub struct ServerIdentity {
    /// The rustls configuration.
    pub config: Arc<ServerConfig>,
    /// The leaf certificate in PEM (clients of a self-signed server trust it).
    pub cert_pem: String,
    /// SHA-256 of the leaf certificate's DER, colon-separated uppercase hex.
    pub fingerprint: String,
    /// Whether the certificate was generated at start.
    pub self_signed: bool,
}

/// The certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file holds no usable item.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Generating the self-signed certificate failed.
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the certificate or key.
    #[error("the TLS certificate and key are not usable: {0}")]
    Rustls(#[from] rustls::Error),
}

impl ServerIdentity {
    /// Loads the configured certificate, or generates a self-signed one valid for `localhost`,
    /// `127.0.0.1`, `::1` and `listen_host`.
    pub fn from_config(tls: &TlsConfig, listen_host: IpAddr) -> Result<Self, TlsError> {
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => Self::from_pem_files(cert, key),
            _ => Self::self_signed(listen_host),
        }
    }

    /// Loads a certificate chain and private key from PEM files.
    pub fn from_pem_files(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let cert_pem = std::fs::read(cert_path).map_err(|source| TlsError::Read {
            path: cert_path.to_path_buf(),
            source,
        })?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| TlsError::Pem {
                path: cert_path.to_path_buf(),
                message: format!("invalid certificate PEM: {err}"),
            })?;
        let leaf = chain.first().ok_or_else(|| TlsError::Pem {
            path: cert_path.to_path_buf(),
            message: "no CERTIFICATE block found".to_owned(),
        })?;
        let leaf_pem = pem_encode_cert(leaf);
        let fingerprint = fingerprint(leaf);
        let key_pem = Zeroizing::new(std::fs::read(key_path).map_err(|source| TlsError::Read {
            path: key_path.to_path_buf(),
            source,
        })?);
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| TlsError::Pem {
            path: key_path.to_path_buf(),
            message: format!("no usable private key: {err}"),
        })?;
        Ok(Self {
            config: build_config(chain, key)?,
            cert_pem: leaf_pem,
            fingerprint,
            self_signed: false,
        })
    }

    /// Generates a fresh self-signed certificate and key.
    pub fn self_signed(listen_host: IpAddr) -> Result<Self, TlsError> {
        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        if !listen_host.is_unspecified() && !names.contains(&listen_host.to_string()) {
            names.push(listen_host.to_string());
        }
        let generated = rcgen::generate_simple_self_signed(names)?;
        let cert = generated.cert.der().clone();
        let key_der = Zeroizing::new(generated.signing_key.serialize_der());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der.to_vec()));
        Ok(Self {
            fingerprint: fingerprint(&cert),
            cert_pem: generated.cert.pem(),
            config: build_config(vec![cert], key)?,
            self_signed: true,
        })
    }
}

fn build_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// SHA-256 of a certificate's DER as colon-separated uppercase hex (`AB:CD:...`).
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let hash = digest::digest(&digest::SHA256, cert.as_ref());
    hash.as_ref()
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn pem_encode_cert(cert: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_offers_only_tls13_and_both_alpns() {
        let identity = ServerIdentity::self_signed("10.1.2.3".parse().unwrap()).unwrap();
        assert!(identity.self_signed);
        assert_eq!(
            identity.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert_eq!(identity.fingerprint.len(), 32 * 3 - 1);
        assert!(identity.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn pem_files_round_trip_with_the_same_fingerprint() {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cert_path = dir.path().join("cert.pem");
        let key_path = dir.path().join("key.pem");
        std::fs::write(&cert_path, generated.cert.pem()).unwrap();
        std::fs::write(&key_path, generated.signing_key.serialize_pem()).unwrap();
        let identity = ServerIdentity::from_pem_files(&cert_path, &key_path).unwrap();
        assert!(!identity.self_signed);
        assert_eq!(identity.fingerprint, fingerprint(generated.cert.der()));
        let reparsed = CertificateDer::from_pem_slice(identity.cert_pem.as_bytes()).unwrap();
        assert_eq!(&reparsed, generated.cert.der());
    }

    #[test]
    fn missing_or_empty_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = ServerIdentity::from_pem_files(&empty, &empty)
            .err()
            .unwrap();
        assert!(err.to_string().contains("empty.pem"), "{err}");
        let absent = dir.path().join("absent.pem");
        let err = ServerIdentity::from_pem_files(&absent, &absent)
            .err()
            .unwrap();
        assert!(err.to_string().contains("absent.pem"), "{err}");
    }
}
