//! The operator's TOML configuration file. Every option has a default.
