//! The host cost of constrained decoding: how long llguidance takes to prepare a model's tokenizer,
//! to compile a JSON schema, and to compute each token mask along one generation (random allowed
//! tokens, so the grammar is walked as a model would walk it).
//!
//! Usage: `cargo run --release --example grammar_mask_cost -- MODEL_DIR [TOKENS]` (a Hugging Face
//! directory: `tokenizer.json`, and `config.json` for the vocabulary size and end-of-sequence ids).

use std::process::ExitCode;
use std::time::Instant;

use inferno::constrain::{
    ConstraintKind, ConstraintSource, ConstraintSpec, GrammarCompiler, is_allowed,
};
use serde_json::{Value, json};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The end-of-sequence ids named by `config.json` (a number or a list).
fn eos_ids(config: &Value) -> Vec<u32> {
    match &config["eos_token_id"] {
        Value::Array(ids) => ids
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| id as u32)
            .collect(),
        id => id.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: grammar_mask_cost MODEL_DIR [TOKENS]")?;
    let tokens: usize = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("TOKENS must be a number, got {n}"))?,
        None => 256,
    };
    let config: Value = serde_json::from_slice(
        &std::fs::read(format!("{dir}/config.json"))
            .map_err(|e| format!("{dir}/config.json: {e}"))?,
    )
    .map_err(|e| format!("{dir}/config.json: {e}"))?;
    let vocab = config["vocab_size"]
        .as_u64()
        .ok_or("config.json has no vocab_size")? as usize;
    let tokenizer = tokenizers::Tokenizer::from_file(format!("{dir}/tokenizer.json"))
        .map_err(|e| format!("{dir}/tokenizer.json: {e}"))?;
    let started = Instant::now();
    let compiler =
        GrammarCompiler::new(&tokenizer, &eos_ids(&config), vocab).map_err(|e| e.to_string())?;
    println!(
        "tokenizer prepared for llguidance in {:?} ({vocab} tokens)",
        started.elapsed()
    );
    let schema = json!({
        "type": "object",
        "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
        "required": ["notes"],
        "additionalProperties": false
    });
    let spec = ConstraintSpec {
        kind: ConstraintKind::JsonSchema,
        source: ConstraintSource::JsonSchema(schema),
    };
    let started = Instant::now();
    let compiled = compiler.compile(&spec).map_err(|e| e.to_string())?;
    println!("JSON schema compiled in {:?}", started.elapsed());
    let mut constraint = compiled.start();
    let mut state = 7u64;
    let mut micros = Vec::with_capacity(tokens);
    for _ in 0..tokens {
        let started = Instant::now();
        let mask = constraint.mask()?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&t| is_allowed(&mask, t))
            .collect();
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let token = allowed[(state >> 33) as usize % allowed.len()];
        constraint.advance(token)?;
        if constraint.is_finished() {
            break;
        }
    }
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    println!(
        "{} masks: p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us, mean {:.1} us",
        micros.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        micros.iter().sum::<f64>() / micros.len() as f64
    );
    Ok(())
}
