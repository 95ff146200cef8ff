//! The server's view of the audit log: opens it from the configuration, seals content as the
//! policy says, and turns requests, completions and events into records.

use std::sync::Arc;

use crate::config::AuditConfig;
use crate::content::{ContentMode, ContentPolicy, SealedContent, read_key_file};
use crate::error::AuditError;
use crate::fileops::StdFileOps;
use crate::note::NoteSigner;
use crate::record::{CompletionRecord, ConstraintNote, RecordBody, RequestRecord, SecurityEvent};
use crate::writer::{Appended, AuditLog, StartInfo};

/// What the server knows about a request when it accepts it.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The request id the server generated and returned to the client.
    pub request_id: &'a str,
    /// The client's own request id, if it sent one (correlation only).
    pub client_request_id: Option<&'a str>,
    /// The API key id of the caller.
    pub principal: &'a str,
    /// The endpoint path.
    pub endpoint: &'a str,
    /// The served model's digest.
    pub model_digest: &'a str,
    /// Whether the response is streamed.
    pub stream: bool,
    /// The prompt as received (the request body), sealed as the content policy says; empty
    /// for a request refused before its body was read.
    pub prompt: &'a str,
    /// The HTTP status of a request answered without generation (a refusal, or another API
    /// endpoint); `None` for an accepted generation request, whose completion record follows.
    pub status: Option<u16>,
    /// The constraint's kind and grammar digest, for a constrained generation request.
    pub constraint: Option<(&'a str, &'a str)>,
    /// `Some("ohttp")` for a request sealed in Oblivious HTTP; `None` over TLS.
    pub transport: Option<&'a str>,
}

/// What the server knows about a request when it has answered it.
#[derive(Debug, Clone)]
pub struct CompletionFacts {
    /// The request id.
    pub request_id: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// The HTTP status sent.
    pub status: u16,
    /// Milliseconds from arrival to the end of the response.
    pub latency_ms: u64,
    /// The completion text, if the server has it (sealed as the content policy says).
    pub completion: Option<String>,
}

/// An open audit log with its content policy.
pub struct AuditSink {
    log: Arc<AuditLog>,
    content: ContentPolicy,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("log", &self.log)
            .field("content", &self.content)
            .finish()
    }
}

impl AuditSink {
    /// Opens the log in `config.dir` with a checkpoint key generated now, keeping `content` of
    /// prompts and completions. Use [`AuditSink::open_with_signer`] when the key must first be
    /// bound into attestation evidence.
    pub fn open(
        config: &AuditConfig,
        content: ContentMode,
        software_version: &str,
    ) -> Result<Self, AuditError> {
        let content = Self::content_policy(config, content)?;
        let signer = AuditLog::generate_signer(config)?;
        Self::open_with_signer(
            config,
            content,
            signer,
            StartInfo {
                software_version: software_version.to_owned(),
                evidence: Vec::new(),
            },
        )
    }

    /// The content policy for `content` with the key of `config.content_key_file`; fails when
    /// the mode needs a key and none is configured, or the key file is unusable.
    pub fn content_policy(
        config: &AuditConfig,
        content: ContentMode,
    ) -> Result<ContentPolicy, AuditError> {
        let key = match (&config.content_key_file, content.needs_key()) {
            (Some(path), true) => {
                Some(read_key_file(path).map_err(|e| AuditError::Config(e.to_string()))?)
            }
            _ => None,
        };
        ContentPolicy::new(content, key.as_deref()).map_err(|e| AuditError::Config(e.to_string()))
    }

    /// Opens the log with a signer whose key `start.evidence` binds, sealing prompts and
    /// completions with `content` (see [`AuditSink::content_policy`]).
    pub fn open_with_signer(
        config: &AuditConfig,
        content: ContentPolicy,
        signer: NoteSigner,
        start: StartInfo,
    ) -> Result<Self, AuditError> {
        let log = AuditLog::open(config, Arc::new(StdFileOps), signer, start)?;
        Ok(Self {
            log: Arc::new(log),
            content,
        })
    }

    /// The underlying log.
    pub fn log(&self) -> &Arc<AuditLog> {
        &self.log
    }

    /// Hands the request record to the writer at once; the returned future resolves to the
    /// record's receipt (index and leaf hash) once it is durable. The response must not start
    /// before it resolves successfully, but the caller may start the work (generation) meanwhile.
    pub fn request(
        &self,
        facts: RequestFacts<'_>,
    ) -> impl Future<Output = Result<Appended, AuditError>> + Send + 'static + use<> {
        let prompt = match facts.status {
            Some(_) if facts.prompt.is_empty() => Ok(SealedContent::None),
            _ => self.seal("prompt", facts.request_id, facts.prompt),
        };
        let append = prompt.map(|prompt| {
            self.log
                .append_with_leaf(RecordBody::Request(RequestRecord {
                    request_id: facts.request_id.to_owned(),
                    client_request_id: facts.client_request_id.map(str::to_owned),
                    principal: facts.principal.to_owned(),
                    endpoint: facts.endpoint.to_owned(),
                    model_digest: facts.model_digest.to_owned(),
                    stream: facts.stream,
                    prompt,
                    status: facts.status,
                    constraint: facts.constraint.map(|(kind, digest)| ConstraintNote {
                        kind: kind.to_owned(),
                        grammar_digest: digest.to_owned(),
                    }),
                    transport: facts.transport.map(str::to_owned),
                }))
        });
        async move { append?.await }
    }

    /// Records a finished request without waiting: the record is durable before the next
    /// checkpoint. Fails at once only if the log has failed (a later write failure is logged by
    /// the writer and fails the log).
    pub fn completion(&self, facts: CompletionFacts) -> Result<(), AuditError> {
        let completion = match &facts.completion {
            Some(text) => self.seal("completion", &facts.request_id, text)?,
            None => SealedContent::None,
        };
        self.log
            .append_detached(RecordBody::Completion(CompletionRecord {
                request_id: facts.request_id,
                prompt_tokens: facts.prompt_tokens,
                completion_tokens: facts.completion_tokens,
                finish_reason: facts.finish_reason,
                status: facts.status,
                latency_ms: facts.latency_ms,
                completion,
            }))
    }

    /// Durably records a security event.
    pub async fn event(&self, event: SecurityEvent) -> Result<u64, AuditError> {
        self.log.append(RecordBody::Event(event)).await
    }

    /// The content policy in force.
    pub fn content_mode(&self) -> ContentMode {
        self.content.mode()
    }

    /// Why the log failed, if it did: the server must then answer 503.
    pub fn failure(&self) -> Option<String> {
        self.log.failure()
    }

    /// The latest signed checkpoint.
    pub fn latest_checkpoint(&self) -> Option<String> {
        self.log.latest_checkpoint()
    }

    /// Records the stop event and the final checkpoint.
    pub async fn shutdown(&self, reason: &str) -> Result<String, AuditError> {
        self.log.shutdown(reason).await
    }

    fn seal(&self, label: &str, request_id: &str, text: &str) -> Result<SealedContent, AuditError> {
        self.content
            .seal(label, request_id, text)
            .map_err(|e| AuditError::Config(e.to_string()))
    }
}
