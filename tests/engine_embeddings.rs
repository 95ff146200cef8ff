//! Embedding requests in the engine on the CPU backend: their prompts run in the same steps as
//! generation (chunked when long), each returns its last token's final hidden state, and
//! neither kind changes the other's result.

mod support;

use inferno::backend::cpu::CpuBackend;
use inferno::engine::{
    Backend as _, BatchRow, EngineConfig, EngineHandle, FinishReason, GenerationEvent,
    GenerationStream,
};
use inferno::model::Model;
use support::{collect, committed_fixture, engine, greedy};

fn model() -> Model {
    Model::load(&committed_fixture("tiny-qwen3-embedding")).expect("fixture loads")
}

/// The hidden state an embedding stream carries, its finish reason and completion tokens.
fn hidden(mut stream: GenerationStream) -> (Vec<f32>, FinishReason, usize) {
    let mut state = Vec::new();
    while let Some(event) = stream.blocking_next() {
        match event {
            GenerationEvent::Hidden { state: hidden } => state = hidden,
            GenerationEvent::Finished {
                reason,
                completion_tokens,
                ..
            } => return (state, reason, completion_tokens),
            GenerationEvent::Token { .. } => panic!("an embedding request generated a token"),
        }
    }
    panic!("the stream ended without Finished")
}

/// The final hidden state of `prompt`'s last token from the backend itself, in one step.
fn reference(model: &Model, prompt: &[u32]) -> Vec<f32> {
    let mut backend = CpuBackend::new(model, 1 << 22).expect("backend");
    let blocks: Vec<u32> = (0..prompt.len().div_ceil(16) as u32).collect();
    let row = BatchRow {
        seq_id: 1,
        tokens: prompt,
        start_pos: 0,
        block_table: &blocks,
        sample: None,
    };
    let (_, mut states) = backend
        .step_with_hidden(&[row], &[0])
        .expect("the step runs");
    states.remove(0)
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn small_steps() -> EngineConfig {
    EngineConfig {
        // Long prompts are prefilled in chunks, beside the decoding request.
        max_batched_tokens: 24,
        ..EngineConfig::default()
    }
}

#[test]
fn embeddings_share_steps_with_generation_and_change_nothing() {
    let model = model();
    let long: Vec<u32> = (0..70).map(|i| 20 + (i * 37) % 900).collect();
    let short: Vec<u32> = vec![40, 41, 42, 5];
    let chat: Vec<u32> = vec![6, 100, 200, 300, 7];

    // Each alone.
    let alone = engine(&model, small_steps());
    let generated_alone = collect(alone.submit(greedy(&chat, 12)).expect("accepted"));
    let steps_before = alone.stats().steps;
    let long_alone = hidden(alone.submit_embedding(greedy(&long, 1)).expect("accepted"));
    let short_alone = hidden(alone.submit_embedding(greedy(&short, 1)).expect("accepted"));
    let embedding_steps_alone = alone.stats().steps - steps_before;
    alone.shutdown();

    // Together.
    let together: EngineHandle = engine(&model, small_steps());
    let generation = together.submit(greedy(&chat, 12)).expect("accepted");
    let long_stream = together
        .submit_embedding(greedy(&long, 1))
        .expect("accepted");
    let short_stream = together
        .submit_embedding(greedy(&short, 1))
        .expect("accepted");
    let collector = std::thread::spawn(move || collect(generation));
    let long_together = hidden(long_stream);
    let short_together = hidden(short_stream);
    let generated_together = collector.join().expect("collector");
    // The engine publishes its statistics after the step that sent the last events.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while together.stats().kv_blocks_used != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "blocks still held: {:?}",
            together.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let steps_together = together.stats().steps;
    together.shutdown();

    assert_eq!(generated_together.tokens, generated_alone.tokens);
    assert_eq!(generated_together.tokens.len(), 12);
    for (state, reason, completion_tokens) in [&long_together, &short_together] {
        assert_eq!(state.len(), 64, "one value per hidden dimension");
        assert_eq!(*reason, FinishReason::Stop(None));
        assert_eq!(*completion_tokens, 0);
    }
    // The generation's 12 steps carried the embeddings' prompts: fewer steps than apart.
    assert!(
        steps_together < embedding_steps_alone + 12,
        "{steps_together} steps together, {embedding_steps_alone} + 12 apart"
    );
    let expected_long = reference(&model, &long);
    let expected_short = reference(&model, &short);
    assert!(max_difference(&long_alone.0, &expected_long) < 1e-4);
    assert!(max_difference(&long_together.0, &expected_long) < 1e-4);
    assert!(max_difference(&short_alone.0, &expected_short) < 1e-4);
    assert!(max_difference(&short_together.0, &expected_short) < 1e-4);
    assert!(max_difference(&expected_long, &expected_short) > 1e-2);
}

#[test]
fn the_final_norm_is_applied_to_the_last_token() {
    // The state is the final RMS norm's output: its root mean square is set by the norm's
    // weight, whatever the residual's scale.
    let model = model();
    let prompt: Vec<u32> = vec![10, 11, 12, 13, 5];
    let state = reference(&model, &prompt);
    let weights = model
        .weights
        .tensor("model.norm.weight")
        .expect("final norm");
    let weight: Vec<f32> = weights.to_f32();
    let unscaled: Vec<f32> = state.iter().zip(&weight).map(|(x, w)| x / w).collect();
    let rms = (unscaled.iter().map(|x| x * x).sum::<f32>() / unscaled.len() as f32).sqrt();
    assert!((rms - 1.0).abs() < 1e-3, "rms {rms}");
}

/// The same model as Qwen3-Embedding publishes its files: tensors without the `model.` prefix,
/// no LM head, `tie_word_embeddings: false` (`scripts/make_embedding_fixture.py`).
fn published() -> Model {
    Model::load(&committed_fixture("tiny-qwen3-embedding-published")).expect("fixture loads")
}

#[test]
fn the_published_layout_loads_without_an_lm_head_and_embeds_as_the_usual_one() {
    let (usual, published) = (model(), published());
    assert!(published.config.headless && !usual.config.headless);
    assert!(published.pooling.is_some());
    assert_eq!(published.pooling, usual.pooling);
    for prompt in [
        vec![10, 11, 12, 13, 5],
        (0..40).map(|i| 30 + i * 7).collect(),
    ] {
        let (a, b) = (reference(&usual, &prompt), reference(&published, &prompt));
        assert_eq!(a.len(), 64);
        assert_eq!(a, b, "same weights, same hidden state");
    }
    // Through the engine too.
    let engine = engine(&published, small_steps());
    let (state, reason, _) = hidden(
        engine
            .submit_embedding(greedy(&[40, 41, 42, 5], 1))
            .expect("accepted"),
    );
    engine.shutdown();
    assert_eq!(reason, FinishReason::Stop(None));
    assert_eq!(state, reference(&usual, &[40, 41, 42, 5]));
}

#[test]
fn tensors_without_the_model_prefix_load_only_as_an_embedding_model() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = committed_fixture("tiny-qwen3-embedding-published");
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(source.join(name), dir.path().join(name)).expect("copy");
    }
    let err = Model::load(dir.path()).expect_err("no modules.json: a generative model");
    let message = err.to_string();
    assert!(
        message.contains("model.") && message.contains("embedding model"),
        "{message}"
    );
}
