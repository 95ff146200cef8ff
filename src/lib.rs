//! Inferno: a confidential-computing LLM inference appliance.
//!
//! The crate is organised by responsibility; `docs/architecture.md` explains how a request flows
//! through the parts:
//! - [`model`]: Hugging Face model directories (config, safetensors weights, tokenizer, chat
//!   template, model digest);
//! - [`engine`]: the continuous-batching engine shared by every backend (paged KV cache,
//!   scheduler, prefix cache, sampling, stopping, detokenization);
//! - [`backend`]: forward-pass implementations (the CPU reference and the CUDA backend);
//! - [`seal`]: sealed (encrypted) model weights: format, sealing, opening at load;
//! - [`server`]: the OpenAI-compatible HTTPS API;
//! - [`attest`]: start-up attestation of the server (evidence binding its keys and policy);
//! - [`harden`]: hardening of the serving process (no dumps or ptrace, locked keys, user drop);
//! - [`netlimits`]: the accept loop and timeouts of the plain-HTTP listeners (proxy, key broker);
//! - [`cli`]: the `inferno` command line.
//!
//! The append-only, tamper-evident audit log is its own crate, `inferno-audit` (`audit/`).

#![warn(missing_docs)]

pub mod attest;
pub mod backend;
pub mod cli;
pub mod config;
pub mod constrain;
pub mod engine;
pub mod harden;
pub mod keybroker;
pub mod model;
pub mod netlimits;
pub mod seal;
pub mod server;
pub mod startup;
