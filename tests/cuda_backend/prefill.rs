//! The tiled prefill attention kernel against the paged kernel.

use super::*;

fn cuda_paged_prefill(model: &Model) -> CudaBackend {
    let options = CudaOptions {
        flash_prefill: false,
        sample_on_device: false,
        ..CudaOptions::default()
    };
    cuda_backend(model, &engine_config(), options)
}

/// The tiled prefill attention kernel gives the logits of the paged split-K kernel: whole
/// prompts of several tiles and KV blocks, a chunked prefill, a prefix-cache hit, and a long
/// prompt whose few tiles split their keys over several blocks (`plan::prefill_splits`) whole
/// and as a short last chunk; on the fixtures (head_dim 16 and 32: `mma.sync`) and on
/// inferno-tiny read with head_dim 64 (warpgroup products on Hopper).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn flash_prefill_matches_the_paged_kernel() {
    require_gpu();
    let (_reshaped_dir, reshaped) = tiny_with_head_dim_64();
    let mut models: Vec<(&str, Model)> = ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"]
        .into_iter()
        .map(|name| (name, load(name)))
        .collect();
    models.push(("inferno-tiny as head_dim 64", reshaped));
    for (name, model) in models {
        // The warpgroup kernel wherever it can serve (on Hopper, head_dim 64), however few the
        // step's tiles.
        let options = CudaOptions {
            sample_on_device: false,
            warpgroup_prefill_blocks: Some(0),
            ..CudaOptions::default()
        };
        let mut flash = cuda_backend(&model, &engine_config(), options);
        let mut paged = cuda_paged_prefill(&model);
        let mut worst = 0.0f32;
        let mut blocks = Blocks { next: 0 };
        let seqs: Vec<Seq> = [3usize, 37, 130]
            .iter()
            .enumerate()
            .map(|(i, &n)| Seq::new(prompt(n, 40 + i as u32), &mut blocks, n))
            .collect();
        for s in &seqs {
            let n = s.tokens.len();
            let a = run_chunk(&mut flash, s, 0, n);
            let b = run_chunk(&mut paged, s, 0, n);
            worst = worst.max(max_abs_diff(&a, &b));
        }
        // Chunked: 50 + 47 + 33 tokens of the 130-token prompt, each chunk through the tiles.
        let s = &seqs[2];
        for (start, end) in [(0, 50), (50, 97)] {
            for backend in [&mut flash, &mut paged] {
                let row = BatchRow {
                    seq_id: 7,
                    tokens: &s.tokens[start..end],
                    start_pos: start,
                    block_table: &s.table,
                    sample: None,
                };
                backend.step(&[row]).expect("chunk");
            }
        }
        let a = run_chunk(&mut flash, s, 97, 130);
        let b = run_chunk(&mut paged, s, 97, 130);
        let chunked = max_abs_diff(&a, &b);
        // Prefix hit: the first 4 blocks of the 130-token prompt, then 20 new tokens.
        let mut tokens = s.tokens[..64].to_vec();
        tokens.extend(prompt(20, 99));
        let mut table = s.table[..4].to_vec();
        table.extend(blocks.take(2));
        let hit = Seq { tokens, table };
        let a = run_chunk(&mut flash, &hit, 64, 84);
        let b = run_chunk(&mut paged, &hit, 64, 84);
        let prefix = max_abs_diff(&a, &b);
        // Long context: 1,700 tokens in one step, then a 16-token chunk attending to 1,716 keys
        // (a tile or two: split in two over the keys).
        let long = Seq::new(prompt(1716, 77), &mut blocks, 1716);
        let mut split = 0.0f32;
        for (start, end) in [(0, 1700), (1700, 1716)] {
            let a = run_chunk(&mut flash, &long, start, end);
            let b = run_chunk(&mut paged, &long, start, end);
            split = split.max(max_abs_diff(&a, &b));
        }
        println!(
            "RESULT flash prefill vs paged, {name}: whole prompts {worst:.5}, chunked {chunked:.5}, prefix hit {prefix:.5}, long context split over blocks {split:.5}"
        );
        for (what, diff) in [
            ("whole", worst),
            ("chunked", chunked),
            ("prefix", prefix),
            ("split", split),
        ] {
            assert!(
                diff <= PREFILL_TOLERANCE,
                "{name} {what}: flash differs by {diff}"
            );
        }
    }
}
