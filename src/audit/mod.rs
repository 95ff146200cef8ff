//! The append-only, tamper-evident audit log.
