//! `inferno generate`: one local completion, printed as it is generated.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use serde_json::json;

use crate::backend::Device;
use crate::engine::{EngineConfig, GenerationEvent, GenerationRequest, SamplingParams, StopParams};
use crate::model::{Model, QuantizeAtLoad};

/// Arguments of `inferno generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Hugging Face model directory (default: the embedded model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt. It is wrapped as a user message in the chat template unless `--raw` is given.
    #[arg(long)]
    prompt: String,
    /// Tokenize the prompt as plain text instead of applying the chat template.
    #[arg(long)]
    raw: bool,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature (0: greedy; default: the model's generation_config, else greedy).
    #[arg(long)]
    temperature: Option<f32>,
    /// Nucleus-sampling mass.
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// A string that ends generation (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// Quantize a 16-bit checkpoint's projections when loading it (`fp8`).
    #[arg(long, value_enum, value_name = "FORMAT")]
    quantization: Option<QuantizeAtLoad>,
    /// Print one JSON object with the text and the token ids instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Runs `inferno generate`.
pub fn run(args: GenerateArgs) -> ExitCode {
    match generate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let mut model = super::setup::load_model(args.model.as_deref())?;
    if let Some(quantize) = args.quantization {
        quantize.apply(&mut model.config);
    }
    anyhow::ensure!(
        !model.config.headless,
        "{} is an embedding model without an LM head: it cannot generate",
        model.name
    );
    let prompt = tokenize(&model, args)?;
    let engine = super::setup::start_engine(&model, args.device, &EngineConfig::default())?;
    let request = GenerationRequest {
        id: "generate".into(),
        prompt: prompt.clone(),
        sampling: sampling(&model, args),
        stop: StopParams {
            max_tokens: args.max_tokens,
            stop_strings: args.stop.clone(),
            ..Default::default()
        },
        logprobs: None,
        cache_salt: 0,
        prompt_logprobs: None,
        constraint: None,
    };
    let mut stream = engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(event) = stream.blocking_next() {
        let piece = match event {
            GenerationEvent::Token { token, text, .. } => {
                ids.push(token);
                text
            }
            GenerationEvent::Hidden { .. } => String::new(),
            GenerationEvent::Finished {
                reason, text: tail, ..
            } => {
                if let crate::engine::FinishReason::Error(message) = &reason {
                    bail!("generation failed: {message}");
                }
                text.push_str(&tail);
                if args.json {
                    let out = json!({
                        "model": model.name,
                        "text": text,
                        "prompt_token_ids": prompt,
                        "token_ids": ids,
                        "finish_reason": reason.as_openai_str(),
                    });
                    writeln!(stdout, "{out}")?;
                } else {
                    writeln!(stdout, "{tail}")?;
                }
                break;
            }
        };
        if !args.json {
            write!(stdout, "{piece}")?;
            stdout.flush()?;
        }
        text.push_str(&piece);
    }
    engine.shutdown();
    Ok(())
}

fn tokenize(model: &Model, args: &GenerateArgs) -> anyhow::Result<Vec<u32>> {
    let (text, add_special) = match (&model.chat_template, args.raw) {
        (Some(template), false) => {
            let messages = [json!({"role": "user", "content": args.prompt})];
            (
                template.render(&messages, None, true, &Default::default())?,
                false,
            )
        }
        _ => (args.prompt.clone(), true),
    };
    let encoding = model
        .tokenizer
        .encode(text, add_special)
        .map_err(|e| anyhow::anyhow!("cannot tokenize the prompt: {e}"))?;
    Ok(encoding.get_ids().to_vec())
}

fn sampling(model: &Model, args: &GenerateArgs) -> SamplingParams {
    let defaults = &model.generation;
    let model_samples = defaults.do_sample.unwrap_or(false);
    let temperature = args
        .temperature
        .or(if model_samples {
            defaults.temperature
        } else {
            None
        })
        .unwrap_or(0.0);
    SamplingParams {
        temperature,
        top_p: args.top_p.or(defaults.top_p).unwrap_or(1.0),
        top_k: defaults.top_k.unwrap_or(0),
        seed: args.seed,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_unless_asked_or_the_model_samples() {
        let model = Model::embedded().expect("embedded model");
        let args = GenerateArgs {
            model: None,
            prompt: "hi".into(),
            raw: false,
            max_tokens: 1,
            temperature: None,
            top_p: None,
            seed: None,
            stop: vec![],
            device: Device::Cpu,
            quantization: None,
            json: false,
        };
        assert_eq!(sampling(&model, &args).temperature, 0.0);
        let args = GenerateArgs {
            temperature: Some(0.7),
            ..args
        };
        assert_eq!(sampling(&model, &args).temperature, 0.7);
        let ids = tokenize(&model, &args).expect("the chat prompt tokenizes");
        assert_eq!(
            ids.first(),
            model.config.bos_token_id.as_ref(),
            "the template adds BOS once"
        );
    }
}
