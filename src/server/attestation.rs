//! `GET /v1/attestation`: the start-up evidence envelope, its runtime-data document and the
//! appraisal that admitted it, so that a client can verify the server (for example with
//! `inferno attest verify`) before it sends anything secret. Unauthenticated, like `/health`.

use http::{HeaderValue, Response, header};

use super::app::App;
use super::body::{Body, full};
use super::error::ApiError;

/// The attestation document as JSON.
pub fn document(app: &App) -> Result<Response<Body>, ApiError> {
    let attestation = app
        .attestation()
        .ok_or_else(|| ApiError::unavailable("the server has not attested yet"))?;
    let mut response = Response::new(full(attestation.to_json()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
