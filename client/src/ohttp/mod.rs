//! Oblivious HTTP (RFC 9458) to an Inferno server's gateway, through whatever sits in front of
//! it: a TLS-terminating load balancer or API gateway (`--upstream`), or an Oblivious relay
//! (`--relay`). Nothing on that path is trusted: the client fetches the key configuration,
//! asks for fresh evidence with a nonce sealed to that key, and seals requests only once the
//! evidence passes the client policy and names that key ([`appraise_gateway`]). Every request
//! is then sealed to the attested key, so the path sees neither prompt nor answer.
//!
//! `docs/ohttp.md` describes the exchange.

mod appraisal;
mod message;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::io::{AsyncReadExt, AsyncWriteExt};
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};
use http::{HeaderMap, StatusCode};
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::evidence::Evidence;
use ring::rand::{SecureRandom, SystemRandom};
use time::OffsetDateTime;

pub use appraisal::{GatewayObservation, appraise_gateway};

use crate::appraisal::TrustReport;
use crate::connect::{ClientError, NONCE_LEN};
use crate::policy::LoadedClientPolicy;

/// Where the key configuration is served (RFC 9540).
pub const KEYS_PATH: &str = "/.well-known/ohttp-gateway";
/// The gateway resource.
pub const GATEWAY_PATH: &str = "/v1/ohttp";
/// How long fetching the key configuration or one sealed exchange's head may take.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The largest key configuration or whole sealed answer read.
const MAX_RESPONSE: usize = 16 << 20;
/// How many plaintext bytes one read of a streamed answer returns at most.
const READ_CHUNK: usize = 16 << 10;

/// The path to a gateway: the server's origin behind whatever terminates TLS, and optionally
/// an Oblivious relay resource that forwards sealed requests to the gateway.
#[derive(Debug, Clone)]
pub struct GatewayTarget {
    origin: String,
    relay: Option<String>,
}

impl GatewayTarget {
    /// `upstream`: `https://HOST:PORT` (or `http://`) where `/.well-known/ohttp-gateway` and
    /// `/v1/ohttp` are reached; `relay`: the full URL of a relay resource, if requests go
    /// through one.
    pub fn new(upstream: &str, relay: Option<&str>) -> Result<Self, ClientError> {
        let bad = |address: &str, reason: &str| ClientError::Address {
            address: address.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = upstream
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(upstream, &e.to_string()))?;
        if !matches!(uri.scheme_str(), Some("https" | "http")) {
            return Err(bad(upstream, "the scheme must be https or http"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad(
                upstream,
                "give the server's origin only, without a path",
            ));
        }
        if uri.authority().is_none() {
            return Err(bad(upstream, "no host"));
        }
        if let Some(relay) = relay {
            let relay_uri: http::Uri = relay
                .parse()
                .map_err(|e: http::uri::InvalidUri| bad(relay, &e.to_string()))?;
            if !matches!(relay_uri.scheme_str(), Some("https" | "http")) {
                return Err(bad(relay, "the scheme must be https or http"));
            }
        }
        Ok(Self {
            origin: upstream.trim_end_matches('/').to_owned(),
            relay: relay.map(str::to_owned),
        })
    }

    fn keys_url(&self) -> String {
        format!("{}{KEYS_PATH}", self.origin)
    }

    fn gateway_url(&self) -> String {
        self.relay
            .clone()
            .unwrap_or_else(|| format!("{}{GATEWAY_PATH}", self.origin))
    }
}

impl std::fmt::Display for GatewayTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.relay {
            Some(relay) => write!(f, "{} (Oblivious HTTP through {relay})", self.origin),
            None => write!(f, "{} (Oblivious HTTP)", self.origin),
        }
    }
}

/// A gateway whose key configuration passed the client policy.
#[derive(Debug, Clone)]
pub struct VerifiedGateway {
    /// The encoded key configuration every request is sealed to.
    pub key_config: Vec<u8>,
    /// The appraisal that admitted it.
    pub report: TrustReport,
}

/// An opened answer: the inner response's status and header fields, and its content as it
/// arrives (whole, or chunk by chunk from a chunked answer).
pub struct OpenedResponse {
    /// The inner response's status.
    pub status: StatusCode,
    /// The inner response's header fields (the receipt headers among them).
    pub headers: HeaderMap,
    /// The inner response's content.
    pub body: BoxStream<'static, Result<Bytes, ClientError>>,
}

/// Seals requests to one gateway and judges it under one client policy.
#[derive(Clone)]
pub struct OhttpClient {
    http: reqwest::Client,
    target: GatewayTarget,
    policy: Arc<LoadedClientPolicy>,
    collateral: Option<Arc<CollateralBundle>>,
}

impl OhttpClient {
    /// A client for `target` judging by `policy`. The TLS of the path is not what is trusted
    /// (the attestation of the key is), so the path's certificate is not checked against
    /// WebPKI roots; the handshake signature still is.
    pub fn new(
        policy: LoadedClientPolicy,
        collateral: Option<CollateralBundle>,
        target: GatewayTarget,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(crate::tls::path_config())
            .connect_timeout(TIMEOUT)
            .build()
            .map_err(|err| ClientError::Connect {
                target: target.to_string(),
                reason: err.to_string(),
            })?;
        Ok(Self {
            http,
            target,
            policy: Arc::new(policy),
            collateral: collateral.map(Arc::new),
        })
    }

    /// The client policy.
    pub fn policy(&self) -> &LoadedClientPolicy {
        &self.policy
    }

    /// The path to the gateway.
    pub fn target(&self) -> &GatewayTarget {
        &self.target
    }

    fn failed(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Ohttp {
            target: self.target.to_string(),
            reason: reason.into(),
        }
    }

    /// Fetches the key configuration (the first of `application/ohttp-keys`); not yet trusted.
    pub async fn fetch_key_config(&self) -> Result<Vec<u8>, ClientError> {
        let response = tokio::time::timeout(TIMEOUT, self.http.get(self.target.keys_url()).send())
            .await
            .map_err(|_| self.failed("no key configuration within the time limit"))?
            .map_err(|err| ClientError::Connect {
                target: self.target.to_string(),
                reason: err.to_string(),
            })?;
        if !response.status().is_success() {
            return Err(self.failed(format!("{KEYS_PATH} answered HTTP {}", response.status())));
        }
        let list = read_limited(response, MAX_RESPONSE)
            .await
            .map_err(|reason| self.failed(reason))?;
        let len = list
            .get(..2)
            .map(|len| usize::from(u16::from_be_bytes([len[0], len[1]])))
            .ok_or_else(|| self.failed("the key configuration list is empty"))?;
        list.get(2..2 + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| self.failed("the key configuration list is truncated"))
    }

    /// Fetches the key configuration and fresh evidence for a random nonce sealed to it, and
    /// judges them: the gateway is returned only when every check passes.
    pub async fn verify(&self) -> Result<VerifiedGateway, ClientError> {
        let key_config = self.fetch_key_config().await?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| self.failed("the system random number generator failed"))?;
        let observed = self.exchange(&key_config, &nonce).await?;
        let report = self.appraise(&observed);
        if report.trusted() {
            Ok(VerifiedGateway { key_config, report })
        } else {
            Err(ClientError::Rejected {
                target: self.target.to_string(),
                report: Box::new(report),
            })
        }
    }

    /// Judges an observation with this client's policy and collateral, now.
    pub fn appraise(&self, observed: &GatewayObservation) -> TrustReport {
        appraise_gateway(
            observed,
            &self.policy,
            self.collateral.as_deref(),
            OffsetDateTime::now_utc(),
        )
    }

    /// The exchange without the verdict: `POST /v1/attestation` with `nonce`, sealed to
    /// `key_config`; returns what was observed. Callers must [`OhttpClient::appraise`] it
    /// before they seal anything else to that configuration.
    pub async fn exchange(
        &self,
        key_config: &[u8],
        nonce: &[u8],
    ) -> Result<GatewayObservation, ClientError> {
        let body = serde_json::json!({ "nonce": hex::encode(nonce) }).to_string();
        let request = http::Request::post("/v1/attestation")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Bytes::from(body))
            .map_err(|err| self.failed(err.to_string()))?;
        let attestation_err = |reason: String| ClientError::Attestation {
            target: self.target.to_string(),
            reason,
        };
        let response = self.send_sealed(key_config, request, false).await?;
        let bytes = collect(response.body).await?;
        if !response.status.is_success() {
            return Err(attestation_err(format!(
                "HTTP {}: {}",
                response.status,
                String::from_utf8_lossy(&bytes)
            )));
        }
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| attestation_err(format!("the answer is not JSON: {e}")))?;
        let evidence = value
            .get("evidence")
            .ok_or_else(|| attestation_err("the answer has no `evidence`".to_owned()))?;
        let fresh_evidence: Evidence = serde_json::from_value(evidence.clone())
            .map_err(|e| attestation_err(format!("the answer's evidence: {e}")))?;
        fresh_evidence
            .validate()
            .map_err(|e| attestation_err(format!("the answer's evidence: {e}")))?;
        Ok(GatewayObservation {
            key_config: key_config.to_vec(),
            nonce: nonce.to_vec(),
            fresh_evidence,
        })
    }

    /// Sends `request` sealed to the verified gateway; `chunked` asks for a chunked answer whose
    /// content arrives as the server produces it (server-sent events).
    pub async fn send(
        &self,
        gateway: &VerifiedGateway,
        request: http::Request<Bytes>,
        chunked: bool,
    ) -> Result<OpenedResponse, ClientError> {
        self.send_sealed(&gateway.key_config, request, chunked)
            .await
    }

    /// Seals `request` to `key_config`; returns the sealed bytes, their media type, and how to
    /// open the answer. For tests that look at or replay what goes on the wire.
    pub fn seal(
        &self,
        key_config: &[u8],
        request: &http::Request<Bytes>,
    ) -> Result<(Vec<u8>, ohttp::ClientResponse), ClientError> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let plain = message::encode_request(request, &date);
        let sealer = ohttp::ClientRequest::from_encoded_config(key_config)
            .map_err(|err| self.failed(format!("the key configuration is unusable: {err}")))?;
        sealer
            .encapsulate(&plain)
            .map_err(|err| self.failed(format!("the request could not be sealed: {err}")))
    }

    /// Posts sealed bytes to the gateway (through the relay, when there is one).
    pub async fn post(
        &self,
        media_type: &str,
        sealed: Vec<u8>,
    ) -> Result<reqwest::Response, ClientError> {
        tokio::time::timeout(
            TIMEOUT,
            self.http
                .post(self.target.gateway_url())
                .header(http::header::CONTENT_TYPE, media_type)
                .body(sealed)
                .send(),
        )
        .await
        .map_err(|_| self.failed("no answer within the time limit"))?
        .map_err(|err| ClientError::Connect {
            target: self.target.to_string(),
            reason: err.to_string(),
        })
    }

    async fn send_sealed(
        &self,
        key_config: &[u8],
        request: http::Request<Bytes>,
        chunked: bool,
    ) -> Result<OpenedResponse, ClientError> {
        if !chunked {
            let (sealed, opener) = self.seal(key_config, &request)?;
            let response = self.post("message/ohttp-req", sealed).await?;
            self.check_outer(&response, "message/ohttp-res")?;
            let bytes = read_limited(response, MAX_RESPONSE)
                .await
                .map_err(|reason| self.failed(reason))?;
            let plain = opener.decapsulate(&bytes).map_err(|_| {
                self.failed("the sealed answer could not be opened: it was altered on the way or is not from the gateway")
            })?;
            let (status, headers, content) =
                message::decode_response(&plain).map_err(|reason| self.failed(reason))?;
            let body = futures_util::stream::once(async move { Ok(content) }).boxed();
            return Ok(OpenedResponse {
                status,
                headers,
                body,
            });
        }
        let date = httpdate::fmt_http_date(SystemTime::now());
        let plain = message::encode_request(&request, &date);
        let sealer = ohttp::ClientRequest::from_encoded_config(key_config)
            .map_err(|err| self.failed(format!("the key configuration is unusable: {err}")))?;
        let buffer = SharedBuffer::default();
        let mut writer = sealer
            .encapsulate_stream(buffer.clone())
            .map_err(|err| self.failed(format!("the request could not be sealed: {err}")))?;
        let sealing = async {
            writer.write_all(&plain).await?;
            writer.close().await
        };
        sealing
            .await
            .map_err(|err| self.failed(format!("the request could not be sealed: {err}")))?;
        let response = self
            .post("message/ohttp-chunked-req", buffer.take())
            .await?;
        self.check_outer(&response, "message/ohttp-chunked-res")?;
        let target = self.target.to_string();
        let source = response
            .bytes_stream()
            .map_err(std::io::Error::other)
            .into_async_read();
        let opened = writer
            .response(source)
            .map_err(|err| self.failed(format!("the answer could not be opened: {err}")))?;
        let mut answer = <bhttp::Message as bhttp::stream::AsyncReadMessage>::async_read(opened);
        let opening_failed = |reason: String| ClientError::Ohttp {
            target: target.clone(),
            reason,
        };
        let head = tokio::time::timeout(TIMEOUT, answer.header())
            .await
            .map_err(|_| opening_failed("no answer within the time limit".to_owned()))?
            .map_err(|err| {
                opening_failed(format!(
                    "the sealed answer could not be opened ({err}): it was altered on the way or is not from the gateway"
                ))
            })?;
        let (status, headers) =
            message::head_of(head.control(), &head).map_err(|r| opening_failed(r.to_string()))?;
        let body = futures_util::stream::unfold(Some(answer), move |answer| {
            let target = target.clone();
            async move {
                let mut answer = answer?;
                let mut buffer = vec![0; READ_CHUNK];
                let read = match answer.body() {
                    Ok(mut body) => body.read(&mut buffer).await,
                    Err(_) => return None,
                };
                match read {
                    Ok(0) => None,
                    Ok(n) => {
                        buffer.truncate(n);
                        Some((Ok(Bytes::from(buffer)), Some(answer)))
                    }
                    Err(err) => Some((
                        Err(ClientError::Ohttp {
                            target,
                            reason: format!(
                                "the sealed answer broke off or was altered on the way: {err}"
                            ),
                        }),
                        None,
                    )),
                }
            }
        })
        .boxed();
        Ok(OpenedResponse {
            status,
            headers,
            body,
        })
    }

    /// A gateway that could not open the request answers in plain text: its message.
    fn check_outer(&self, response: &reqwest::Response, expected: &str) -> Result<(), ClientError> {
        let media = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if response.status().is_success() && media.eq_ignore_ascii_case(expected) {
            return Ok(());
        }
        Err(self.failed(format!(
            "the gateway answered HTTP {} ({media}) instead of a sealed answer",
            response.status()
        )))
    }
}

/// Collects an opened body.
pub async fn collect(
    body: BoxStream<'static, Result<Bytes, ClientError>>,
) -> Result<Bytes, ClientError> {
    let parts: Vec<Bytes> = body.try_collect().await?;
    Ok(Bytes::from(parts.concat()))
}

async fn read_limited(response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| format!("reading the answer: {err}"))?;
        if out.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The sealed request as the chunk writer produces it.
#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl futures_util::io::AsyncWrite for SharedBuffer {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
