//! The host cost of constrained decoding: how long llguidance takes to prepare a model's tokenizer,
//! to compile a JSON schema, and, along generations that pick random allowed tokens (so the
//! grammar is walked as a sampling model would walk it), to compute each token mask and to advance
//! the grammar past each token.
//!
//! Usage: `cargo run --release --example grammar_mask_cost -- MODEL_DIR [TOKENS] [--walks N]
//! [--schema FILE]` (a Hugging Face directory: `tokenizer.json`, and `config.json` for the
//! vocabulary size and end-of-sequence ids). The default schema is the `constrained` benchmark's
//! (an object holding an array of strings); each of the N walks (default 8) has its own seed and
//! stops after TOKENS tokens (default 256) or when the grammar is complete.

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

/// The command line.
struct Args {
    dir: String,
    tokens: usize,
    walks: u64,
    schema: Value,
}

const USAGE: &str = "usage: grammar_mask_cost MODEL_DIR [TOKENS] [--walks N] [--schema FILE]";

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        dir: String::new(),
        tokens: 256,
        walks: 8,
        schema: json!({
            "type": "object",
            "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
            "required": ["notes"],
            "additionalProperties": false
        }),
    };
    let number = |value: Option<String>, what: &str| -> Result<u64, String> {
        let value = value.ok_or(format!("{what} needs a value; {USAGE}"))?;
        value
            .parse()
            .map_err(|_| format!("{what} must be a number, got {value}"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--walks" => parsed.walks = number(args.next(), "--walks")?.max(1),
            "--schema" => {
                let path = args.next().ok_or(USAGE)?;
                let text = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
                parsed.schema =
                    serde_json::from_slice(&text).map_err(|e| format!("{path}: {e}"))?;
            }
            _ if parsed.dir.is_empty() => parsed.dir = arg,
            _ => parsed.tokens = number(Some(arg), "TOKENS")? as usize,
        }
    }
    if parsed.dir.is_empty() {
        return Err(USAGE.into());
    }
    Ok(parsed)
}

/// p50, p90, p99, max and mean of `micros` (sorted here), as one line.
fn summary(micros: &mut [f64]) -> String {
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us, mean {:.1} us",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        micros.iter().sum::<f64>() / micros.len() as f64
    )
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let dir = &args.dir;
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
    let spec = ConstraintSpec {
        kind: ConstraintKind::JsonSchema,
        source: ConstraintSource::JsonSchema(args.schema.clone()),
    };
    let mut compiles = Vec::new();
    let mut masks = Vec::new();
    let mut advances = Vec::new();
    // The slowest masks: microseconds, walk, token index, the text generated before it.
    let mut slowest: Vec<(f64, u64, usize, String)> = Vec::new();
    let mut lengths = Vec::new();
    for walk in 0..args.walks {
        let started = Instant::now();
        let compiled = compiler.compile(&spec).map_err(|e| e.to_string())?;
        compiles.push(started.elapsed().as_secs_f64() * 1e6);
        let mut constraint = compiled.start();
        let mut state = 7u64 + walk;
        let mut generated = Vec::new();
        for index in 0..args.tokens {
            let started = Instant::now();
            let mask = constraint.mask()?;
            let micros = started.elapsed().as_secs_f64() * 1e6;
            masks.push(micros);
            if slowest.len() < 5 || micros > slowest[slowest.len() - 1].0 {
                let text = tokenizer.decode(&generated, false).unwrap_or_default();
                let tail: String = text
                    .chars()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                slowest.push((micros, walk, index, tail));
                slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
                slowest.truncate(5);
            }
            let allowed: Vec<u32> = (0..vocab as u32)
                .filter(|&t| is_allowed(&mask, t))
                .collect();
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let token = allowed[(state >> 33) as usize % allowed.len()];
            let started = Instant::now();
            constraint.advance(token)?;
            advances.push(started.elapsed().as_secs_f64() * 1e6);
            generated.push(token);
            if constraint.is_finished() {
                break;
            }
        }
        lengths.push(generated.len());
    }
    println!(
        "{} schema compiles: {}",
        compiles.len(),
        summary(&mut compiles)
    );
    println!(
        "{} walks of {:?} tokens; {} masks: {}",
        args.walks,
        lengths,
        masks.len(),
        summary(&mut masks)
    );
    println!("{} advances: {}", advances.len(), summary(&mut advances));
    for (micros, walk, index, tail) in slowest {
        println!("slow mask: {micros:.1} us (walk {walk}, token {index}) after …{tail:?}");
    }
    Ok(())
}
