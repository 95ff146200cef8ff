//! Verify an Inferno server before sending it anything: connect over TLS, read the start-up
//! evidence from the certificate, ask for fresh evidence bound to this very connection, judge
//! both against a client policy, and only then hand the connection back.
//!
//! - [`policy`]: the client policy (TOML) of reference values and requirements;
//! - [`Client`]: connects and verifies ([`Client::connect`]), or reuses a recent verification of
//!   the same certificate ([`Client::connect_cached`]);
//! - [`appraise_connection`]: the checks on what one connection observed, each by name;
//! - [`TrustReport`]: the outcome;
//! - [`ohttp`]: the same trust through Oblivious HTTP (RFC 9458), for servers behind a
//!   TLS-terminating gateway or an Oblivious relay: the evidence names the key that every
//!   request is then sealed to.
//!
//! `docs/client.md` describes the exchange and every check; `docs/attestation-protocol.md` is
//! the wire protocol.

#![warn(missing_docs)]

mod appraisal;
mod certificate;
mod connect;
pub mod ohttp;
pub mod policy;
mod tls;

pub use appraisal::{Observation, TrustReport, appraise_connection};
pub use certificate::{CertificateClaims, read_certificate};
pub use connect::{Client, ClientError, NONCE_LEN, Target, VerificationCache, VerifiedConnection};
pub use inferno_attestation::report::{Check, Verdict};
