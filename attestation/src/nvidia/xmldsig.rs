//! Enveloped XML-DSig verification of RIMs, delegated to libxmlsec1 (C14N 1.1, SHA-384,
//! ECDSA-SHA384) through a small C shim (`xmlsec_shim.c`, feature `rim-xmlsec`).
//!
//! The caller verifies the signer chain first; this checks that the document's single
//! reference covers the whole document and that the signature verifies under the signer.

/// Verifies the enveloped signature of `xml` with the key of the DER certificate `signer`.
#[cfg(feature = "rim-xmlsec")]
pub fn verify_enveloped(xml: &[u8], signer: &[u8]) -> Result<(), String> {
    use std::sync::Mutex;

    unsafe extern "C" {
        fn inferno_xmldsig_verify(
            xml: *const u8,
            xml_len: usize,
            cert_der: *const u8,
            cert_len: usize,
            err: *mut std::ffi::c_char,
            err_len: usize,
        ) -> std::ffi::c_int;
    }
    /// libxmlsec1 keeps global state; calls are serialised.
    static LOCK: Mutex<()> = Mutex::new(());

    let _guard = LOCK
        .lock()
        .map_err(|_| "XML-DSig lock poisoned".to_string())?;
    let mut err = [0 as std::ffi::c_char; 256];
    // SAFETY: the pointers and lengths describe live slices for the whole call; the shim
    // only reads them, writes at most `err.len()` bytes (NUL-terminated) into `err`, and
    // keeps no pointer after returning. Calls are serialised by LOCK.
    let rc = unsafe {
        inferno_xmldsig_verify(
            xml.as_ptr(),
            xml.len(),
            signer.as_ptr(),
            signer.len(),
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: the shim NUL-terminates `err` (snprintf) on every failure path, and the
        // buffer was zero-initialised, so it always holds a NUL within bounds.
        let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
        Err(msg.to_string_lossy().into_owned())
    }
}

/// Without feature `rim-xmlsec`, RIM signatures cannot be checked, so every RIM is refused.
#[cfg(not(feature = "rim-xmlsec"))]
pub fn verify_enveloped(_xml: &[u8], _signer: &[u8]) -> Result<(), String> {
    Err("built without XML-DSig support (feature `rim-xmlsec`)".into())
}
