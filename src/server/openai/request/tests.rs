use super::*;

fn limits() -> LimitsConfig {
    LimitsConfig::default()
}

fn chat(body: &str) -> Result<ChatRequest, ApiError> {
    parse_chat(body.as_bytes(), &SamplingParams::default(), &limits())
}

fn completion(body: &str) -> Result<CompletionRequest, ApiError> {
    parse_completion(body.as_bytes(), &SamplingParams::default(), &limits())
}

#[test]
fn parses_a_full_chat_request() {
    let request = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"!"}]}],
            "temperature":0.5,"top_p":0.9,"top_k":-1,"min_p":0.1,"seed":7,"n":2,"stop":"x",
            "max_completion_tokens":9,"logprobs":true,"top_logprobs":3,"stream":true,
            "stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false},
            "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1}"#,
    )
    .unwrap();
    let o = &request.options;
    assert_eq!(o.model, "m");
    assert_eq!(o.n, 2);
    assert_eq!(o.sampling.temperature, 0.5);
    assert_eq!(o.sampling.top_k, 0);
    assert_eq!(o.sampling.seed, Some(7));
    assert_eq!(o.sampling_for(1).seed, Some(8));
    assert_eq!(o.stop.stop_strings, vec!["x".to_owned()]);
    assert_eq!(o.max_tokens, Some(9));
    assert_eq!(o.logprobs, Some(3));
    assert!(o.stream && o.include_usage);
    assert_eq!(request.messages[0]["content"], "hi!");
    assert_eq!(request.template_kwargs["enable_thinking"], false);
    assert!(request.add_generation_prompt);
}

#[test]
fn defaults_come_from_the_model() {
    let defaults = SamplingParams {
        temperature: 0.6,
        top_p: 0.9,
        top_k: 50,
        ..SamplingParams::default()
    };
    let request = parse_chat(
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        &defaults,
        &limits(),
    )
    .unwrap();
    assert_eq!(request.options.sampling.temperature, 0.6);
    assert_eq!(request.options.sampling.top_k, 50);
    assert_eq!(request.options.n, 1);
    assert!(!request.options.stream);
}

#[test]
fn malformed_json_is_a_400() {
    let err = chat("{\"model\":").unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
    assert!(err.message.contains("not valid JSON"), "{}", err.message);
    assert_eq!(
        chat("[1]").unwrap_err().status,
        http::StatusCode::BAD_REQUEST
    );
}

#[test]
fn wrong_type_names_the_field() {
    let err =
        chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#)
            .unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(err.param.as_deref(), Some("temperature"));
    let err = chat(r#"{"model":"m","messages":"hello"}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages"));
    let err = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("model"));
}

#[test]
fn empty_messages_are_refused() {
    let err = chat(r#"{"model":"m","messages":[]}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages"));
}

#[test]
fn messages_need_a_role_and_text_content() {
    let err = chat(r#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages[0].role"));
    let err = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages[0].content[0]"));
}

#[test]
fn out_of_range_values_are_refused() {
    for (field, value) in [
        ("temperature", "3"),
        ("top_p", "0"),
        ("min_p", "1.5"),
        ("presence_penalty", "-3"),
        ("n", "0"),
        ("n", "1000"),
        ("max_tokens", "0"),
        ("max_tokens", "100000000"),
        ("top_k", "-2"),
    ] {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"{field}":{value}}}"#
        );
        let err = chat(&body).unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{field}={value}");
        assert_eq!(err.param.as_deref(), Some(field), "{field}={value}");
    }
}

#[test]
fn stop_accepts_a_list() {
    let request = completion(r#"{"model":"m","prompt":"a","stop":["x","y"]}"#).unwrap();
    assert_eq!(request.options.stop.stop_strings, vec!["x", "y"]);
    let err = completion(r#"{"model":"m","prompt":"a","stop":[1]}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("stop"));
}

#[test]
fn completion_prompts_in_every_form() {
    let one = completion(r#"{"model":"m","prompt":"hello"}"#).unwrap();
    assert_eq!(one.prompts, vec![Prompt::Text("hello".into())]);
    assert_eq!(one.options.max_tokens, Some(16));
    let tokens = completion(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
    assert_eq!(tokens.prompts, vec![Prompt::Tokens(vec![1, 2, 3])]);
    let many = completion(r#"{"model":"m","prompt":["a",[4]],"logprobs":2}"#).unwrap();
    assert_eq!(
        many.prompts,
        vec![Prompt::Text("a".into()), Prompt::Tokens(vec![4])]
    );
    assert_eq!(many.options.logprobs, Some(2));
    for bad in [r#""prompt":[]"#, r#""prompt":{}"#, r#""prompt":[-1]"#] {
        let err = completion(&format!(r#"{{"model":"m",{bad}}}"#)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("prompt"), "{bad}");
    }
}

#[test]
fn context_checks() {
    let request = completion(r#"{"model":"m","prompt":"a","max_tokens":10}"#).unwrap();
    let stop = request.options.stop_for(5, 100, &limits()).unwrap();
    assert_eq!(stop.max_tokens, 10);
    let err = request.options.stop_for(95, 100, &limits()).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("max_tokens"));
    let err = request.options.stop_for(100, 100, &limits()).unwrap_err();
    assert_eq!(err.code, Some("context_length_exceeded"));
    let open = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(
        open.options
            .stop_for(40, 100, &limits())
            .unwrap()
            .max_tokens,
        60
    );
}

#[test]
fn completion_logprobs_errors_name_logprobs() {
    let err = completion(r#"{"model":"m","prompt":"a","logprobs":100}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("logprobs"));
}

#[test]
fn stop_strings_are_bounded_in_total_size() {
    let long = "x".repeat(MAX_STOP_BYTES / 2 + 1);
    let body = serde_json::json!({"model":"m","prompt":"a","stop":[long, long]}).to_string();
    let err = completion(&body).unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(err.param.as_deref(), Some("stop"));
    let fits = "x".repeat(MAX_STOP_BYTES);
    let body = serde_json::json!({"model":"m","prompt":"a","stop":fits}).to_string();
    assert!(completion(&body).is_ok());
}

#[test]
fn top_logprobs_requires_logprobs() {
    let err = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#)
        .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("top_logprobs"));
}
#[test]
fn unsupported_fields_are_refused_by_name() {
    for field in ["functions", "audio", "prediction", "store", "frobnicate"] {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"{field}":1}}"#);
        let err = chat(&body).unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{field}");
        assert_eq!(err.param.as_deref(), Some(field));
    }
    let err = completion(r#"{"model":"m","prompt":"a","tools":[]}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools"));
    let err = completion(r#"{"model":"m","prompt":"a","best_of":3}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("best_of"));
    assert!(completion(r#"{"model":"m","prompt":"a","best_of":1,"user":"u"}"#).is_ok());
    let ignored = completion(
        r#"{"model":"m","prompt":"a","store":false,"metadata":{"k":"v"},"service_tier":"auto","prompt_cache_key":"p","safety_identifier":"s","user":"u"}"#,
    )
    .unwrap();
    assert_eq!(ignored.options.ignored, IGNORED_FIELDS);
    let chat_ignored =
        chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"store":false}"#).unwrap();
    assert_eq!(chat_ignored.options.ignored, ["store"]);
    let err = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"store":true}"#)
        .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("store"));
}

#[test]
fn logit_bias_is_validated_and_sorted() {
    let request =
        completion(r#"{"model":"m","prompt":"a","logit_bias":{"9":-5,"3":100}}"#).unwrap();
    assert_eq!(
        request.options.sampling.logit_bias,
        vec![(3, 100.0), (9, -5.0)]
    );
    let too_many = format!(
        "{{{}}}",
        (0..=crate::engine::MAX_LOGIT_BIAS_TOKENS)
            .map(|t| format!("\"{t}\":1"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let bads = [
        r#"{"x":1}"#,
        r#"{"3":101}"#,
        r#"{"3":"a"}"#,
        r#"{"3":1,"03":2}"#,
        too_many.as_str(),
    ];
    for bad in bads {
        let err = completion(&format!(
            r#"{{"model":"m","prompt":"a","logit_bias":{bad}}}"#
        ))
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("logit_bias"), "{bad}");
    }
}

#[test]
fn response_formats_and_guided_fields_become_one_constraint() {
    let base = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
    let kind = |extra: &str| {
        chat(&format!("{{{base},{extra}}}"))
            .unwrap()
            .options
            .constraint
            .map(|c| c.kind)
    };
    assert_eq!(kind(r#""response_format":{"type":"text"}"#), None);
    assert_eq!(
        kind(r#""response_format":{"type":"json_object"}"#),
        Some(ConstraintKind::JsonObject)
    );
    assert_eq!(
        kind(
            r#""response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"},"strict":true}}"#
        ),
        Some(ConstraintKind::JsonSchema)
    );
    assert_eq!(
        kind(r#""guided_regex":"[0-9]+""#),
        Some(ConstraintKind::Regex)
    );
    assert_eq!(
        kind(r#""guided_choice":["a","b"]"#),
        Some(ConstraintKind::Choice)
    );
    assert_eq!(
        kind(r#""guided_grammar":"start: \"x\"""#),
        Some(ConstraintKind::Grammar)
    );
    let err = chat(&format!(
        r#"{{{base},"response_format":{{"type":"yaml"}}}}"#
    ))
    .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("response_format"));
    let err = chat(&format!(
        r#"{{{base},"response_format":{{"type":"json_object"}},"guided_regex":"a"}}"#
    ))
    .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("guided_regex"));
}

#[test]
fn tool_choice_forms() {
    let base = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
    let tools =
        r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]"#;
    let choice = |extra: &str| chat(&format!("{{{base},{tools}{extra}}}")).map(|r| r.tool_choice);
    assert_eq!(choice("").unwrap(), ToolChoice::Auto);
    assert_eq!(
        choice(r#","tool_choice":"none""#).unwrap(),
        ToolChoice::None
    );
    assert_eq!(
        choice(r#","tool_choice":"required""#).unwrap(),
        ToolChoice::Required
    );
    assert_eq!(
        choice(r#","tool_choice":{"type":"function","function":{"name":"f"}}"#).unwrap(),
        ToolChoice::Function("f".into())
    );
    let err = choice(r#","tool_choice":{"type":"function","function":{"name":"g"}}"#).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
    let err = chat(&format!(r#"{{{base},"tool_choice":"required"}}"#)).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
    let err = choice(r#","tool_choice":"required","response_format":{"type":"json_object"}"#)
        .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
}
