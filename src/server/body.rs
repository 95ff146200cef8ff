//! The response body type shared by every handler, and reading request bodies under limits.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use super::error::ApiError;

/// Every response body: a complete buffer or a stream of server-sent events.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Every request body the router reads: a connection's, or one unwrapped from an Oblivious HTTP
/// message (`src/server/ohttp/`), which the router serves in-process.
pub type RequestBody = UnsyncBoxBody<Bytes, BodyError>;

/// A request body could not be read (the connection failed mid-body).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub String);

/// `body` as a [`RequestBody`].
pub fn request_body<B>(body: B) -> RequestBody
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    body.map_err(|err| BodyError(err.to_string()))
        .boxed_unsync()
}

/// A body holding `data` in full.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed_unsync()
}

/// An empty body (the answer to `HEAD`; HTTP/2 then sends no DATA frame).
pub fn empty() -> Body {
    http_body_util::Empty::new().boxed_unsync()
}

/// Refuses (HTTP 415) a body not declared as JSON: `Content-Type` must be `application/json`,
/// with optional parameters such as `charset=utf-8`.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let value = headers.get(http::header::CONTENT_TYPE);
    let text = value.and_then(|value| value.to_str().ok());
    let media_type = text.map(|text| text.split(';').next().unwrap_or("").trim());
    match media_type {
        Some(media) if media.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => {
            let shown = value.map(|value| String::from_utf8_lossy(value.as_bytes()));
            // Only a short prefix of a client-chosen header goes into the message.
            let shown = shown.map(|s| s.chars().take(64).collect::<String>());
            Err(ApiError::unsupported_media_type(shown.as_deref()))
        }
    }
}

/// Reads a request body of at most `limit` bytes within `timeout`.
///
/// A `Content-Length` above the limit is refused before anything is read (HTTP 413); a body
/// that grows past the limit while streaming is refused too, and one that does not arrive in
/// time gets HTTP 408.
pub async fn read_limited<B>(
    headers: &HeaderMap,
    body: B,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect())
        .await
        .map_err(|_| ApiError::body_timeout())?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(err) => Err(ApiError::invalid_request(format!(
            "failed to read the request body: {err}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_bodies_are_accepted() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::CONTENT_TYPE, value.parse().unwrap());
            require_json(&headers)
        };
        assert!(with("application/json").is_ok());
        assert!(with("Application/JSON; charset=utf-8").is_ok());
        for refused in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/jsonx",
        ] {
            let err = with(refused).unwrap_err();
            assert_eq!(
                err.status,
                http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{refused}"
            );
        }
        let err = require_json(&HeaderMap::new()).unwrap_err();
        assert_eq!(err.status, http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }

    #[tokio::test]
    async fn reads_a_body_within_the_limit() {
        let body = Full::new(Bytes::from_static(b"hello"));
        let bytes = read_limited(&HeaderMap::new(), body, 5, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"hello");
    }

    #[tokio::test]
    async fn refuses_a_body_over_the_limit() {
        let body = Full::new(Bytes::from_static(b"hello!"));
        let err = read_limited(&HeaderMap::new(), body, 5, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.status, http::StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn refuses_a_declared_length_over_the_limit() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_LENGTH, "1000".parse().unwrap());
        let body = Full::new(Bytes::new());
        let err = read_limited(&headers, body, 5, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.status, http::StatusCode::PAYLOAD_TOO_LARGE);
    }
}
