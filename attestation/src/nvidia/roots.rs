//! NVIDIA's public trust anchors, built in.

use super::certs::pem_chain;
use super::error::GpuError;

/// "NVIDIA Device Identity CA" (ECDSA P-384, valid 2021-11-05 to 9999-12-31), the root of
/// every H100/H200 device certificate chain.
///
/// Provenance: NVIDIA/nvtrust, file
/// `guest_tools/gpu_verifiers/local_gpu_verifier/src/verifier/certs/verifier_device_root.pem`
/// (commit b75351ab108ff098076954e1a20e9479b51dabb7). Public data.
pub const NVIDIA_DEVICE_ROOT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIICCzCCAZCgAwIBAgIQLTZwscoQBBHB/sDoKgZbVDAKBggqhkjOPQQDAzA1MSIw
IAYDVQQDDBlOVklESUEgRGV2aWNlIElkZW50aXR5IENBMQ8wDQYDVQQKDAZOVklE
SUEwIBcNMjExMTA1MDAwMDAwWhgPOTk5OTEyMzEyMzU5NTlaMDUxIjAgBgNVBAMM
GU5WSURJQSBEZXZpY2UgSWRlbnRpdHkgQ0ExDzANBgNVBAoMBk5WSURJQTB2MBAG
ByqGSM49AgEGBSuBBAAiA2IABA5MFKM7+KViZljbQSlgfky/RRnEQScW9NDZF8SX
gAW96r6u/Ve8ZggtcYpPi2BS4VFu6KfEIrhN6FcHG7WP05W+oM+hxj7nyA1r1jkB
2Ry70YfThX3Ba1zOryOP+MJ9vaNjMGEwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8B
Af8EBAMCAQYwHQYDVR0OBBYEFFeF/4PyY8xlfWi3Olv0jUrL+0lfMB8GA1UdIwQY
MBaAFFeF/4PyY8xlfWi3Olv0jUrL+0lfMAoGCCqGSM49BAMDA2kAMGYCMQCPeFM3
TASsKQVaT+8S0sO9u97PVGCpE9d/I42IT7k3UUOLSR/qvJynVOD1vQKVXf0CMQC+
EY55WYoDBvs2wPAH1Gw4LbcwUN8QCff8bFmV4ZxjCRr4WXTLFHBKjbfneGSBWwA=
-----END CERTIFICATE-----
";

/// "NVIDIA CoRIM signing Root CA" (ECDSA P-384, valid 2023-03-16 to 2053-03-08), the root
/// of the RIM signer chains.
///
/// Provenance: NVIDIA/nvtrust, file
/// `guest_tools/gpu_verifiers/local_gpu_verifier/src/verifier/certs/verifier_RIM_root.pem`
/// (commit 0ab869a5cd454076801ab63baecae96f49302261). Public data.
pub const NVIDIA_RIM_ROOT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIICKTCCAbCgAwIBAgIQRdrjoA5QN73fh1N17LXicDAKBggqhkjOPQQDAzBFMQsw
CQYDVQQGEwJVUzEPMA0GA1UECgwGTlZJRElBMSUwIwYDVQQDDBxOVklESUEgQ29S
SU0gc2lnbmluZyBSb290IENBMCAXDTIzMDMxNjE1MzczNFoYDzIwNTMwMzA4MTUz
NzM0WjBFMQswCQYDVQQGEwJVUzEPMA0GA1UECgwGTlZJRElBMSUwIwYDVQQDDBxO
VklESUEgQ29SSU0gc2lnbmluZyBSb290IENBMHYwEAYHKoZIzj0CAQYFK4EEACID
YgAEuECyi9vNM+Iw2lfUzyBldHAwaC1HF7TCgp12QcEyUTm3Tagxwr48d55+K2VI
lWYIDk7NlAIQdcV/Ff7euGLI+Qauj93HsSI4WX298PpW54RTgz9tC+Q684caR/BX
WEeZo2MwYTAdBgNVHQ4EFgQUpaXrOPK4ZDAk08DBskn594zeZjAwHwYDVR0jBBgw
FoAUpaXrOPK4ZDAk08DBskn594zeZjAwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8B
Af8EBAMCAQYwCgYIKoZIzj0EAwMDZwAwZAIwHGDyscDP6ihHqRvZlI3eqZ4YkvjE
1duaN84tAHRVgxVMvNrp5Tnom3idHYGW/dskAjATvjIx6VzHm/4e2GiZAyZEIUBD
OKPzp5ei/A0iUZpdvngenDwV8Qa/wGdiTmJ7Bp4=
-----END CERTIFICATE-----
";

/// DER of the single certificate in `pem`.
fn single(pem: &str, name: &'static str) -> Result<Vec<u8>, GpuError> {
    let mut certs = pem_chain(pem.as_bytes(), name)?;
    match (certs.pop(), certs.is_empty()) {
        (Some(der), true) => Ok(der),
        _ => Err(GpuError::CertChain {
            chain: name,
            reason: "built-in root PEM must hold exactly one certificate".into(),
        }),
    }
}

/// DER of [`NVIDIA_DEVICE_ROOT_PEM`].
pub fn nvidia_device_root() -> Result<Vec<u8>, GpuError> {
    single(NVIDIA_DEVICE_ROOT_PEM, "device")
}

/// DER of [`NVIDIA_RIM_ROOT_PEM`].
pub fn nvidia_rim_root() -> Result<Vec<u8>, GpuError> {
    single(NVIDIA_RIM_ROOT_PEM, "RIM signer")
}
