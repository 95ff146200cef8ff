//! Logits against the references and the CPU backend: teacher-forced, with the weights copied
//! while the model is read, and in mixed batches with chunked prefill and prefix hits.

use super::*;

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn teacher_forced_logits_match_the_references_and_the_cpu_backend() {
    require_gpu();
    for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"] {
        let model = load(name);
        let golden: serde_json::Value = serde_json::from_slice(
            &std::fs::read(gpu_fixtures().join(name).join("golden.json")).expect("golden.json"),
        )
        .expect("golden.json parses");
        let mut gpu = cuda(&model, false);
        let mut sampler = cuda(&model, true);
        let mut cpu = CpuBackend::new(&model, 64 << 20).expect("CPU backend");
        let (mut worst_cpu, mut worst_ref, mut worst_prefill) = (0.0f32, 0.0f32, 0.0f32);
        let (mut argmax_checks, mut greedy_checked) = (0, 0);
        let mut mismatches = Vec::new();
        for (c, case) in golden["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let forced = &case["teacher_forced"];
            let tokens = ids(&forced["tokens"]);
            let margins = floats(&forced["margins"]);
            let mut blocks = Blocks { next: 0 };
            let seq = Seq::new(tokens.clone(), &mut blocks, tokens.len());
            let g = per_position(&mut gpu, &seq);
            let r = per_position(&mut cpu, &seq);
            for (pos, ((gl, cl), margin)) in g.iter().zip(&r).zip(&margins).enumerate() {
                worst_cpu = worst_cpu.max(max_abs_diff(gl, cl));
                let top_ids = ids(&forced["top5_ids"][pos]);
                for (id, value) in top_ids.iter().zip(floats(&forced["top5_values"][pos])) {
                    worst_ref = worst_ref.max((gl[*id as usize] - value).abs());
                }
                if *margin > MARGIN {
                    let got = argmax(gl).0;
                    if got as u32 != top_ids[0] {
                        let want = top_ids[0] as usize;
                        mismatches.push(format!(
                            "{name} case {c} position {pos}: argmax {got} (cuda {:.4} / cpu {:.4}), reference {want} (cuda {:.4} / cpu {:.4}), reference margin {margin:.4}",
                            gl[got], cl[got], gl[want], cl[want]
                        ));
                    }
                    argmax_checks += 1;
                }
            }
            // The prompt as one prefill chunk gives the same last logits as token-by-token steps.
            let prompt = ids(&case["input_ids"]);
            let fresh = Seq::new(prompt.clone(), &mut blocks, prompt.len());
            let prefill = run_chunk(&mut gpu, &fresh, 0, prompt.len());
            worst_prefill = worst_prefill.max(max_abs_diff(&prefill, &g[prompt.len() - 1]));
            // Free-running greedy output agrees up to the first near-tie.
            let reference = ids(&case["greedy_24"]);
            let greedy_margins = floats(&case["greedy_margins"]);
            let produced = greedy(&mut sampler, &prompt, reference.len(), &mut blocks);
            for (step, ((want, got), margin)) in reference
                .iter()
                .zip(&produced)
                .zip(&greedy_margins)
                .enumerate()
            {
                if *margin < MARGIN {
                    break;
                }
                if got != want {
                    mismatches.push(format!(
                        "{name} case {c}: free-running greedy step {step} produced {got}, reference {want} (margin {margin:.4})"
                    ));
                    break;
                }
                greedy_checked += 1;
            }
        }
        println!(
            "RESULT {name}: max|cuda-cpu| = {worst_cpu:.4}, max|cuda-reference top5| = {worst_ref:.4}, max|prefill-stepwise| = {worst_prefill:.4}, {argmax_checks} argmax checks, {greedy_checked} greedy steps checked"
        );
        for m in &mismatches {
            println!("RESULT MISMATCH {m}");
        }
        assert!(
            mismatches.is_empty(),
            "{name}: {} of {argmax_checks} positions disagree with the reference",
            mismatches.len()
        );
        assert!(
            worst_cpu <= TOL_CPU,
            "{name}: logits differ from the CPU backend by {worst_cpu}"
        );
        assert!(
            worst_ref <= TOL_REF,
            "{name}: logits differ from the reference by {worst_ref}"
        );
        assert!(
            worst_prefill <= TOL_CPU,
            "{name}: prefill differs from stepwise by {worst_prefill}"
        );
        assert!(
            argmax_checks > 0,
            "{name}: no position had a margin above {MARGIN}"
        );
    }
}

/// inferno-tiny in a temporary copy whose shard header carries padding metadata, so the tensors
/// start 600 KiB before the first 16 MiB block boundary and the weights straddle it.
fn tiny_across_read_blocks() -> tempfile::TempDir {
    let dir = tiny_copy(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).expect("shard");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value =
        serde_json::from_slice(&bytes[8..8 + header_len]).expect("shard header");
    let target = (16 << 20) - (600 << 10);
    header["__metadata__"] = serde_json::json!({ "pad": "" });
    let bare = serde_json::to_vec(&header).unwrap().len();
    header["__metadata__"]["pad"] = "p".repeat(target - 8 - bare).into();
    let json = serde_json::to_vec(&header).unwrap();
    assert_eq!(8 + json.len(), target);
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(&path, out).expect("padded shard");
    dir
}

/// `inferno serve`'s start-up path: the backend prepared from the configuration before the
/// weights are read, the weights copied into it as the model is read, gives exactly the staged
/// upload's logits, whether every block was copied as it arrived, none was (the backend prepared
/// after the read), one waited for its shard's header and the weights' places and was copied
/// after them, or the backend was prepared for another configuration (then it is built again).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn weights_copied_while_the_model_is_read_give_the_staged_uploads_logits() {
    use inferno::model::BlockSink;
    let reference_model = tiny_on_gpu();
    let mut reference = cuda(&reference_model, false);
    let seq = Seq::new(prompt(21, 7), &mut Blocks { next: 0 }, 32);
    let expected = run_chunk(&mut reference, &seq, 0, seq.tokens.len());
    let dir = tiny_across_read_blocks();
    let block = inferno::model::files::READ_BLOCK;
    let hidden = indicatif::ProgressBar::hidden();
    let options = CudaOptions {
        measure_products: false,
        sample_on_device: false,
        ..CudaOptions::default()
    };
    let config = &reference_model.config;
    let mut other = config.clone();
    other.intermediate_size *= 2;
    for case in [
        "prepared, then read",
        "read, then prepared",
        "block 1 before the places, then block 0",
        "prepared for another configuration",
    ] {
        let early = std::sync::Arc::new(EarlyUpload::new());
        let mut opened = OpenedDevice::open(0).expect("opening the GPU");
        let files = match case {
            "prepared, then read" => {
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap()
            }
            "read, then prepared" => {
                let files = ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap();
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                files
            }
            "block 1 before the places, then block 0" => {
                let files = ModelFiles::read_dir(dir.path()).unwrap();
                let names: Vec<&str> = files.names().collect();
                let lens: Vec<(&str, usize)> = names
                    .iter()
                    .map(|n| (*n, files.get(n).unwrap().as_slice().len()))
                    .collect();
                early.begin(&lens);
                let index = names
                    .iter()
                    .position(|n| *n == "model.safetensors")
                    .unwrap();
                let shard = files.get("model.safetensors").unwrap().as_slice();
                early.block(index, block, &shard[block..]);
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(config, &engine_config(), options)
                    .unwrap();
                early.block(index, 0, &shard[..block]);
                files
            }
            _ => {
                opened.copy_early(early.clone());
                opened
                    .prepare_backend(&other, &engine_config(), options)
                    .unwrap();
                ModelFiles::read_dir_streaming(dir.path(), &hidden, &*early).unwrap()
            }
        };
        let model = Model::from_files(&files, "inferno-tiny".into()).unwrap();
        let mut backend =
            CudaBackend::on_device(opened, model.tensors(), &engine_config(), options, &hidden)
                .unwrap_or_else(|e| panic!("CUDA backend ({case}): {e}"));
        let stats = early.stats();
        println!("RESULT early upload, {case}: {stats:?}");
        let shard = files.get("model.safetensors").unwrap().as_slice();
        let data = shard.len() - 8 - u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
        match case {
            "prepared, then read" => {
                // Blocks read before their shard's header waited, then were copied.
                assert_eq!(stats.bytes, data, "every weight byte was copied early");
                assert!(stats.deferred_bytes <= data, "{stats:?}");
                assert_eq!(stats.whole_tensors, model.weights.names().count());
            }
            "read, then prepared" => assert_eq!((stats.bytes, stats.whole_tensors), (0, 0)),
            "block 1 before the places, then block 0" => {
                assert_eq!(stats.bytes, data, "{stats:?}");
                assert_eq!(stats.deferred_bytes, shard.len() - block, "{stats:?}");
            }
            _ => assert!(stats.bytes > 0 && stats.bytes < data, "{stats:?}"),
        }
        let got = run_chunk(&mut backend, &seq, 0, seq.tokens.len());
        assert_eq!(max_abs_diff(&got, &expected), 0.0, "{case}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn mixed_batches_chunked_prefill_and_prefix_hits_match_single_runs() {
    let model = tiny_on_gpu();
    let mut gpu = cuda(&model, false);
    let mut blocks = Blocks { next: 0 };
    let seqs: Vec<Seq> = [5usize, 17, 33, 40]
        .iter()
        .enumerate()
        .map(|(i, &n)| Seq::new(prompt(n, i as u32), &mut blocks, n + 8))
        .collect();
    let alone: Vec<Vec<f32>> = seqs
        .iter()
        .map(|s| run_chunk(&mut gpu, s, 0, s.tokens.len()))
        .collect();

    // All four prompts in one step.
    let rows = prompt_rows(&seqs, 0, Some(greedy_spec(None)));
    let batched = logits(gpu.step(&rows).expect("mixed step"));
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let diff = max_abs_diff(b, a);
        println!("RESULT mixed batch row {i}: max diff {diff:.5}");
        assert!(diff <= 0.02, "row {i}: batched logits differ by {diff}");
    }

    // Chunked prefill of the 40-token prompt: 16 + 7 + 17 tokens.
    let s = &seqs[3];
    for (start, end) in [(0, 16), (16, 23)] {
        let row = BatchRow {
            seq_id: 9,
            tokens: &s.tokens[start..end],
            start_pos: start,
            block_table: &s.table,
            sample: None,
        };
        gpu.step(&[row]).expect("chunk");
    }
    let chunked = run_chunk(&mut gpu, s, 23, 40);
    let diff = max_abs_diff(&chunked, &alone[3]);
    println!("RESULT chunked prefill: max diff {diff:.5}");
    assert!(
        diff <= PREFILL_TOLERANCE,
        "chunked prefill differs by {diff}"
    );

    // Prefix hit: a prompt that shares the first two blocks (32 tokens) of the 33-token prompt
    // reuses them and computes only its own tail.
    let mut tokens = seqs[2].tokens[..32].to_vec();
    tokens.extend(prompt(9, 77));
    let fresh = Seq::new(tokens.clone(), &mut blocks, tokens.len());
    let reference = run_chunk(&mut gpu, &fresh, 0, tokens.len());
    let mut table = seqs[2].table[..2].to_vec();
    table.extend(blocks.take(1));
    let hit = Seq { tokens, table };
    let cached = run_chunk(&mut gpu, &hit, 32, hit.tokens.len());
    let diff = max_abs_diff(&cached, &reference);
    println!("RESULT prefix hit: max diff {diff:.5}");
    assert!(diff <= PREFILL_TOLERANCE, "prefix hit differs by {diff}");

    // A decode row and a prefill row in one step.
    let a = &seqs[0];
    let mut a_tokens = a.tokens.clone();
    a_tokens.push(42);
    let a2 = Seq {
        tokens: a_tokens,
        table: a.table.clone(),
    };
    let decode_alone = run_chunk(&mut gpu, &a2, 5, 6);
    let b = &seqs[1];
    let rows = [
        BatchRow {
            seq_id: 1,
            tokens: &a2.tokens[5..6],
            start_pos: 5,
            block_table: &a2.table,
            sample: Some(greedy_spec(None)),
        },
        BatchRow {
            seq_id: 2,
            tokens: &b.tokens,
            start_pos: 0,
            block_table: &b.table,
            sample: Some(greedy_spec(None)),
        },
    ];
    let mixed = logits(gpu.step(&rows).expect("decode + prefill"));
    let diff = max_abs_diff(&mixed[0], &decode_alone).max(max_abs_diff(&mixed[1], &alone[1]));
    println!("RESULT decode+prefill step: max diff {diff:.5}");
    assert!(
        diff <= PREFILL_TOLERANCE,
        "decode + prefill step differs by {diff}"
    );
}
