//! Compiling the kernel families with NVRTC (in parallel, with the on-disk cache) and loading
//! them as modules.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use super::kernels::{self, FAMILIES, KernelFamily, KernelParams};

/// A kernel family failed to compile or load.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// NVRTC rejected the source; the log says why.
    #[error("kernel {kernel} failed to compile for {arch}:\n{log}")]
    Compile {
        /// The family's file name.
        kernel: &'static str,
        /// The target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// NVRTC itself failed (not the source).
    #[error("NVRTC failed on kernel {kernel}: {message}")]
    Nvrtc {
        /// The family's file name.
        kernel: &'static str,
        /// What failed.
        message: String,
    },
    /// The driver could not load the module or find an entry point.
    #[error("loading kernel {kernel}: {message}")]
    Load {
        /// The family's file name or entry point.
        kernel: String,
        /// What failed.
        message: String,
    },
}

/// A compiled family: the cubin and whether it came from the cache.
pub struct CompiledFamily {
    /// The family.
    pub family: KernelFamily,
    /// The cubin for the target architecture.
    pub cubin: Vec<u8>,
    /// Whether it was read from the on-disk cache.
    pub cached: bool,
    /// Its cache key (`kernels::cache_key`: source, shapes, architecture, NVRTC version).
    pub key: String,
}

/// The NVRTC version.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelError::Nvrtc {
            kernel: "(version)",
            message: format!("{rc:?}"),
        });
    }
    Ok((major, minor))
}

/// Compiles one family to a cubin for `arch`.
fn compile_family(
    family: &KernelFamily,
    params: &KernelParams,
    arch: &str,
) -> Result<Vec<u8>, KernelError> {
    let nvrtc_err = |message: String| KernelError::Nvrtc {
        kernel: family.name,
        message,
    };
    let src =
        CString::new(kernels::full_source(family, params)).map_err(|e| nvrtc_err(e.to_string()))?;
    let name = CString::new(family.name).map_err(|e| nvrtc_err(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| nvrtc_err(format!("{e:?}")))?;
    let options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    // SAFETY: `prog` is a live program created above; it is destroyed once at the end of this
    // block, after the log and cubin have been copied out. The cubin buffer is sized by
    // nvrtcGetCUBINSize.
    unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let result = match compiled {
            Err(_) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|raw| CStr::from_ptr(raw.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_else(|e| format!("(no log: {e:?})"));
                Err(KernelError::Compile {
                    kernel: family.name,
                    arch: arch.to_string(),
                    log,
                })
            }
            Ok(()) => {
                let mut size = 0usize;
                let rc = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(nvrtc_err(format!("cubin size: {rc:?}")))
                } else {
                    let mut cubin = vec![0u8; size];
                    let rc = nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast());
                    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(nvrtc_err(format!("cubin: {rc:?}")))
                    } else {
                        Ok(cubin)
                    }
                }
            }
        };
        let _ = nvrtc::destroy_program(prog);
        result
    }
}

/// Compiles every family in parallel (one thread each), reading and filling the on-disk cache.
pub fn compile_all(params: &KernelParams, arch: &str) -> Result<Vec<CompiledFamily>, KernelError> {
    let version = nvrtc_version()?;
    let dir = kernels::cache_dir();
    let started = Instant::now();
    let results: Vec<Result<CompiledFamily, KernelError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = FAMILIES
            .iter()
            .filter(|family| kernels::needed(family, params))
            .map(|family| {
                let dir = dir.clone();
                scope.spawn(move || {
                    let key = kernels::cache_key(family, params, arch, version);
                    if let Some(cubin) = dir.as_deref().and_then(|d| kernels::read_cached(d, &key)) {
                        return Ok(CompiledFamily { family: *family, cubin, cached: true, key });
                    }
                    let cubin = compile_family(family, params, arch)?;
                    if let Some(dir) = dir.as_deref()
                        && let Err(e) = kernels::write_cached(dir, &key, &cubin)
                    {
                        tracing::warn!(kernel = family.name, error = %e, "could not write the kernel cache");
                    }
                    Ok(CompiledFamily { family: *family, cubin, cached: false, key })
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(
                FAMILIES
                    .iter()
                    .filter(|family| kernels::needed(family, params)),
            )
            .map(|(h, family)| {
                h.join().unwrap_or_else(|_| {
                    Err(KernelError::Nvrtc {
                        kernel: family.name,
                        message: "compiler thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let compiled = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let hits = compiled.iter().filter(|c| c.cached).count();
    tracing::info!(
        families = compiled.len(),
        cache_hits = hits,
        arch,
        nvrtc = %format!("{}.{}", version.0, version.1),
        ms = started.elapsed().as_millis() as u64,
        "kernels ready"
    );
    Ok(compiled)
}

/// Loads compiled families into `ctx` and returns their entry points by name.
pub fn load_all(
    ctx: &Arc<CudaContext>,
    compiled: Vec<CompiledFamily>,
) -> Result<HashMap<&'static str, CudaFunction>, KernelError> {
    let mut functions = HashMap::new();
    for family in compiled {
        let module = ctx
            .load_module(Ptx::from_binary(family.cubin))
            .map_err(|e| KernelError::Load {
                kernel: family.family.name.to_string(),
                message: e.to_string(),
            })?;
        for entry in family.family.entry_points {
            let function = module.load_function(entry).map_err(|e| KernelError::Load {
                kernel: (*entry).to_string(),
                message: e.to_string(),
            })?;
            functions.insert(*entry, function);
        }
    }
    Ok(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles every family for sm_90a when NVRTC is installed (the GPU machine, or a machine
    /// with the nvidia-cuda-nvrtc wheel on LD_LIBRARY_PATH), at the shapes of all three fixture
    /// layouts and the 8B and 1B heads, each with a bf16 and an FP8 KV cache (prefill attention
    /// on warpgroup products for head_dim 128 and 64 with a bf16 cache, on mma.sync for 16 and
    /// for an FP8 cache). Ignored by default: it needs NVRTC.
    #[test]
    #[ignore = "needs libnvrtc: scripts/test.sh runs it when the nvidia-cuda-nvrtc wheel is there"]
    fn every_family_compiles_for_hopper() {
        // SAFETY: only checks that the library can be opened.
        assert!(
            unsafe { cudarc::nvrtc::sys::is_culib_present() },
            "libnvrtc is not installed (pip install nvidia-cuda-nvrtc; LD_LIBRARY_PATH)"
        );
        // The last fields: q/k/v bias, q/k norm, and an MLP width that is not a multiple of 4
        // (SwiGLU's one-element path).
        let shapes = [
            (64, 16, 4, 2, false, false, 160),
            (64, 16, 4, 2, true, false, 160),
            (64, 16, 4, 2, false, true, 162),
            (4096, 128, 32, 8, false, false, 14_336),
            (2048, 64, 32, 8, false, false, 8192),
        ];
        // Each shape with a bf16 and an FP8 KV cache (whose prefill attention takes the
        // mma.sync geometry).
        let cases = shapes
            .iter()
            .flat_map(|&shape| [(shape, false), (shape, true)]);
        for ((hidden, head_dim, q, kv, bias, norm, intermediate), kv_fp8) in cases {
            let flash = if kv_fp8 {
                crate::backend::cuda::plan::SMALL_FLASH
            } else {
                crate::backend::cuda::plan::flash_geometry(head_dim, "sm_90a")
            };
            let params = KernelParams {
                hidden,
                head_dim,
                num_q_heads: q,
                num_kv_heads: kv,
                vocab: 128_256,
                intermediate,
                kv_block: 16,
                rms_eps: 1e-6,
                qkv_bias: bias,
                qk_norm: norm,
                sliding_window: 0,
                mixed_windows: false,
                attn_sinks: false,
                uniform_layers: true,
                moe: None,
                flash,
                gemv_tensor_cores: true,
                kv_fp8,
            };
            for family in FAMILIES.iter().filter(|f| kernels::needed(f, &params)) {
                match compile_family(family, &params, "sm_90a") {
                    Ok(cubin) => assert!(!cubin.is_empty()),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        // The attention families with sinks (gpt-oss), over a sliding layer's window and a full
        // layer's none, at the tiny fixtures' heads and gpt-oss-20b's, the latter also with an
        // FP8 cache.
        // (The `_full` families compile each shape without the window.)
        let sink_shapes = [
            (16, 4, 2, 8, false),
            (64, 64, 8, 128, false),
            (64, 64, 8, 128, true),
        ];
        for (head_dim, q, kv, window, kv_fp8) in sink_shapes {
            let params = KernelParams {
                hidden: 2880,
                head_dim,
                num_q_heads: q,
                num_kv_heads: kv,
                vocab: 201_088,
                intermediate: 2880,
                kv_block: 16,
                rms_eps: 1e-5,
                qkv_bias: true,
                qk_norm: false,
                sliding_window: window,
                mixed_windows: false,
                attn_sinks: true,
                uniform_layers: true,
                moe: None,
                flash: if kv_fp8 {
                    crate::backend::cuda::plan::SMALL_FLASH
                } else {
                    crate::backend::cuda::plan::flash_geometry(head_dim, "sm_90a")
                },
                gemv_tensor_cores: true,
                kv_fp8,
            };
            for family in FAMILIES.iter().filter(|f| f.name.contains("attention")) {
                match compile_family(family, &params, "sm_90a") {
                    Ok(cubin) => assert!(!cubin.is_empty()),
                    Err(e) => panic!("{} with sinks, window {window}: {e}", family.name),
                }
            }
        }
        // gpt-oss's experts' family at the tiny fixtures' shapes and gpt-oss-120b's.
        let gpt_oss_family = FAMILIES.iter().find(|f| f.name == "gpt_oss.cu").unwrap();
        for (hidden, experts, width) in [(64, 8, 32), (2880, 128, 2880)] {
            let moe = crate::model::MoeDefinition {
                num_experts: experts,
                expert_intermediate: width,
                routing: crate::model::Routing::TopKSoftmax { top_k: 4 },
                shared_expert: None,
                experts: crate::model::ExpertKind::ClampedSwiGlu {
                    alpha: 1.702,
                    limit: 7.0,
                    mxfp4: true,
                },
            };
            let params = KernelParams {
                hidden,
                moe: Some(moe),
                ..KernelParams::from_definition(&tiny_gpt_oss())
            };
            assert_eq!(params.unsupported(), None);
            assert!(kernels::needed(gpt_oss_family, &params));
            match compile_family(gpt_oss_family, &params, "sm_90a") {
                Ok(cubin) => assert!(!cubin.is_empty()),
                Err(e) => panic!("{e}"),
            }
        }
        // The experts' family at the tiny fixtures' shapes (a shared expert with its gate
        // stacked under the router; top-2 of 8) and at Qwen3-30B-A3B's and the limits'
        // (top-8 of 128, top-16 of 512).
        let moe_family = FAMILIES.iter().find(|f| f.name == "moe.cu").unwrap();
        let shapes = [
            (64, 8, 2, 32, true, Some(48)),
            (64, 8, 2, 48, true, None),
            (2048, 128, 8, 768, false, None),
            (4096, 512, 16, 256, true, None),
        ];
        for (hidden, experts, top_k, width, renormalize, shared) in shapes {
            let params = KernelParams {
                hidden,
                head_dim: 128,
                num_q_heads: 32,
                num_kv_heads: 4,
                vocab: 151_936,
                intermediate: width,
                kv_block: 16,
                rms_eps: 1e-6,
                qkv_bias: false,
                qk_norm: true,
                sliding_window: 0,
                mixed_windows: false,
                attn_sinks: false,
                uniform_layers: true,
                moe: Some(crate::model::MoeDefinition {
                    num_experts: experts,
                    expert_intermediate: width,
                    routing: crate::model::Routing::SoftmaxTopK { top_k, renormalize },
                    shared_expert: shared,
                    experts: crate::model::ExpertKind::SwiGlu,
                }),
                flash: crate::backend::cuda::plan::flash_geometry(128, "sm_90a"),
                gemv_tensor_cores: true,
                kv_fp8: false,
            };
            match compile_family(moe_family, &params, "sm_90a") {
                Ok(cubin) => assert!(!cubin.is_empty()),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// The tiny gpt-oss fixture's definition (sliding and full layers, sinks, biases, experts).
    fn tiny_gpt_oss() -> crate::model::ModelDefinition {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gpt-oss");
        let path = dir.join("config.json");
        let config =
            crate::model::ModelConfig::from_json(&path, &std::fs::read(&path).unwrap()).unwrap();
        crate::model::ModelDefinition::of(&config)
    }

    /// A broken source yields an error that names the kernel and carries the NVRTC log.
    #[test]
    #[ignore = "needs libnvrtc: scripts/test.sh runs it when the nvidia-cuda-nvrtc wheel is there"]
    fn compile_errors_name_the_kernel_and_carry_the_log() {
        // SAFETY: only checks that the library can be opened.
        assert!(
            unsafe { cudarc::nvrtc::sys::is_culib_present() },
            "libnvrtc is not installed (pip install nvidia-cuda-nvrtc; LD_LIBRARY_PATH)"
        );
        let broken = KernelFamily {
            name: "broken.cu",
            source: "extern \"C\" __global__ void k() { undefined_name; }",
            entry_points: &["k"],
        };
        let params = KernelParams {
            hidden: 64,
            head_dim: 16,
            num_q_heads: 4,
            num_kv_heads: 2,
            vocab: 100,
            intermediate: 160,
            kv_block: 16,
            rms_eps: 1e-6,
            qkv_bias: false,
            qk_norm: false,
            sliding_window: 0,
            mixed_windows: false,
            attn_sinks: false,
            uniform_layers: true,
            moe: None,
            flash: crate::backend::cuda::plan::flash_geometry(16, "sm_90a"),
            gemv_tensor_cores: true,
            kv_fp8: false,
        };
        let err = compile_family(&broken, &params, "sm_90a").expect_err("must fail");
        let text = err.to_string();
        assert!(text.contains("broken.cu"), "{text}");
        assert!(text.contains("undefined_name"), "{text}");
    }
}
