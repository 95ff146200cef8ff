//! Byte layouts: parsing and serialisation of platform evidence, with no policy.

pub mod snp;
pub mod tdx;
