//! `/v1/embeddings`: the request body and the pooled, encoded response.

use base64::Engine as _;
use serde_json::{Value, json};

use super::request::{parse_object, refuse_fields};
use crate::model::pooling::Pooling;
use crate::server::error::ApiError;

/// The most inputs one request may carry (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// Fields `/v1/embeddings` reads; `user` is accepted and ignored.
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// One input: text to tokenize, or token ids used as given.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingInput {
    /// Text (the model's default prompt, if any, goes before it).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian `f32` bytes.
    Base64,
}

/// A validated embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRequest {
    /// The requested model id.
    pub model: String,
    /// The inputs, each embedded on its own.
    pub inputs: Vec<EmbeddingInput>,
    /// How the vectors are written.
    pub format: EncodingFormat,
    /// The requested vector size (Matryoshka truncation).
    pub dimensions: Option<usize>,
    /// The request's ignored fields (`user`), for the `inferno-ignored-fields` header.
    pub ignored: Vec<&'static str>,
}

/// Parses and validates an embeddings body.
pub fn parse_embeddings(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let value = parse_object(body)?;
    refuse_fields(&value, FIELDS)?;
    let model = value["model"]
        .as_str()
        .ok_or_else(|| ApiError::invalid_param("model", "model must be a string"))?
        .to_owned();
    let bad_input = || {
        ApiError::invalid_param(
            "input",
            "input must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    };
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|id| {
                id.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(bad_input)
            })
            .collect()
    };
    let inputs = match &value["input"] {
        Value::String(text) => vec![EmbeddingInput::Text(text.clone())],
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            vec![EmbeddingInput::Tokens(tokens(items)?)]
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(EmbeddingInput::Text(text.clone())),
                Value::Array(ids) => Ok(EmbeddingInput::Tokens(tokens(ids)?)),
                _ => Err(bad_input()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad_input()),
    };
    if inputs.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!(
                "input has {} items, at most {MAX_EMBEDDING_INPUTS} are accepted",
                inputs.len()
            ),
        ));
    }
    if let Some(index) = inputs.iter().position(|input| match input {
        EmbeddingInput::Text(text) => text.is_empty(),
        EmbeddingInput::Tokens(ids) => ids.is_empty(),
    }) {
        return Err(ApiError::invalid_param(
            "input",
            format!("input[{index}] is empty"),
        ));
    }
    let format = match value.get("encoding_format") {
        None | Some(Value::Null) => EncodingFormat::Float,
        Some(Value::String(format)) if format == "float" => EncodingFormat::Float,
        Some(Value::String(format)) if format == "base64" => EncodingFormat::Base64,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                "encoding_format must be float or base64",
            ));
        }
    };
    let dimensions = match value.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(size) => Some(
            size.as_u64()
                .filter(|&size| size > 0)
                .and_then(|size| usize::try_from(size).ok())
                .ok_or_else(|| {
                    ApiError::invalid_param("dimensions", "dimensions must be a positive integer")
                })?,
        ),
    };
    Ok(EmbeddingRequest {
        model,
        inputs,
        format,
        dimensions,
        ignored: if value.get("user").is_some() {
            vec!["user"]
        } else {
            Vec::new()
        },
    })
}

/// Checks `dimensions` against what the model allows: its size at most, and only for a model
/// trained to be cut (Matryoshka), to one of its sizes when it lists them.
pub fn check_dimensions(
    pooling: &Pooling,
    hidden: usize,
    dimensions: Option<usize>,
) -> Result<(), ApiError> {
    let Some(size) = dimensions else {
        return Ok(());
    };
    if size == hidden {
        return Ok(());
    }
    let bad = |message: String| Err(ApiError::invalid_param("dimensions", message));
    match &pooling.matryoshka {
        None => bad(format!(
            "this model's embeddings cannot be shortened (it declares no Matryoshka sizes); omit dimensions or send {hidden}"
        )),
        Some(_) if size > hidden => bad(format!("dimensions is {size}, over the model's {hidden}")),
        Some(sizes) if !sizes.is_empty() && !sizes.contains(&size) => {
            bad(format!("dimensions must be one of {sizes:?}"))
        }
        Some(_) => Ok(()),
    }
}

/// The embedding of a last-token hidden state: cut to `dimensions`, then scaled to unit norm
/// when the model normalizes.
pub fn pool(mut state: Vec<f32>, pooling: &Pooling, dimensions: Option<usize>) -> Vec<f32> {
    if let Some(size) = dimensions {
        state.truncate(size);
    }
    if pooling.normalize {
        let norm = state
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            state
                .iter_mut()
                .for_each(|x| *x = (f64::from(*x) / norm) as f32);
        }
    }
    state
}

/// The response body: one `embedding` object per input, in input order.
pub fn response(
    model: &str,
    embeddings: &[Vec<f32>],
    format: EncodingFormat,
    prompt_tokens: usize,
) -> String {
    let data: Vec<Value> = embeddings
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match format {
                EncodingFormat::Float => json!(vector),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooling(matryoshka: Option<Vec<usize>>) -> Pooling {
        Pooling {
            normalize: true,
            default_prompt: None,
            matryoshka,
        }
    }

    #[test]
    fn inputs_of_every_shape_parse() {
        let parse = |input: Value| {
            parse_embeddings(json!({"model": "m", "input": input}).to_string().as_bytes())
        };
        assert_eq!(
            parse(json!("a")).expect("parses").inputs,
            [EmbeddingInput::Text("a".into())]
        );
        assert_eq!(
            parse(json!([1, 2])).expect("parses").inputs,
            [EmbeddingInput::Tokens(vec![1, 2])]
        );
        assert_eq!(
            parse(json!(["a", [3]])).expect("parses").inputs,
            [
                EmbeddingInput::Text("a".into()),
                EmbeddingInput::Tokens(vec![3])
            ]
        );
        for bad in [json!([]), json!(""), json!([[]]), json!([-1]), json!({})] {
            assert_eq!(
                parse(bad).expect_err("refused").param.as_deref(),
                Some("input")
            );
        }
        let err = parse_embeddings(br#"{"model":"m","input":"a","encoding_format":"int8"}"#)
            .expect_err("refused");
        assert_eq!(err.param.as_deref(), Some("encoding_format"));
    }

    #[test]
    fn dimensions_follow_the_models_matryoshka_sizes() {
        assert!(check_dimensions(&pooling(None), 64, None).is_ok());
        assert!(check_dimensions(&pooling(None), 64, Some(64)).is_ok());
        assert!(check_dimensions(&pooling(None), 64, Some(32)).is_err());
        assert!(check_dimensions(&pooling(Some(vec![])), 64, Some(32)).is_ok());
        assert!(check_dimensions(&pooling(Some(vec![])), 64, Some(65)).is_err());
        assert!(check_dimensions(&pooling(Some(vec![16, 32])), 64, Some(24)).is_err());
        assert!(check_dimensions(&pooling(Some(vec![16, 32])), 64, Some(16)).is_ok());
    }

    #[test]
    fn pooling_cuts_then_normalizes_and_base64_holds_the_same_floats() {
        let vector = pool(vec![3.0, 4.0, 12.0], &pooling(Some(vec![])), Some(2));
        assert_eq!(vector, [0.6, 0.8]);
        let body: Value = serde_json::from_str(&response(
            "m",
            std::slice::from_ref(&vector),
            EncodingFormat::Base64,
            5,
        ))
        .expect("JSON");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body["data"][0]["embedding"].as_str().expect("a string"))
            .expect("base64");
        let floats: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(floats, vector);
        assert_eq!(body["usage"]["prompt_tokens"], 5);
    }
}
