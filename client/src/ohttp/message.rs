//! Binary HTTP (RFC 9292) on the client side: a request as a known-length message, and the
//! answer read whole or, from a chunked response, as it arrives.

use std::io::Cursor;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// Header fields that describe one hop, not the message: never sealed.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// `request` as a known-length Binary HTTP request (scheme `https`, no authority: the
/// gateway serves its own API), with `date` added (RFC 9458 §6.5).
pub fn encode_request(request: &http::Request<Bytes>, date: &str) -> Vec<u8> {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    let mut message = bhttp::Message::request(
        request.method().as_str().as_bytes().to_vec(),
        b"https".to_vec(),
        Vec::new(),
        path.as_bytes().to_vec(),
    );
    for (name, value) in request.headers() {
        let hop = HOP_BY_HOP.contains(&name.as_str());
        if hop || name == http::header::CONTENT_LENGTH || name == http::header::DATE {
            continue;
        }
        message.put_header(name.as_str(), value.as_bytes());
    }
    message.put_header("date", date);
    message.write_content(request.body());
    let mut out = Vec::with_capacity(request.body().len() + 512);
    // Writing into a vector cannot fail.
    let _ = message.write_bhttp(bhttp::Mode::KnownLength, &mut out);
    out
}

/// The status and header fields of a Binary HTTP response.
pub fn head_of(
    control: &bhttp::ControlData,
    fields: &bhttp::FieldSection,
) -> Result<(StatusCode, HeaderMap), String> {
    let status = control
        .status()
        .and_then(|status| StatusCode::from_u16(status.code()).ok())
        .ok_or("the sealed answer is not an HTTP response")?;
    let mut headers = HeaderMap::new();
    for field in fields.fields() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(field.name()),
            HeaderValue::from_bytes(field.value()),
        ) else {
            return Err("the sealed answer has an invalid header field".to_owned());
        };
        headers.append(name, value);
    }
    Ok((status, headers))
}

/// A whole Binary HTTP response: status, header fields and content.
pub fn decode_response(bytes: &[u8]) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let message = bhttp::Message::read_bhttp(&mut Cursor::new(bytes))
        .map_err(|err| format!("the sealed answer is not a Binary HTTP message: {err}"))?;
    let (status, headers) = head_of(message.control(), message.header())?;
    Ok((status, headers, Bytes::copy_from_slice(message.content())))
}
