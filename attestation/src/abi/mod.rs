//! Byte layouts: parsing and serialisation of platform evidence, with no policy.

pub mod snp;
pub mod snp_certs;
pub mod tdx;
