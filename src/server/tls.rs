//! The server's TLS identity: TLS 1.3 only, ALPN `h2` and `http/1.1`, an ECDSA P-256 key pair
//! generated in memory at start (never written to disk), and a self-signed certificate for it.
//!
//! Until start-up evidence exists the certificate is plain; [`ServerIdentity::install_evidence`]
//! then issues a certificate for the same key that carries the evidence JSON in the non-critical
//! X.509 extension [`EVIDENCE_EXTENSION_OID`](inferno_attestation::runtime_data::EVIDENCE_EXTENSION_OID), and every later handshake presents it
//! (`docs/attestation-protocol.md`). A certificate and key from files cannot carry evidence
//! bound to a key that only this process holds, so the server has no such option.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use inferno_attestation::runtime_data::EVIDENCE_EXTENSION_OID_DER;
use rcgen::{CertificateParams, CustomExtension, KeyPair, SigningKey as _};
use ring::digest;
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use zeroize::Zeroizing;

/// Arcs of a stand-in OID that rcgen can write (its arcs are `u64`, the evidence OID's last arc
/// is 125 bits): `2.25.A.B` with A and B of nine base-128 digits each, so its DER content has
/// the length of [`EVIDENCE_EXTENSION_OID_DER`]. The signed certificate never contains it.
const STAND_IN_OID: &[u64] = &[2, 25, 0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321];

/// The certificate the server presents, ready for a TLS acceptor.
pub struct ServerIdentity {
    config: Arc<ServerConfig>,
    key: KeyPair,
    names: Vec<String>,
    resolver: Arc<CurrentCertificate>,
    spki_sha256: [u8; 32],
}

/// The certificate or key could not be generated or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating the key pair or a certificate failed.
    #[error("cannot generate the TLS key or certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The generated certificate could not be rewritten with the evidence extension.
    #[error("cannot build the certificate carrying the evidence: {0}")]
    Extension(String),
    /// rustls refused the certificate or key.
    #[error("the TLS certificate and key are not usable: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The certificate every handshake presents; replaced once evidence exists.
#[derive(Debug)]
struct CurrentCertificate {
    certified: RwLock<Arc<CertifiedKey>>,
}

impl CurrentCertificate {
    fn get(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.certified.read().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl ServerIdentity {
    /// Generates the key pair and a plain self-signed certificate valid for `localhost`,
    /// `127.0.0.1`, `::1` and `listen_host`.
    pub fn generate(listen_host: IpAddr) -> Result<Self, TlsError> {
        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        if !listen_host.is_unspecified() && !names.contains(&listen_host.to_string()) {
            names.push(listen_host.to_string());
        }
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(names.clone())?.self_signed(&key)?;
        let cert = cert.der().clone();
        let key_der = Zeroizing::new(key.serialize_der());
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(
            PrivatePkcs8KeyDer::from(key_der.to_vec()),
        ))?;
        let spki_sha256 = spki_sha256(&cert)?;
        let resolver = Arc::new(CurrentCertificate {
            certified: RwLock::new(Arc::new(CertifiedKey::new(vec![cert], signing_key))),
        });
        Ok(Self {
            config: build_config(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>)?,
            key,
            names,
            resolver,
            spki_sha256,
        })
    }

    /// Issues a certificate for the same key that carries `evidence_json` (the start-up
    /// evidence envelope, compact JSON) in the evidence extension; every later handshake
    /// presents it.
    pub fn install_evidence(&self, evidence_json: &[u8]) -> Result<(), TlsError> {
        let mut params = CertificateParams::new(self.names.clone())?;
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(
                STAND_IN_OID,
                evidence_json.to_vec(),
            ));
        let stand_in = params.self_signed(&self.key)?;
        let cert = CertificateDer::from(self.with_evidence_oid(stand_in.der())?);
        if spki_sha256(&cert)? != self.spki_sha256 {
            return Err(TlsError::Extension(
                "the new certificate names another key".to_owned(),
            ));
        }
        let previous = self.resolver.get();
        let certified = Arc::new(CertifiedKey::new(vec![cert], Arc::clone(&previous.key)));
        *self
            .resolver
            .certified
            .write()
            .unwrap_or_else(|e| e.into_inner()) = certified;
        Ok(())
    }

    /// Rewrites the stand-in OID of a certificate rcgen signed into [`EVIDENCE_EXTENSION_OID`](inferno_attestation::runtime_data::EVIDENCE_EXTENSION_OID)
    /// and signs the result again with the same key and algorithm.
    fn with_evidence_oid(&self, stand_in: &[u8]) -> Result<Vec<u8>, TlsError> {
        let bad = |what: &str| TlsError::Extension(what.to_owned());
        let (mut tbs, algorithm) = yasna::parse_der(stand_in, |reader| {
            reader.read_sequence(|reader| {
                let tbs = reader.next().read_der()?;
                let algorithm = reader.next().read_der()?;
                reader.next().read_bitvec_bytes()?;
                Ok((tbs, algorithm))
            })
        })
        .map_err(|e| TlsError::Extension(format!("rcgen's certificate does not parse: {e}")))?;
        let stand_in_oid = yasna::construct_der(|w| {
            w.write_oid(&yasna::models::ObjectIdentifier::from_slice(STAND_IN_OID))
        });
        let mut evidence_oid = vec![0x06, EVIDENCE_EXTENSION_OID_DER.len() as u8];
        evidence_oid.extend_from_slice(EVIDENCE_EXTENSION_OID_DER);
        if stand_in_oid.len() != evidence_oid.len() {
            return Err(bad(
                "the stand-in OID's length differs from the evidence OID's",
            ));
        }
        let mut found = tbs
            .windows(stand_in_oid.len())
            .enumerate()
            .filter(|(_, window)| *window == stand_in_oid.as_slice())
            .map(|(at, _)| at);
        let (Some(at), None) = (found.next(), found.next()) else {
            return Err(bad(
                "the stand-in OID is not in the certificate exactly once",
            ));
        };
        tbs[at..at + evidence_oid.len()].copy_from_slice(&evidence_oid);
        let signature = self.key.sign(&tbs)?;
        Ok(yasna::construct_der(|writer| {
            writer.write_sequence(|writer| {
                writer.next().write_der(&tbs);
                writer.next().write_der(&algorithm);
                writer
                    .next()
                    .write_bitvec_bytes(&signature, signature.len() * 8);
            });
        }))
    }

    /// The rustls configuration (its certificate follows [`Self::install_evidence`]).
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config)
    }

    /// SHA-256 of the DER SubjectPublicKeyInfo of the TLS key (the runtime data's
    /// `tls_spki_sha256`).
    pub fn spki_sha256(&self) -> [u8; 32] {
        self.spki_sha256
    }

    /// The certificate presented now, DER.
    pub fn certificate_der(&self) -> CertificateDer<'static> {
        self.resolver.get().cert[0].clone()
    }

    /// The certificate presented now, PEM (clients of this self-signed server trust it).
    pub fn cert_pem(&self) -> String {
        pem_encode_cert(&self.certificate_der())
    }

    /// SHA-256 of the certificate presented now, colon-separated uppercase hex.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.certificate_der())
    }
}

fn spki_sha256(cert: &CertificateDer<'_>) -> Result<[u8; 32], TlsError> {
    crate::attest::tls_spki_sha256(cert.as_ref()).map_err(|e| TlsError::Extension(e.to_string()))
}

fn build_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
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
    fn generated_identity_offers_only_tls13_and_both_alpns() {
        let identity = ServerIdentity::generate("10.1.2.3".parse().unwrap()).unwrap();
        assert_eq!(
            identity.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert_eq!(identity.fingerprint().len(), 32 * 3 - 1);
        assert!(
            identity
                .cert_pem()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
    }

    #[test]
    fn evidence_certificate_carries_the_extension_for_the_same_key_and_verifies() {
        let identity = ServerIdentity::generate("127.0.0.1".parse().unwrap()).unwrap();
        let plain = identity.certificate_der();
        let evidence = br#"{"platform":"sev-snp","x":"evidence"}"#;
        identity.install_evidence(evidence).unwrap();
        let cert = identity.certificate_der();
        assert_ne!(cert, plain);
        let parsed = inferno_attestation::pki::parse_certificate(cert.as_ref(), "test").unwrap();
        let extension = parsed
            .extensions()
            .iter()
            .find(|e| e.oid.as_bytes() == EVIDENCE_EXTENSION_OID_DER)
            .expect("the evidence extension");
        assert!(!extension.critical);
        assert_eq!(extension.value, evidence);
        assert_eq!(spki_sha256(&cert).unwrap(), identity.spki_sha256());
        // The re-signed certificate verifies under its own key.
        let spki = parsed.public_key();
        let key = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            spki.subject_public_key.data.as_ref(),
        );
        key.verify(
            parsed.tbs_certificate.as_ref(),
            parsed.signature_value.data.as_ref(),
        )
        .expect("the signature over the rewritten certificate verifies");
    }
}
