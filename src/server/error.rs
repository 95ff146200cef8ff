//! OpenAI-style error responses: `{"error":{"message","type","param","code"}}` with a status.

use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use super::body::{Body, full};

/// An error returned to the client. The message is always safe to show: it never contains prompt
/// or completion text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// The OpenAI error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (HTTP 429 and 503).
    pub retry_after: Option<u64>,
    /// What went wrong inside the server, for the log line of the request only: never sent to
    /// the client, who gets `message` alone.
    pub cause: Option<Box<str>>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
            cause: None,
        }
    }

    /// HTTP 400 about the request (malformed JSON, a value out of range).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// HTTP 400 about one field.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid_request(message).with_param(param)
    }

    /// HTTP 401: the API key is missing or not accepted.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut err = Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
        err.code = Some("invalid_api_key");
        err
    }

    /// HTTP 404 for a model this server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        let mut err = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{model}` does not exist"),
        )
        .with_param("model");
        err.code = Some("model_not_found");
        err
    }

    /// HTTP 404 for an unknown path.
    pub fn route_not_found(path: &str) -> Self {
        let mut err = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no route for {path}"),
        );
        err.code = Some("not_found");
        err
    }

    /// HTTP 405 for a known path with another method.
    pub fn method_not_allowed(allowed: &'static str) -> Self {
        let mut err = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method not allowed; use {allowed}"),
        );
        err.code = Some("method_not_allowed");
        err
    }

    /// HTTP 408: the body did not arrive in time.
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "the request body did not arrive in time",
        )
    }

    /// HTTP 413: the body exceeds the configured limit.
    pub fn body_too_large(limit: usize) -> Self {
        let mut err = Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        );
        err.code = Some("request_too_large");
        err
    }

    /// HTTP 415: the body is not declared as `application/json`.
    pub fn unsupported_media_type(found: Option<&str>) -> Self {
        let found = match found {
            Some(value) => format!("`{}`", value.escape_debug()),
            None => "none".to_owned(),
        };
        let mut err = Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!(
                "the request body must be sent as Content-Type: application/json (got {found})"
            ),
        );
        err.code = Some("unsupported_media_type");
        err
    }

    /// HTTP 429: the engine's queue is full.
    pub fn queue_full(retry_after: u64) -> Self {
        let mut err = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server is at capacity; retry later",
        );
        err.code = Some("queue_full");
        err.retry_after = Some(retry_after);
        err
    }

    /// HTTP 429: a per-endpoint rate limit (e.g. attestation challenges) is reached.
    pub fn rate_limited(message: impl Into<String>, retry_after: u64) -> Self {
        let mut err = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message);
        err.code = Some("rate_limit_exceeded");
        err.retry_after = Some(retry_after);
        err
    }

    /// HTTP 503: the model is not loaded yet or the engine stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut err = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        );
        err.retry_after = Some(1);
        err
    }

    /// HTTP 500 with a message that is safe to show.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Sets the cause that the request's log line carries (the client does not see it).
    pub fn with_cause(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string().into_boxed_str());
        self
    }

    /// Sets the offending field.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        let envelope = Envelope {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&envelope).unwrap_or_else(|_| String::from("{}"))
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let mut response = Response::new(full(self.to_json()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_openai_shape() {
        let err = ApiError::invalid_param("temperature", "temperature must be in [0, 2]");
        let value: serde_json::Value = serde_json::from_str(&err.to_json()).unwrap();
        assert_eq!(value["error"]["message"], "temperature must be in [0, 2]");
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert_eq!(value["error"]["param"], "temperature");
        assert!(value["error"]["code"].is_null());
    }

    #[test]
    fn queue_full_sets_retry_after() {
        let response = ApiError::queue_full(7).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
    }

    #[test]
    fn unauthorized_asks_for_bearer() {
        let response = ApiError::unauthorized("no key").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
