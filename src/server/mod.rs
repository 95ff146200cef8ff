//! The OpenAI-compatible API served over TLS.
