//! Speculative decoding on the CPU backend: greedy and seeded output identical with and without it,
//! rejected proposals rolled back with the prefix cache on, prompt logprobs from per-position
//! logits.

mod support;

use std::time::{Duration, Instant};

use inferno::backend::cpu::CpuBackend;
use inferno::engine::sampling::log_softmax;
use inferno::engine::{
    EngineConfig, EngineHandle, GenerationEvent, GenerationRequest, PromptLogprob, SamplingParams,
    SpeculativeConfig, SpeculativeMethod,
};
use inferno::model::Model;
use support::{committed_fixture, engine, golden, greedy, logits_per_position, run, run_all};

/// Speculation that proposes whenever a 1- to 3-gram matches, up to 4 tokens, never backing off:
/// as many verifications (and rejections) as the fixtures give.
fn eager() -> EngineConfig {
    EngineConfig {
        speculative: SpeculativeConfig {
            method: Some(SpeculativeMethod::Ngram),
            num_speculative_tokens: 4,
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            adaptive: false,
            forced_acceptance: None,
        },
        ..Default::default()
    }
}

/// The fixture's golden prompts, and each repeated twice (text that copies from its prompt).
fn prompts(dir: &std::path::Path) -> Vec<Vec<u32>> {
    golden(dir)
        .into_iter()
        .flat_map(|c| {
            let twice = [c.input_ids.clone(), c.input_ids.clone()].concat();
            [c.input_ids, twice]
        })
        .collect()
}

/// An outcome without its prefix-cache hits (which depend on what ran before).
fn output(outcome: &support::Outcome) -> support::Outcome {
    support::Outcome {
        cached_tokens: 0,
        ..outcome.clone()
    }
}

fn wait_for_free_blocks(engine: &EngineHandle) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.stats().kv_blocks_used != 0 {
        assert!(
            Instant::now() < deadline,
            "blocks still held: {:?}",
            engine.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Greedy requests (one with EOS honoured and a stop string taken from the plain run's text)
/// give the same outcomes with speculation, alone and batched, and speculation both accepted
/// and rejected proposals.
fn greedy_identity(dir: &std::path::Path) {
    let model = Model::load(dir).expect("fixture loads");
    let prompts = prompts(dir);
    let plain = engine(&model, EngineConfig::default());
    let mut requests: Vec<GenerationRequest> = prompts.iter().map(|p| greedy(p, 40)).collect();
    let expected: Vec<support::Outcome> = requests.iter().map(|r| run(&plain, r.clone())).collect();
    // Honour EOS, and stop on a piece of the text of the first request.
    let text = &expected[1].text;
    let cut = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let stop: String = text[cut..].chars().take(3).collect();
    let mut stopping = greedy(&prompts[1], 40);
    stopping.stop.ignore_eos = false;
    stopping.stop.stop_strings = vec![stop];
    requests.push(stopping.clone());
    let expected_stop = run(&plain, stopping);
    plain.shutdown();

    let speculative = engine(&model, eager());
    for (request, want) in requests.iter().zip(expected.iter().chain([&expected_stop])) {
        let got = run(&speculative, request.clone());
        assert_eq!(got, *want, "{}: alone", dir.display());
    }
    let batched = EngineConfig {
        max_batched_tokens: 48,
        ..eager()
    };
    let batched = engine(&model, batched);
    let got = run_all(&batched, requests.clone());
    for (got, want) in got.iter().zip(expected.iter().chain([&expected_stop])) {
        assert_eq!(output(got), output(want), "{}: batched", dir.display());
    }
    for engine in [&speculative, &batched] {
        let stats = engine.stats();
        assert!(stats.spec_verifications > 0, "{stats:?}");
        assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
        assert!(
            stats.spec_accepted_tokens < stats.spec_draft_tokens,
            "{stats:?}"
        );
        wait_for_free_blocks(engine);
    }
}

#[test]
fn greedy_output_is_identical_with_speculation_on_the_committed_fixtures() {
    for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"] {
        greedy_identity(&committed_fixture(name));
    }
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn greedy_output_is_identical_with_speculation_on_tiny_llama3() {
    greedy_identity(&support::shared_fixture("tiny-llama3"));
}

#[test]
fn rejected_slots_are_rolled_back_with_the_prefix_cache_on() {
    let dir = committed_fixture("inferno-tiny");
    let model = Model::load(&dir).expect("fixture loads");
    let prompt = prompts(&dir).remove(1);
    let config = eager();
    assert!(config.prefix_caching);
    let speculative = engine(&model, config);
    let first = run(&speculative, greedy(&prompt, 64));
    let stats = speculative.stats();
    assert!(
        stats.spec_accepted_tokens < stats.spec_draft_tokens,
        "some proposals were rejected: {stats:?}"
    );
    // A prompt that extends into the first output: its full blocks, computed by verification
    // steps that also rejected proposals, come from the prefix cache.
    let extended = [prompt.as_slice(), &first.tokens[..56]].concat();
    let second = run(&speculative, greedy(&extended, 24));
    assert!(
        second.cached_tokens >= (extended.len() / 16 - 1) * 16,
        "cached {} of {}",
        second.cached_tokens,
        extended.len()
    );
    wait_for_free_blocks(&speculative);
    speculative.shutdown();
    // Without speculation or the cache, the same tokens.
    let plain = engine(
        &model,
        EngineConfig {
            prefix_caching: false,
            ..Default::default()
        },
    );
    assert_eq!(run(&plain, greedy(&prompt, 64)).tokens, first.tokens);
    assert_eq!(run(&plain, greedy(&extended, 24)).tokens, second.tokens);
}

#[test]
fn seeded_sampling_gives_the_same_tokens_with_speculation() {
    let dir = committed_fixture("inferno-tiny");
    let model = Model::load(&dir).expect("fixture loads");
    let prompt = prompts(&dir).remove(1);
    let requests: Vec<GenerationRequest> = (0..4)
        .map(|seed| GenerationRequest {
            sampling: SamplingParams {
                temperature: 0.5,
                top_p: 0.9,
                repetition_penalty: 1.1,
                seed: Some(seed),
                ..Default::default()
            },
            ..greedy(&prompt, 30)
        })
        .collect();
    let plain = engine(&model, EngineConfig::default());
    let expected: Vec<support::Outcome> = requests.iter().map(|r| run(&plain, r.clone())).collect();
    plain.shutdown();
    let speculative = engine(&model, eager());
    let got = run_all(&speculative, requests);
    assert_eq!(
        got.iter().map(output).collect::<Vec<_>>(),
        expected.iter().map(output).collect::<Vec<_>>()
    );
    let stats = speculative.stats();
    assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
    wait_for_free_blocks(&speculative);
}

#[test]
fn prompt_logprobs_are_the_log_softmax_of_each_position() {
    let dir = committed_fixture("inferno-tiny");
    let model = Model::load(&dir).expect("fixture loads");
    let prompt = prompts(&dir).remove(1);
    let engine = engine(
        &model,
        EngineConfig {
            max_batched_tokens: 16,
            ..Default::default()
        },
    );
    let request = GenerationRequest {
        prompt_logprobs: Some(2),
        ..greedy(&prompt, 2)
    };
    let get = |request: GenerationRequest| -> (Vec<Option<PromptLogprob>>, usize) {
        let mut stream = engine.submit(request).expect("accepted");
        while let Some(event) = stream.blocking_next() {
            if let GenerationEvent::Finished {
                prompt_logprobs,
                cached_tokens,
                ..
            } = event
            {
                return (prompt_logprobs.expect("prompt logprobs"), cached_tokens);
            }
        }
        panic!("no Finished event")
    };
    let (first, _) = get(request.clone());
    // Again: the prefix cache is not used, every position is computed.
    let (again, cached) = get(request);
    assert_eq!(cached, 0);
    assert_eq!(first, again);
    let mut backend = CpuBackend::new(&model, 64 << 20).expect("backend");
    let logits = logits_per_position(&mut backend, &prompt);
    assert_eq!(first.len(), prompt.len());
    assert!(first[0].is_none());
    for (i, entry) in first.iter().enumerate().skip(1) {
        let entry = entry.as_ref().expect("a logprob");
        let table = log_softmax(&logits[i - 1]);
        let want = table[prompt[i] as usize];
        assert!(
            (entry.logprob - want).abs() < 1e-4,
            "position {i}: {} vs {want}",
            entry.logprob
        );
        assert_eq!(entry.top.len(), 2);
        let rank = 1 + table.iter().filter(|&&l| l > want).count() as u32;
        assert_eq!(entry.rank, rank);
    }
}

#[test]
fn eagle3_is_refused_at_start() {
    let model = Model::load(&committed_fixture("inferno-tiny")).expect("fixture loads");
    let backend = CpuBackend::new(&model, 16 << 20).expect("backend");
    let config = EngineConfig {
        speculative: SpeculativeConfig {
            method: Some(SpeculativeMethod::Eagle3),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = inferno::engine::Engine::spawn(
        Box::new(backend),
        inferno::engine::ModelInfo::of(&model),
        config,
    )
    .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "speculative decoding with eagle3 is not supported yet (use ngram)"
    );
}
