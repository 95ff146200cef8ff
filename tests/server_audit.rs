//! The server's audit records and the server policy's `[audit]` and `[auth]` tables, in-process
//! (the real server on 127.0.0.1:0, the embedded model on the CPU backend): every `/v1` request
//! gets a record, refusals included; the policy's content mode decides what records keep; the
//! policy's `require_api_key` and content mode refuse a start-up the configuration cannot serve.

mod server_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use inferno::config::Config;
use inferno::constrain::{ConstraintKind, ConstraintSource, ConstraintSpec};
use inferno::model::EMBEDDED_MODEL_NAME as MODEL;
use inferno::server::{Server, ServerError};
use inferno_audit::{
    AuditConfig, ConstraintNote, ContentMode, ContentPolicy, Record, RecordBody, SealedContent,
    VerifyOptions, read_records, verify,
};
use reqwest::StatusCode;
use serde_json::json;
use server_support::{ALICE, BOB, Harness, base_config, runtime};

/// `base_config` with an audit log in `dir`.
fn audited_config(dir: &Path) -> Config {
    let mut config = base_config();
    config.audit = Some(AuditConfig {
        dir: dir.to_path_buf(),
        ..AuditConfig::default()
    });
    config
}

/// Every record of the (stopped) log in `dir`.
fn records(dir: &Path) -> Vec<Record> {
    read_records(dir)
        .expect("the log reads")
        .into_iter()
        .map(|r| r.record)
        .collect()
}

/// The request records of the requests the client sent with `X-Request-Id: id`, and the number
/// of completion records matched to them by the server's own request ids.
fn records_of(records: &[Record], id: &str) -> (Vec<inferno_audit::RequestRecord>, usize) {
    let requests: Vec<inferno_audit::RequestRecord> = records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Request(q) if q.client_request_id.as_deref() == Some(id) => Some(q.clone()),
            _ => None,
        })
        .collect();
    let completions = records
        .iter()
        .filter(|r| {
            matches!(&r.body, RecordBody::Completion(c)
                if requests.iter().any(|q| q.request_id == c.request_id))
        })
        .count();
    (requests, completions)
}

/// Stops the server (the audit log writes its stop event and final checkpoint).
async fn stop(mut harness: Harness) {
    harness.take_server().shutdown().await;
}

/// Asserts that request `id` has exactly one record, a refusal with `status` by `principal`.
fn assert_refusal(records: &[Record], id: &str, status: u16, principal: &str, endpoint: &str) {
    let (requests, completions) = records_of(records, id);
    assert_eq!(requests.len(), 1, "{id}: {requests:?}");
    let record = &requests[0];
    assert_eq!(record.status, Some(status), "{id}: {record:?}");
    assert_eq!(record.principal, principal, "{id}: {record:?}");
    assert_eq!(record.endpoint, endpoint, "{id}: {record:?}");
    assert_eq!(record.prompt, SealedContent::None, "{id}");
    assert_eq!(completions, 0, "{id}: a refusal has no completion record");
}

#[tokio::test]
async fn every_api_request_gets_a_record_refusals_included() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let mut config = audited_config(&dir);
    config.limits.max_body_bytes = 4096;
    config.engine.max_num_seqs = Some(1);
    config.engine.max_waiting = 1;
    let server = Harness::start(config, true);
    let client = server.client();
    let url = server.url("/v1/completions");
    let ok = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4});
    let send = |id: &str, request: reqwest::RequestBuilder| {
        let request = request.header("x-request-id", id);
        async move { request.send().await.expect("sent").status() }
    };

    let accepted = send("ok", client.post(&url).bearer_auth(ALICE).json(&ok)).await;
    assert_eq!(accepted, StatusCode::OK);
    let no_key = send("no-key", client.post(&url).json(&ok)).await;
    assert_eq!(no_key, StatusCode::UNAUTHORIZED);
    let bad_key = send(
        "bad-key",
        client.post(&url).bearer_auth("sk-not-a-key-1234").json(&ok),
    )
    .await;
    assert_eq!(bad_key, StatusCode::UNAUTHORIZED);
    let malformed = send(
        "malformed",
        client
            .post(&url)
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .body("{\"model\": "),
    )
    .await;
    assert_eq!(malformed, StatusCode::BAD_REQUEST);
    let too_large = send(
        "too-large",
        client
            .post(&url)
            .bearer_auth(BOB)
            .header("content-type", "application/json")
            .body("x".repeat(8192)),
    )
    .await;
    assert_eq!(too_large, StatusCode::PAYLOAD_TOO_LARGE);
    let unknown = send(
        "unknown-route",
        client.get(server.url("/v1/nope")).bearer_auth(BOB),
    )
    .await;
    assert_eq!(unknown, StatusCode::NOT_FOUND);
    let wrong_method = send("wrong-method", client.get(&url)).await;
    assert_eq!(wrong_method, StatusCode::METHOD_NOT_ALLOWED);
    let models = send(
        "models",
        client.get(server.url("/v1/models")).bearer_auth(BOB),
    )
    .await;
    assert_eq!(models, StatusCode::OK);
    // Not an API request: no record.
    let health = send("health", client.get(server.url("/health"))).await;
    assert_eq!(health, StatusCode::OK);

    // Rate limiting: hold the running slot and the queue with long streams until one is
    // refused with 429.
    let long = json!({"model": MODEL, "prompt": "Tell me a long story", "max_tokens": 1900,
                      "ignore_eos": true, "stream": true});
    let mut held = Vec::new();
    let mut limited = None;
    for i in 0..6 {
        let id = format!("busy-{i}");
        let response = client
            .post(&url)
            .bearer_auth(ALICE)
            .header("x-request-id", &id)
            .json(&long)
            .send()
            .await
            .expect("sent");
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(id);
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    let limited = limited.expect("a request beyond the queue is refused");
    drop(held);
    stop(server).await;

    let all = records(&dir);
    let text: String = all
        .iter()
        .map(|r| String::from_utf8_lossy(&r.encode().expect("encodes")).into_owned())
        .collect();
    assert!(
        !text.contains("sk-not-a-key-1234"),
        "a presented key is never recorded"
    );
    let (ok_requests, ok_completions) = records_of(&all, "ok");
    assert_eq!(ok_requests.len(), 1);
    assert_eq!(ok_requests[0].status, None);
    assert_eq!(ok_requests[0].principal, "alice");
    assert_eq!(ok_completions, 1);
    let completions = "/v1/completions";
    assert_refusal(&all, "no-key", 401, "anonymous", completions);
    assert_refusal(&all, "bad-key", 401, "invalid-key", completions);
    assert_refusal(&all, "malformed", 400, "alice", completions);
    assert_refusal(&all, "too-large", 413, "bob", completions);
    assert_refusal(&all, "unknown-route", 404, "bob", "/v1/nope");
    assert_refusal(&all, "wrong-method", 405, "anonymous", completions);
    assert_refusal(&all, "models", 200, "bob", "/v1/models");
    assert_eq!(records_of(&all, "health").0.len(), 0);
    // A request refused by the engine was accepted first: its request record, then a
    // completion record with the 429.
    let (limited_requests, _) = records_of(&all, &limited);
    assert_eq!(limited_requests.len(), 1, "{limited}");
    assert_eq!(limited_requests[0].status, None);
    let limited_status = all.iter().find_map(|r| match &r.body {
        RecordBody::Completion(c) if c.request_id == limited_requests[0].request_id => {
            Some(c.status)
        }
        _ => None,
    });
    assert_eq!(limited_status, Some(429));

    let report = verify(&dir, &VerifyOptions::default());
    assert!(report.intact(), "{report:?}");
    assert!(report.incomplete.is_empty(), "{:?}", report.incomplete);
}

#[tokio::test]
async fn a_request_while_the_model_loads_is_recorded_with_its_503() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let server = Harness::start(audited_config(&dir), false);
    let response = server
        .post(
            "/v1/chat/completions",
            ALICE,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .header("x-request-id", "loading")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    stop(server).await;
    assert_refusal(
        &records(&dir),
        "loading",
        503,
        "alice",
        "/v1/chat/completions",
    );
}

#[tokio::test]
async fn a_constrained_request_is_recorded_with_its_kind_and_grammar_digest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let server = Harness::start(audited_config(&dir), true);
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"]
    });
    let messages = json!([{"role": "user", "content": "Is the sky blue?"}]);
    let bodies = [
        (
            "schema",
            json!({"model": MODEL, "messages": messages, "max_tokens": 16,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": true}}}),
        ),
        (
            "choice",
            json!({"model": MODEL, "messages": messages, "max_tokens": 4,
                "guided_choice": ["yes", "no"]}),
        ),
        (
            "free",
            json!({"model": MODEL, "messages": messages, "max_tokens": 4}),
        ),
    ];
    for (id, body) in &bodies {
        let response = server
            .post("/v1/chat/completions", ALICE, body)
            .header("x-request-id", *id)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{id}");
    }
    stop(server).await;

    let records = records(&dir);
    let note_of = |id: &str| {
        let (requests, completions) = records_of(&records, id);
        assert_eq!(requests.len(), 1, "{id}: {requests:?}");
        assert_eq!(completions, 1, "{id}");
        requests[0].constraint.clone()
    };
    let schema_spec = ConstraintSpec {
        kind: ConstraintKind::JsonSchema,
        source: ConstraintSource::JsonSchema(schema.clone()),
    };
    assert_eq!(
        note_of("schema"),
        Some(ConstraintNote {
            kind: "json_schema".into(),
            grammar_digest: schema_spec.digest(),
        })
    );
    let choice_spec = ConstraintSpec::choice(&["yes".to_owned(), "no".to_owned()]);
    assert_eq!(
        note_of("choice"),
        Some(ConstraintNote {
            kind: "choice".into(),
            grammar_digest: choice_spec.digest(),
        })
    );
    assert_ne!(schema_spec.digest(), choice_spec.digest());
    assert_eq!(note_of("free"), None);
    // The note names the grammar; the record does not carry the grammar itself.
    let raw = serde_json::to_string(&records).expect("records serialize");
    assert!(!raw.contains("\"enum\""), "the schema leaked into a record");
}

#[tokio::test]
async fn responses_and_embeddings_are_recorded_with_their_endpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let server = Harness::start(audited_config(&dir), true);
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"]
    });
    let responses = [
        (
            "responses-schema",
            json!({"model": MODEL, "input": "Is the sky blue?", "max_output_tokens": 16,
                "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}}),
        ),
        (
            "responses-stream",
            json!({"model": MODEL, "input": "Hi", "max_output_tokens": 4, "stream": true}),
        ),
    ];
    for (id, body) in &responses {
        let response = server
            .post("/v1/responses", ALICE, body)
            .header("x-request-id", *id)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{id}");
        response.text().await.expect("body");
    }
    // The embedded model is generative: its embeddings request is a recorded refusal.
    let refused = server
        .post(
            "/v1/embeddings",
            ALICE,
            &json!({"model": MODEL, "input": "x"}),
        )
        .header("x-request-id", "embeddings-refused")
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    stop(server).await;

    let embedder_dir = tmp.path().join("audit-embeddings");
    let embedder = Harness::start_model(
        audited_config(&embedder_dir),
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3-embedding"),
    );
    let response = embedder
        .post(
            "/v1/embeddings",
            ALICE,
            &json!({"model": "tiny-qwen3-embedding", "input": ["a", "bc"]}),
        )
        .header("x-request-id", "embeddings")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    stop(embedder).await;

    let records = records(&dir);
    let (schema_requests, completions) = records_of(&records, "responses-schema");
    assert_eq!(completions, 1);
    assert_eq!(schema_requests[0].endpoint, "/v1/responses");
    let spec = ConstraintSpec {
        kind: ConstraintKind::JsonSchema,
        source: ConstraintSource::JsonSchema(schema),
    };
    assert_eq!(
        schema_requests[0].constraint,
        Some(ConstraintNote {
            kind: "json_schema".into(),
            grammar_digest: spec.digest(),
        })
    );
    let (stream_requests, completions) = records_of(&records, "responses-stream");
    assert_eq!(
        (
            stream_requests[0].endpoint.as_str(),
            stream_requests[0].stream
        ),
        ("/v1/responses", true)
    );
    assert_eq!(completions, 1);
    assert_refusal(
        &records,
        "embeddings-refused",
        400,
        "alice",
        "/v1/embeddings",
    );
    let records = self::records(&embedder_dir);
    let (requests, completions) = records_of(&records, "embeddings");
    assert_eq!(requests[0].endpoint, "/v1/embeddings");
    assert_eq!(completions, 1);
    let completion = records
        .iter()
        .find_map(|r| match &r.body {
            RecordBody::Completion(c) if c.request_id == requests[0].request_id => Some(c.clone()),
            _ => None,
        })
        .expect("a completion record");
    assert_eq!(completion.completion_tokens, 0);
    assert!(completion.prompt_tokens >= 4, "{completion:?}");
    assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn an_enforced_tool_call_through_responses_is_recorded_as_through_chat() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let mut config = audited_config(&dir);
    // The embedded model's template shows no tool-call format.
    config.server.tool_call_parser = Some(inferno::server::openai::tools::ToolCallFormat::Hermes);
    let server = Harness::start(config, true);
    let parameters = json!({"type": "object", "properties": {"city": {"type": "string",
        "maxLength": 8}}, "required": ["city"], "additionalProperties": false});
    let bodies = [
        (
            "chat-tool",
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
                "max_tokens": 64, "parallel_tool_calls": false, "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "parameters": parameters}}]}),
        ),
        (
            "responses-tool",
            "/v1/responses",
            json!({"model": MODEL, "input": "Weather?", "max_output_tokens": 64,
                "parallel_tool_calls": false, "tool_choice": "required",
                "tools": [{"type": "function", "name": "get_weather",
                    "parameters": parameters}]}),
        ),
    ];
    for (id, path, body) in &bodies {
        let response = server
            .post(path, ALICE, body)
            .header("x-request-id", *id)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{id}");
        response.text().await.expect("body");
    }
    stop(server).await;

    let records = records(&dir);
    let (chat, chat_completions) = records_of(&records, "chat-tool");
    let (responses, responses_completions) = records_of(&records, "responses-tool");
    assert_eq!((chat_completions, responses_completions), (1, 1));
    assert_eq!(responses[0].endpoint, "/v1/responses");
    let note = chat[0]
        .constraint
        .clone()
        .expect("the enforced call is noted");
    assert_eq!(note.kind, "tool_call");
    assert_eq!(
        responses[0].constraint,
        Some(note),
        "same tools, same grammar"
    );
}

/// The development policy with `edit` applied, written to `dir/policy.toml`.
fn development_policy_with(dir: &Path, from: &str, to: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/development.toml");
    let text = std::fs::read_to_string(path).expect("development policy");
    assert!(text.contains(from), "{from}");
    let out = dir.join("policy.toml");
    std::fs::write(&out, text.replace(from, to)).expect("write policy");
    out
}

fn start_error(config: Config) -> ServerError {
    match runtime().block_on(Server::start(config)) {
        Ok(_) => panic!("the server started"),
        Err(err) => err,
    }
}

#[tokio::test]
async fn policy_content_mode_hmac_puts_keyed_hashes_in_the_records() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let key = [0x5a_u8; 32];
    let key_file = tmp.path().join("content.key");
    std::fs::write(&key_file, hex::encode(key)).expect("key file");
    let mut config = audited_config(&dir);
    config.attestation.policy = Some(development_policy_with(
        tmp.path(),
        "content = \"none\"",
        "content = \"hmac\"",
    ));
    if let Some(audit) = &mut config.audit {
        audit.content_key_file = Some(key_file);
    }
    let server = Harness::start(config, true);
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}).to_string();
    let response = server
        .client()
        .post(server.url("/v1/completions"))
        .bearer_auth(ALICE)
        .header("x-request-id", "hashed")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let answer = response.text().await.expect("body");
    stop(server).await;

    let all = records(&dir);
    let hmac = ContentPolicy::new(ContentMode::Hmac, Some(&key)).expect("policy");
    let (requests, _) = records_of(&all, "hashed");
    assert_eq!(requests.len(), 1);
    // Content is bound to the server's request id, not to the client's.
    let server_id = requests[0].request_id.clone();
    assert_eq!(
        requests[0].prompt,
        hmac.seal("prompt", &server_id, &body).expect("seal")
    );
    let completion = all.iter().find_map(|r| match &r.body {
        RecordBody::Completion(c) if c.request_id == server_id => Some(c.completion.clone()),
        _ => None,
    });
    assert_eq!(
        completion,
        Some(hmac.seal("completion", &server_id, &answer).expect("seal"))
    );
    assert!(matches!(completion, Some(SealedContent::Hmac { .. })));
}

#[test]
fn a_policy_content_mode_without_its_key_refuses_to_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let policy =
        development_policy_with(tmp.path(), "content = \"none\"", "content = \"encrypted\"");
    let mut config = audited_config(&tmp.path().join("audit"));
    config.attestation.policy = Some(policy.clone());
    let err = start_error(config).to_string();
    assert!(
        err.contains("`encrypted`") && err.contains("content_key_file"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!tmp.path().join("audit").exists(), "no log was opened");

    let mut config = base_config();
    config.attestation.policy = Some(policy);
    let err = start_error(config).to_string();
    assert!(err.contains("no [audit] table"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn require_api_key_without_keys_refuses_to_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = base_config();
    config.auth.keys.clear();
    config.attestation.policy = Some(development_policy_with(
        tmp.path(),
        "require_api_key = false",
        "require_api_key = true",
    ));
    let err = start_error(config.clone());
    assert!(
        matches!(&err, ServerError::ApiKeysRequired { policy } if policy.starts_with("development")),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("require_api_key") && text.contains("[[auth.keys]]"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    // With keys, the same policy serves, and a request without a key is refused.
    config.auth.keys = base_config().auth.keys;
    let server = Harness::start(config, false);
    let status = runtime().block_on(async {
        tokio::time::timeout(
            Duration::from_secs(60),
            server.client().get(server.url("/v1/models")).send(),
        )
        .await
        .expect("in time")
        .expect("sent")
        .status()
    });
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// Issue 14, defect 5: a content key file that other users may read is refused in the production
/// profile (before any log is opened) and only warned about in development.
#[test]
fn a_content_key_file_open_to_other_users_is_refused_in_production() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().expect("tempdir");
    let key_file = tmp.path().join("content.key");
    std::fs::write(&key_file, hex::encode([0x5a_u8; 32])).expect("key file");
    let policy = development_policy_with(tmp.path(), "content = \"none\"", "content = \"hmac\"");
    let config_with = |profile: inferno::config::AttestationProfile, log: &str| {
        let mut config = audited_config(&tmp.path().join(log));
        config.attestation.policy = Some(policy.clone());
        config.attestation.profile = profile;
        if let Some(audit) = &mut config.audit {
            audit.content_key_file = Some(key_file.clone());
        }
        config
    };
    use inferno::config::AttestationProfile::{Development, Production};

    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = start_error(config_with(Production, "audit"));
    assert!(
        matches!(err, ServerError::ContentKeyExposed { mode: 0o644, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("chmod 600"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(!tmp.path().join("audit").exists(), "no log was opened");

    // Owner-only, production gets past the key check (whatever else it then needs).
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    match runtime().block_on(Server::start(config_with(Production, "audit-0600"))) {
        Ok(server) => runtime().block_on(server.shutdown()),
        Err(err) => assert!(
            !matches!(err, ServerError::ContentKeyExposed { .. }),
            "{err}"
        ),
    }

    // Development serves with the open key file (and logs a warning).
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let server = Harness::start(config_with(Development, "audit-dev"), true);
    runtime().block_on(stop(server));
}

/// Issue 14, defect 2: records are matched by ids the server generates, so a client reusing an
/// id (to hide an incomplete request behind another's completion) or putting quotes in it
/// changes nothing but its own `client_request_id` field.
#[tokio::test]
async fn client_request_ids_never_match_records() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let server = Harness::start(audited_config(&dir), true);
    let forged = "dup\" principal=\"admin";
    let mut server_ids = Vec::new();
    for id in ["dup", "dup", "dup", forged] {
        let response = server
            .client()
            .post(server.url("/v1/completions"))
            .bearer_auth(ALICE)
            .header("x-request-id", id)
            .json(&json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2}))
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-client-request-id"], id);
        server_ids.push(
            response.headers()["x-request-id"]
                .to_str()
                .expect("ascii")
                .to_owned(),
        );
        response.bytes().await.expect("body");
    }
    stop(server).await;

    let unique: std::collections::HashSet<&String> = server_ids.iter().collect();
    assert_eq!(unique.len(), 4, "{server_ids:?}");
    let all = records(&dir);
    let (dups, completions) = records_of(&all, "dup");
    assert_eq!(dups.len(), 3);
    assert_eq!(completions, 3, "each request has its own completion");
    let (forged_records, _) = records_of(&all, forged);
    assert_eq!(forged_records.len(), 1);
    assert_eq!(forged_records[0].principal, "alice");
    for record in dups.iter().chain(&forged_records) {
        assert!(server_ids.contains(&record.request_id), "{record:?}");
    }
}

/// Sends raw bytes over a TLS HTTP/1.1 connection and returns what the server answers.
async fn raw_http1(server: &Harness, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tls = server.tls_connect(Some(b"http/1.1")).await;
    // The server may answer and close before it has read everything (headers over the limit).
    let _ = tls.write_all(request).await;
    let _ = tls.flush().await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Issue 14, defect 8.2: requests that hyper's HTTP/1 parser refuses itself (a malformed header
/// line: 400; headers over the limit: 431) are audited, after hyper's own response.
#[tokio::test]
async fn requests_the_http_parser_refuses_are_audited() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("audit");
    let server = Harness::start(audited_config(&dir), false);
    let malformed = raw_http1(
        &server,
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
    )
    .await;
    assert!(malformed.starts_with("HTTP/1.1 400"), "{malformed}");
    let huge = format!(
        "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let too_large = raw_http1(&server, huge.as_bytes()).await;
    assert!(too_large.starts_with("HTTP/1.1 431"), "{too_large}");
    // The records follow hyper's responses: give the connection tasks a moment to write them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(server).await;

    let statuses: Vec<u16> = records(&dir)
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Request(q) if q.endpoint == "(unparsed)" => q.status,
            _ => None,
        })
        .collect();
    assert_eq!(statuses, [400, 431]);
}

/// Issue 47, defect 6: a non-streamed request whose client goes away mid-generation gets a
/// completion record saying `client_disconnected` (as a stream does), not only its request
/// record, which `audit verify` would list as incomplete.
#[tokio::test]
async fn an_abandoned_non_streamed_request_is_recorded_as_client_disconnected() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let harness = Harness::start(audited_config(tmp.path()), true);
    let impatient = harness
        .client_builder()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("client");
    let sent = impatient
        .post(harness.url("/v1/chat/completions"))
        .bearer_auth(ALICE)
        .header("x-request-id", "abandoned")
        .json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me everything."}],
            "n": 16,
            "max_tokens": 1900,
            "ignore_eos": true,
        }))
        .send()
        .await;
    assert!(sent.is_err(), "the request finished within 0.5 s: {sent:?}");
    drop(impatient);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop(harness).await;
    let records = records(tmp.path());
    let (requests, completions) = records_of(&records, "abandoned");
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        completions, 1,
        "no completion record for the abandoned request"
    );
    let completion = records
        .iter()
        .find_map(|r| match &r.body {
            RecordBody::Completion(c) if c.request_id == requests[0].request_id => Some(c),
            _ => None,
        })
        .expect("completion record");
    assert_eq!(
        completion.finish_reason.as_deref(),
        Some("client_disconnected")
    );
    assert_eq!(completion.status, 499);
}
