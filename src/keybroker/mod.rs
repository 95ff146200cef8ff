//! The key broker (`inferno keybroker`) and its client in the appliance (`[model.key]
//! source = "broker"`, `inferno serve --key-broker URL`).
//!
//! A sealed model's key is wrapped (HPKE) to the broker's X25519 key in the manifest
//! (`inferno seal --recipient`). At start-up the appliance asks the broker for it: the broker
//! answers a challenge, the appliance sends fresh evidence whose runtime data binds the
//! challenge and an ephemeral X25519 key, the broker appraises the evidence under its release
//! policy and answers the model key sealed with HPKE to that ephemeral key. The exchange is
//! modelled on the Confidential Containers Trustee KBS protocol; `docs/sealed-model.md`
//! documents it.
//!
//! - [`protocol`]: the messages and constants;
//! - [`policy`]: the release policy (which measurements, server policies and key ids);
//! - [`server`]: the broker's HTTP server, with its audit log;
//! - [`client`]: the appliance side, with bounded retry.

pub mod client;
pub mod policy;
pub mod protocol;
pub mod server;

pub use client::{BrokerError, KeyRequest, request_key};
pub use policy::ReleasePolicy;
pub use server::Broker;
