//! The server's view of the audit log: opens it from the configuration, seals content as the
//! policy says, and turns requests, completions and events into records.

use std::sync::Arc;

use super::config::AuditConfig;
use super::content::{ContentPolicy, SealedContent, read_key_file};
use super::error::AuditError;
use super::fileops::StdFileOps;
use super::note::NoteSigner;
use super::record::{CompletionRecord, RecordBody, RequestRecord, SecurityEvent};
use super::writer::{AuditLog, StartInfo};

/// What the server knows about a request when it accepts it.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The request id returned to the client.
    pub request_id: &'a str,
    /// The API key id of the caller.
    pub principal: &'a str,
    /// The endpoint path.
    pub endpoint: &'a str,
    /// The served model's digest.
    pub model_digest: &'a str,
    /// Whether the response is streamed.
    pub stream: bool,
    /// The prompt as received (the request body), sealed as the content policy says.
    pub prompt: &'a str,
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
    /// Opens the log in `config.dir` with a checkpoint key generated now. Use
    /// [`AuditSink::open_with_signer`] when the key must first be bound into attestation evidence.
    pub fn open(config: &AuditConfig, software_version: &str) -> Result<Self, AuditError> {
        let signer = AuditLog::generate_signer(config)?;
        Self::open_with_signer(
            config,
            signer,
            StartInfo {
                software_version: software_version.to_owned(),
                evidence: Vec::new(),
            },
        )
    }

    /// Opens the log with a signer whose key `start.evidence` binds.
    pub fn open_with_signer(
        config: &AuditConfig,
        signer: NoteSigner,
        start: StartInfo,
    ) -> Result<Self, AuditError> {
        let key = match &config.content_key_file {
            Some(path) => Some(read_key_file(path).map_err(|e| AuditError::Config(e.to_string()))?),
            None => None,
        };
        let content = ContentPolicy::new(config.content, key.as_deref())
            .map_err(|e| AuditError::Config(e.to_string()))?;
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

    /// Durably records an accepted request; the response must not start before this succeeds.
    pub async fn request(&self, facts: RequestFacts<'_>) -> Result<u64, AuditError> {
        let prompt = self.seal("prompt", facts.request_id, facts.prompt)?;
        let body = RecordBody::Request(RequestRecord {
            request_id: facts.request_id.to_owned(),
            principal: facts.principal.to_owned(),
            endpoint: facts.endpoint.to_owned(),
            model_digest: facts.model_digest.to_owned(),
            stream: facts.stream,
            prompt,
        });
        self.log.append(body).await
    }

    /// Records a finished request. The record is durable before the next checkpoint; the
    /// returned future resolves when it is durable (callers may spawn it).
    pub fn completion(
        &self,
        facts: CompletionFacts,
    ) -> impl Future<Output = Result<u64, AuditError>> + Send + 'static {
        let completion = match &facts.completion {
            Some(text) => self.seal("completion", &facts.request_id, text),
            None => Ok(SealedContent::None),
        };
        let append = completion.map(|completion| {
            self.log.append(RecordBody::Completion(CompletionRecord {
                request_id: facts.request_id,
                prompt_tokens: facts.prompt_tokens,
                completion_tokens: facts.completion_tokens,
                finish_reason: facts.finish_reason,
                status: facts.status,
                latency_ms: facts.latency_ms,
                completion,
            }))
        });
        async move { append?.await }
    }

    /// Durably records a security event.
    pub async fn event(&self, event: SecurityEvent) -> Result<u64, AuditError> {
        self.log.append(RecordBody::Event(event)).await
    }

    /// The content policy in force.
    pub fn content_mode(&self) -> super::content::ContentMode {
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
