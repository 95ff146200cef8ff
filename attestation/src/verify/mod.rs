//! Authenticity: is the evidence genuine? Signatures, certificate chains and collateral.
//! No policy is applied here beyond what authenticity itself requires.

pub mod snp;
pub mod tdx;
