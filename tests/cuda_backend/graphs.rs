//! Decode and mixed-step graphs replay what eager steps compute.

use super::*;

fn cuda_with(model: &Model, cuda_graphs: bool, sample_on_device: bool) -> CudaBackend {
    cuda_launching(model, cuda_graphs, sample_on_device, true)
}

fn cuda_launching(
    model: &Model,
    cuda_graphs: bool,
    sample_on_device: bool,
    programmatic_launch: bool,
) -> CudaBackend {
    let config = EngineConfig {
        cuda_graphs,
        programmatic_launch,
        ..engine_config()
    };
    let options = CudaOptions {
        sample_on_device,
        ..CudaOptions::default()
    };
    cuda_backend(model, &config, options)
}

/// Decode steps replayed from the captured graphs (batch sizes that fill a bucket and padded
/// ones) give the logits of eager steps and the same greedy tokens, with one copy each way; and
/// kernels launched with programmatic dependent launch compute exactly what plain stream-ordered
/// launches compute.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn decode_graphs_replay_what_eager_steps_compute() {
    let model = tiny_on_gpu();
    let mut eager = cuda_launching(&model, false, false, false);
    let mut graphed = cuda_with(&model, true, false);
    let mut plain = cuda_launching(&model, true, false, false);
    let mut sampled = cuda_with(&model, true, true);
    assert!(eager.graph_buckets().is_empty());
    assert_eq!(graphed.graph_buckets(), &[1, 2, 4, 8, 16]);

    let sizes = [1usize, 3, 4, 5, 13, 16];
    let mut blocks = Blocks { next: 0 };
    let mut seqs: Vec<Seq> = (0..16)
        .map(|i| {
            let n = 3 + 5 * i;
            Seq::new(prompt(n, i as u32 + 200), &mut blocks, n + sizes.len())
        })
        .collect();
    let prefill = prompt_rows(&seqs, 0, None);
    for backend in [&mut eager, &mut graphed, &mut plain, &mut sampled] {
        backend.step(&prefill).expect("prefill");
    }
    assert_eq!(
        graphed.graph_replays(),
        0,
        "a prefill step replayed a graph"
    );

    for (step, &size) in sizes.iter().enumerate() {
        for (i, s) in seqs.iter_mut().take(size).enumerate() {
            s.tokens.push(((step * 31 + i * 7) % 900 + 50) as u32);
        }
        let rows = last_token_rows(&seqs[..size]);
        let want = logits(eager.step(&rows).expect("eager decode"));
        let (replays, copies) = (graphed.graph_replays(), graphed.copy_stats());
        let got = logits(graphed.step(&rows).expect("graph decode"));
        let copies = graphed.copy_stats().since(&copies);
        let stream_ordered = logits(plain.step(&rows).expect("plain graph decode"));
        assert!(
            got == stream_ordered,
            "{size} rows: programmatic launches changed the logits"
        );
        assert_eq!(
            graphed.graph_replays(),
            replays + 1,
            "{size} rows ran eagerly"
        );
        assert_eq!(
            (copies.steps, copies.h2d, copies.d2h),
            (1, 1, 1),
            "{copies:?}"
        );
        let StepOutput::Sampled(tokens) = sampled.step(&rows).expect("sampled decode") else {
            panic!("expected sampled tokens");
        };
        assert_eq!((want.len(), got.len(), tokens.len()), (size, size, size));
        let mut worst = 0.0f32;
        for (r, ((w, g), t)) in want.iter().zip(&got).zip(&tokens).enumerate() {
            worst = worst.max(max_abs_diff(w, g));
            let (eager_best, margin) = argmax(w);
            let (graph_best, _) = argmax(g);
            // The sampling backend replays the same graph, so its token is the argmax exactly.
            assert_eq!(t.token as usize, graph_best, "{size} rows, row {r}");
            if margin > MARGIN {
                assert_eq!(graph_best, eager_best, "{size} rows, row {r}");
            }
        }
        println!("RESULT decode graph, {size} rows: max |graph - eager| logit {worst:.5}");
        assert!(worst <= 0.02, "{size} rows: graph logits differ by {worst}");
    }
    assert_eq!(eager.graph_replays(), 0);
    assert_eq!(sampled.graph_replays(), sizes.len() as u64);
}

/// Steps that carry prompt tokens, padded to a token-count bucket and replayed from segment
/// graphs between eagerly launched attention, give the logits of the same steps run wholly
/// eagerly, with one copy each way: prompts alone, and decode rows beside a prefill chunk, at a
/// bucket's exact size and padded.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn mixed_step_graphs_replay_what_eager_steps_compute() {
    let model = tiny_on_gpu();
    let config = |cuda_mixed_graphs| EngineConfig {
        cuda_mixed_graphs,
        ..engine_config()
    };
    let options = CudaOptions {
        sample_on_device: false,
        ..CudaOptions::default()
    };
    let mut eager = cuda_backend(&model, &config(false), options);
    let mut graphed = cuda_backend(&model, &config(true), options);
    assert!(eager.mixed_graph_buckets().is_empty());
    assert_eq!(graphed.mixed_graph_buckets().first(), Some(&16));
    assert_eq!(graphed.mixed_graph_buckets().last(), Some(&512));
    assert_eq!(graphed.step_sizes(), graphed.mixed_graph_buckets());

    // Four prompts of 10 to 19 tokens in one step (58 tokens, padded to 64); then the four
    // decode beside chunks of a fifth, 600-token prompt: 4 + 12 = 16 tokens (exact), 104
    // (padded to 112), 256 (exact), 236 (padded to 256), and its last 4 tokens, sampled (8,
    // padded to 16).
    let mut blocks = Blocks { next: 0 };
    let mut seqs: Vec<Seq> = (0..4)
        .map(|i| {
            let n = 10 + 3 * i;
            Seq::new(prompt(n, 300 + i as u32), &mut blocks, n + 8)
        })
        .collect();
    let long = Seq::new(prompt(600, 399), &mut blocks, 600);
    let first = prompt_rows(&seqs, 0, Some(greedy_spec(None)));
    compare_mixed_step(&mut eager, &mut graphed, &first, "four prompts");
    for (step, (start, end)) in [(0, 12), (12, 112), (112, 364), (364, 596), (596, 600)]
        .into_iter()
        .enumerate()
    {
        for (i, s) in seqs.iter_mut().enumerate() {
            s.tokens.push(((step * 37 + i * 11) % 900 + 50) as u32);
        }
        let mut rows = last_token_rows(&seqs);
        rows.push(BatchRow {
            seq_id: 9,
            tokens: &long.tokens[start..end],
            start_pos: start,
            block_table: &long.table,
            sample: (end == long.tokens.len()).then(|| greedy_spec(None)),
        });
        let what = format!("4 decodes + prompt tokens {start}..{end}");
        compare_mixed_step(&mut eager, &mut graphed, &rows, &what);
    }
    assert_eq!(eager.mixed_graph_replays(), 0);
    assert_eq!(
        graphed.graph_replays(),
        0,
        "a step with prompt tokens replayed a decode graph"
    );
}

/// One decode row per sequence: its last token, sampled greedily.
fn last_token_rows(seqs: &[Seq]) -> Vec<BatchRow<'_>> {
    seqs.iter()
        .enumerate()
        .map(|(i, s)| BatchRow {
            seq_id: i as u64,
            tokens: &s.tokens[s.tokens.len() - 1..],
            start_pos: s.tokens.len() - 1,
            block_table: &s.table,
            sample: Some(greedy_spec(None)),
        })
        .collect()
}

/// Runs `rows` on both backends and checks that `graphed` replayed its mixed-step graphs with one
/// copy each way and computed the eager backend's logits.
fn compare_mixed_step(
    eager: &mut CudaBackend,
    graphed: &mut CudaBackend,
    rows: &[BatchRow<'_>],
    what: &str,
) {
    let want = logits(eager.step(rows).expect("eager step"));
    let (replays, copies) = (graphed.mixed_graph_replays(), graphed.copy_stats());
    let got = logits(graphed.step(rows).expect("graphed step"));
    let copies = graphed.copy_stats().since(&copies);
    assert_eq!(
        graphed.mixed_graph_replays(),
        replays + 1,
        "{what} ran eagerly"
    );
    assert_eq!(
        (copies.steps, copies.h2d, copies.d2h),
        (1, 1, 1),
        "{what}: {copies:?}"
    );
    assert_eq!(want.len(), got.len(), "{what}: sampled rows");
    let mut worst = 0.0f32;
    for (r, (w, g)) in want.iter().zip(&got).enumerate() {
        worst = worst.max(max_abs_diff(w, g));
        let (eager_best, margin) = argmax(w);
        if margin > MARGIN {
            assert_eq!(argmax(g).0, eager_best, "{what}, row {r}");
        }
    }
    println!("RESULT mixed-step graphs, {what}: max |graph - eager| logit {worst:.5}");
    assert!(
        worst <= PREFILL_TOLERANCE,
        "{what}: graph logits differ by {worst}"
    );
}
