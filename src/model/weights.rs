//! Safetensors weights: one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, held in memory as read (and hashed) once at load, or borrowed
//! from the binary for an embedded model, with their headers validated at load and tensors
//! converted to f32 on demand.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::error::ModelError;
use super::source::{ModelSource, SourceBytes};

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The element types the engine accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// FP8 E4M3 (`float8_e4m3fn`): the values of an FP8 projection, scaled by its scale tensor.
    F8E4M3,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            Self::F8E4M3 => 1,
            Self::BF16 | Self::F16 => 2,
            Self::F32 => 4,
        }
    }

    /// The accepted counterpart of a safetensors dtype.
    fn from_safetensors(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::BF16 => Some(Self::BF16),
            Dtype::F16 => Some(Self::F16),
            Dtype::F32 => Some(Self::F32),
            Dtype::F8_E4M3 => Some(Self::F8E4M3),
            _ => None,
        }
    }
}

/// A borrowed view of one tensor's little-endian, row-major bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The raw bytes (`shape.product() * dtype.size()` of them).
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// The elements converted to f32 (exact for every accepted dtype; FP8 values unscaled).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            DType::F8E4M3 => self
                .data
                .iter()
                .map(|&b| super::fp8::e4m3_to_f32(b))
                .collect(),
            DType::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::BF16 => self
                .data
                .chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            DType::F16 => self
                .data
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        }
    }
}

/// Widens a bfloat16 value to f32 (bfloat16 is the upper half of an f32).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Widens an IEEE binary16 value to f32, the one conversion every backend uses.
///
/// Every finite binary16 value (subnormals included) and both infinities are exactly
/// representable in f32 and come out exact, signed zeros included. A NaN stays a NaN with its
/// sign and payload; a signalling NaN comes out quiet (its quiet bit set), as IEEE 754 and the
/// hardware conversions (x86 F16C, ARM FCVT) do.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x03ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        (0, m) => {
            // Subnormal: value = m * 2^-24, renormalised for f32.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x03ff;
            ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, 0) => 0xff << 23,
        // NaN: the payload moves up with the mantissa; the quiet bit is set.
        (0x1f, m) => (0xff << 23) | (1 << 22) | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// One weights file.
struct Shard {
    path: PathBuf,
    bytes: SourceBytes,
}

/// Where a tensor lives. `range` is in bounds of its shard's bytes: `read_metadata` checked that
/// the data offsets tile the data section exactly and that the file ends where they end.
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    range: Range<usize>,
}

/// All tensors of a model, indexed by name.
pub struct ModelWeights {
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

impl std::fmt::Debug for ModelWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelWeights")
            .field(
                "files",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl ModelWeights {
    /// Opens the weights of `source`: `model.safetensors`, or the shards that
    /// `model.safetensors.index.json` lists.
    pub(crate) fn open(source: &ModelSource<'_>) -> Result<Self, ModelError> {
        let files = match source.read_optional(INDEX_FILE)? {
            Some(index) => shard_files(&source.path(INDEX_FILE), &index)?,
            None => vec![(SINGLE_FILE.to_owned(), Vec::new())],
        };
        let mut weights = Self {
            shards: Vec::with_capacity(files.len()),
            tensors: HashMap::new(),
        };
        for (file, expected) in files {
            let bytes = source.bytes(&file)?;
            weights.add_shard(source.path(&file), bytes, &expected)?;
        }
        Ok(weights)
    }

    /// Parses one file's header, registers its tensors and checks that it holds every tensor the
    /// index assigned to it.
    fn add_shard(
        &mut self,
        path: PathBuf,
        bytes: SourceBytes,
        expected: &[String],
    ) -> Result<(), ModelError> {
        let corrupt = |reason: String| ModelError::CorruptSafetensors {
            path: path.clone(),
            reason,
        };
        let (header_len, metadata) =
            SafeTensors::read_metadata(bytes.as_slice()).map_err(|e| corrupt(e.to_string()))?;
        let data_start = header_len
            .checked_add(8)
            .ok_or_else(|| corrupt("header length overflows".into()))?;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                range: data_start + start..data_start + end,
            };
            if let Some(previous) = self.tensors.insert(name.clone(), entry) {
                return Err(ModelError::DuplicateTensor {
                    name,
                    first: self.shards[previous.shard].path.clone(),
                    second: path,
                });
            }
        }
        let in_this_file = |name: &String| self.tensors.get(name).is_some_and(|e| e.shard == shard);
        if let Some(missing) = expected.iter().find(|name| !in_this_file(name)) {
            return Err(ModelError::TensorNotInShard {
                name: missing.clone(),
                path,
            });
        }
        self.shards.push(Shard { path, bytes });
        Ok(())
    }

    /// Whether the tensors are named as a sentence-transformers export of the bare transformer
    /// names them (Qwen3-Embedding): `embed_tokens.weight`, `layers.{i}.…`, `norm.weight`, with
    /// no `model.` prefix anywhere.
    pub fn bare_names(&self) -> bool {
        self.tensors.contains_key("embed_tokens.weight")
            && !self.tensors.keys().any(|name| name.starts_with("model."))
    }

    /// Renames every tensor `model.{name}`: the names [`super::layout`] expects, for weights
    /// with [`Self::bare_names`].
    pub(crate) fn add_model_prefix(&mut self) {
        self.tensors = std::mem::take(&mut self.tensors)
            .into_iter()
            .map(|(name, entry)| (format!("model.{name}"), entry))
            .collect();
    }

    /// Whether a tensor called `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names of all tensors in the weights files.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let entry = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
            })?;
        let shard = &self.shards[entry.shard];
        let dtype =
            DType::from_safetensors(entry.dtype).ok_or_else(|| ModelError::TensorDtype {
                name: name.to_owned(),
                path: shard.path.clone(),
                dtype: format!("{:?}", entry.dtype),
                expected: "BF16, F16, F32 or F8_E4M3",
            })?;
        Ok(TensorView {
            dtype,
            shape: entry.shape.clone(),
            data: &shard.bytes.as_slice()[entry.range.clone()],
        })
    }

    /// Checks that `spec`'s tensor exists with its shape, in FP8 exactly when the spec says so.
    pub fn check_spec(&self, spec: &super::TensorSpec) -> Result<TensorView<'_>, ModelError> {
        let view = self.check(&spec.name, &spec.shape)?;
        if (view.dtype == DType::F8E4M3) != spec.fp8 {
            return Err(ModelError::TensorDtype {
                name: spec.name.clone(),
                path: self.file_of(&spec.name),
                dtype: format!("{:?}", view.dtype),
                expected: if spec.fp8 {
                    "F8_E4M3, as the quantization_config declares"
                } else {
                    "BF16, F16 or F32"
                },
            });
        }
        Ok(view)
    }

    /// Checks that `name` exists with `expected_shape`.
    pub fn check(
        &self,
        name: &str,
        expected_shape: &[usize],
    ) -> Result<TensorView<'_>, ModelError> {
        let view = self.tensor(name)?;
        if view.shape != expected_shape {
            return Err(ModelError::TensorShape {
                name: name.to_owned(),
                path: self.file_of(name),
                expected: expected_shape.to_vec(),
                actual: view.shape,
            });
        }
        Ok(view)
    }

    /// The tensor `name`, checked against `expected_shape` and converted to f32.
    pub fn to_f32(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        Ok(self.check(name, expected_shape)?.to_f32())
    }

    /// The `[out, in]` matrix of the projection `spec` in f32, checked against its layout: its
    /// values as stored; for an FP8 projection in the checkpoint its E4M3 values times their
    /// scales; for one quantized at load the values an FP8 copy of the stored matrix holds.
    pub fn linear_f32(&self, spec: &super::LinearTensors) -> Result<Vec<f32>, ModelError> {
        let (out, inp) = (spec.weight.shape[0], spec.weight.shape[1]);
        let values = self.check_spec(&spec.weight)?.to_f32();
        let Some(fp8) = &spec.fp8 else {
            return Ok(values);
        };
        Ok(match &fp8.scale {
            Some(scale) => {
                let scales = self.check_spec(scale)?.to_f32();
                fp8.weights.dequantize(&values, &scales, inp)
            }
            None => {
                let (values, scales) = fp8.weights.quantize(&values, out, inp);
                fp8.weights.dequantize(&values, &scales, inp)
            }
        })
    }

    /// One projection of every expert in f32, fused in expert order into one contiguous
    /// `[num_experts, out, in]` tensor: each expert's matrix as [`ModelWeights::linear_f32`]
    /// gives it (dequantized when in FP8), checked against its layout.
    pub fn fused_experts_f32(&self, fused: &super::FusedExperts) -> Result<Vec<f32>, ModelError> {
        let mut values = Vec::with_capacity(fused.shape.iter().product());
        for expert in &fused.experts {
            values.extend(self.linear_f32(expert)?);
        }
        Ok(values)
    }

    /// The bytes of the packed tensor `spec` (stored as `U8`), checked against its shape.
    pub fn packed(&self, spec: &super::TensorSpec) -> Result<&[u8], ModelError> {
        let entry = self
            .tensors
            .get(&spec.name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: spec.name.clone(),
            })?;
        if entry.dtype != Dtype::U8 {
            return Err(ModelError::TensorDtype {
                name: spec.name.clone(),
                path: self.file_of(&spec.name),
                dtype: format!("{:?}", entry.dtype),
                expected: "U8 (packed MXFP4 blocks or E8M0 scales)",
            });
        }
        if entry.shape != spec.shape {
            return Err(ModelError::TensorShape {
                name: spec.name.clone(),
                path: self.file_of(&spec.name),
                expected: spec.shape.clone(),
                actual: entry.shape.clone(),
            });
        }
        Ok(&self.shards[entry.shard].bytes.as_slice()[entry.range.clone()])
    }

    /// The file holding `name` (for error messages).
    pub(crate) fn file_of(&self, name: &str) -> PathBuf {
        self.tensors
            .get(name)
            .map(|e| self.shards[e.shard].path.clone())
            .unwrap_or_default()
    }
}

/// The shard files named by an index, each with the tensors assigned to it, in name order.
fn shard_files(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Vec<String>)>, ModelError> {
    let map = super::json::parse_object(path, bytes)?;
    let index = super::json::JsonObject::new(path, &map);
    let Some(serde_json::Value::Object(weight_map)) = index.get("weight_map") else {
        return Err(index.invalid("weight_map", "missing or not an object"));
    };
    let mut files: HashMap<&str, Vec<String>> = HashMap::new();
    for (tensor, file) in weight_map {
        let file = file
            .as_str()
            .filter(|f| is_plain_file_name(f))
            .ok_or_else(|| {
                index.invalid(
                    &format!("weight_map.{tensor}"),
                    "expected a file name in the model directory",
                )
            })?;
        files.entry(file).or_default().push(tensor.clone());
    }
    if files.is_empty() {
        return Err(index.invalid("weight_map", "lists no tensors"));
    }
    let mut files: Vec<(String, Vec<String>)> =
        files.into_iter().map(|(f, t)| (f.to_owned(), t)).collect();
    files.sort();
    Ok(files)
}

/// Whether `name` names a file directly inside the model directory.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_covers_every_class() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    /// Every one of the 65,536 binary16 values against its definition.
    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let negative = bits & 0x8000 != 0;
            let exponent = i32::from((bits >> 10) & 0x1f);
            let mantissa = u32::from(bits & 0x03ff);
            let got = f16_to_f32(bits);
            assert_eq!(got.is_sign_negative(), negative, "{bits:#06x}: sign");
            match exponent {
                0x1f if mantissa == 0 => assert!(got.is_infinite(), "{bits:#06x}"),
                0x1f => {
                    assert!(got.is_nan(), "{bits:#06x}");
                    let out = got.to_bits();
                    assert_ne!(out & (1 << 22), 0, "{bits:#06x}: NaN must come out quiet");
                    assert_eq!(
                        (out >> 13) & 0x1ff,
                        mantissa & 0x1ff,
                        "{bits:#06x}: payload"
                    );
                }
                _ => {
                    let magnitude = if exponent == 0 {
                        f64::from(mantissa) * 2f64.powi(-24)
                    } else {
                        (1.0 + f64::from(mantissa) / 1024.0) * 2f64.powi(exponent - 15)
                    };
                    let want = if negative { -magnitude } else { magnitude };
                    assert_eq!(f64::from(got), want, "{bits:#06x}");
                }
            }
        }
    }

    #[test]
    fn f16_signalling_nan_comes_out_quiet() {
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7fc0_2000);
        assert_eq!(f16_to_f32(0xfe00).to_bits(), 0xffc0_0000);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn bf16_conversion_is_exact() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc0a0), -5.0);
    }
}
