//! The device sampler: one copy each way per step, agreement with the engine's reference
//! sampler in every mode and at a full vocabulary, grammar masks and `logit_bias`.

use super::*;

#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampling_matches_host_logits_with_one_copy_each_way() {
    let model = tiny_on_gpu();
    let mut host = cuda(&model, false);
    let mut device = cuda(&model, true);
    let mut blocks = Blocks { next: 0 };
    let seq = Seq::new(prompt(20, 3), &mut blocks, 40);
    let reference = run_chunk(&mut host, &seq, 0, 20);
    let row = BatchRow {
        seq_id: 1,
        tokens: &seq.tokens,
        start_pos: 0,
        block_table: &seq.table,
        sample: Some(greedy_spec(Some(5))),
    };
    let before = device.copy_stats();
    let out = device.step(&[row]).expect("step");
    let copies = device.copy_stats().since(&before);
    assert_eq!(
        (copies.steps, copies.h2d, copies.d2h),
        (1, 1, 1),
        "{copies:?}"
    );
    let StepOutput::Sampled(tokens) = out else {
        panic!("expected sampled tokens")
    };
    let (want, _) = argmax(&reference);
    assert_eq!(tokens[0].token as usize, want);
    let max = reference.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + reference.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let lp = tokens[0].logprob.as_ref().expect("logprobs");
    assert!(
        (lp.logprob - (reference[want] - lse)).abs() < 1e-3,
        "{} vs {}",
        lp.logprob,
        reference[want] - lse
    );
    assert_eq!(lp.top.len(), 5);
    assert_eq!(lp.top[0].0 as usize, want);
    for pair in lp.top.windows(2) {
        assert!(
            pair[0].1 >= pair[1].1,
            "alternatives out of order: {:?}",
            lp.top
        );
    }
    // The engine's reference sampler, fed the same logits, picks the same token and the same
    // alternatives (same order) with the same logprobs.
    let host = inferno::engine::sampling::sample(reference.clone(), &greedy_spec(Some(5)));
    let host_lp = host.logprob.as_ref().expect("reference logprobs");
    assert_eq!(host.token, tokens[0].token);
    assert!((host_lp.logprob - lp.logprob).abs() < 1e-4);
    let ids = |top: &[(u32, f32)]| top.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    assert_eq!(ids(&host_lp.top), ids(&lp.top));
    for ((_, a), (_, b)) in host_lp.top.iter().zip(&lp.top) {
        assert!((a - b).abs() < 1e-4, "{:?} vs {:?}", host_lp.top, lp.top);
    }

    // Decode steps: exactly one copy each way per step.
    let mut tokens = seq.tokens.clone();
    tokens.push(tokens[0]);
    let seq = Seq {
        tokens,
        table: seq.table,
    };
    let before = device.copy_stats();
    for _ in 0..4 {
        let row = BatchRow {
            seq_id: 1,
            tokens: &seq.tokens[20..21],
            start_pos: 20,
            block_table: &seq.table,
            sample: Some(greedy_spec(None)),
        };
        device.step(&[row]).expect("decode");
    }
    let copies = device.copy_stats().since(&before);
    println!("RESULT copies over 4 decode steps: {copies:?}");
    assert_eq!((copies.steps, copies.h2d, copies.d2h), (4, 4, 4));
}

/// A host-sampling and a device-sampling backend that have both prefilled the same 16 sequences
/// (all but the last of their 24 tokens, prompts salted from `salt`), ready for decode steps.
fn prefilled_host_and_device(model: &Model, salt: u32) -> (CudaBackend, CudaBackend, Vec<Seq>) {
    let mut host = cuda(model, false);
    let mut device = cuda(model, true);
    let mut blocks = Blocks { next: 0 };
    let seqs: Vec<Seq> = (0..16)
        .map(|i| Seq::new(prompt(24, salt + i), &mut blocks, 24))
        .collect();
    {
        let prefill = prompt_rows(&seqs, 1, None);
        host.step(&prefill).expect("prefill");
        device.step(&prefill).expect("prefill");
    }
    (host, device, seqs)
}

/// The device sampler against the engine's reference sampler (`engine::sampling`) on the same
/// logits, in every mode: the same token for every greedy draw (penalties included) and for at
/// least 99% of seeded draws, with one copy each way per step.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_agrees_with_the_reference_sampler_in_every_mode() {
    sampler_agrees_in_every_mode(&tiny_on_gpu(), 40);
}

/// The same at Llama 3's vocabulary of 128,256 ids (inferno-tiny's 1,024 fit in one pass of the
/// sampler's block; here every pass over a row keeps several loads in flight per thread and the
/// ranked-prefix search narrows 30 bits over a row of exact and near ties).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_agrees_with_the_reference_sampler_at_a_full_vocabulary() {
    require_gpu();
    let (_dir, model) = tiny_with_vocab(128_256);
    sampler_agrees_in_every_mode(&model, 10);
}

/// The device sampler against the reference sampler on `model`: every greedy draw equal, and at
/// least 99% of `seeded_steps` steps of 16 seeded draws in each sampling mode.
fn sampler_agrees_in_every_mode(model: &Model, seeded_steps: u64) {
    use inferno::engine::sampling;
    // Both backends run the same kernels on the same batches, so their logits are identical.
    let (mut host, mut device, seqs) = prefilled_host_and_device(model, 300);

    // The tokens each row would pick greedily, generated twice so far: the penalties must move
    // some rows away from them.
    let plain: Vec<SampleSpec<'_>> = (0..16).map(|_| greedy_spec(None)).collect();
    let first = logits(host.step(&decode_rows(&seqs, &plain)).expect("decode"));
    let outputs: Vec<Vec<u32>> = first
        .iter()
        .map(|l| {
            let best = argmax(l).0 as u32;
            vec![best, 7, best]
        })
        .collect();

    let base = SamplingParams::default();
    let modes: Vec<(&str, SamplingParams, bool)> = vec![
        ("greedy", base.clone(), true),
        (
            "top_k=1 at T=1",
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                ..base.clone()
            },
            true,
        ),
        (
            "greedy + penalties",
            SamplingParams {
                repetition_penalty: 1.5,
                frequency_penalty: 0.7,
                presence_penalty: 0.4,
                ..base.clone()
            },
            true,
        ),
        (
            "T=1",
            SamplingParams {
                temperature: 1.0,
                ..base.clone()
            },
            false,
        ),
        (
            "T=0.7 top_k=50",
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                ..base.clone()
            },
            false,
        ),
        (
            "T=1 top_p=0.9",
            SamplingParams {
                temperature: 1.0,
                top_p: 0.9,
                ..base.clone()
            },
            false,
        ),
        (
            "T=1 min_p=0.05",
            SamplingParams {
                temperature: 1.0,
                min_p: 0.05,
                ..base.clone()
            },
            false,
        ),
        (
            "T=0.8 top_k=40 top_p=0.95 min_p=0.02 + penalties",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.02,
                repetition_penalty: 1.2,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                ..base.clone()
            },
            false,
        ),
    ];
    let mut penalties_moved = 0;
    for (name, params, exact) in &modes {
        let (mut same, mut total) = (0usize, 0usize);
        let steps = if *exact { 2 } else { seeded_steps };
        for step in 0..steps {
            let specs: Vec<SampleSpec<'_>> = (0..16)
                .map(|r| SampleSpec {
                    params,
                    seed: 1000 + r as u64,
                    draw_index: step,
                    prompt: &seqs[r].tokens,
                    output: &outputs[r],
                    logprobs: (r % 4 == 0).then_some(3),
                    mask: None,
                })
                .collect();
            let rows = decode_rows(&seqs, &specs);
            let want = logits(host.step(&rows).expect("host decode"));
            let before = device.copy_stats();
            let StepOutput::Sampled(got) = device.step(&rows).expect("device decode") else {
                panic!("expected sampled tokens");
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!((copies.h2d, copies.d2h), (1, 1), "{name}: {copies:?}");
            for (r, (l, g)) in want.iter().zip(&got).enumerate() {
                let reference = sampling::sample(l.clone(), &specs[r]);
                total += 1;
                if reference.token == g.token {
                    same += 1;
                    if let (Some(a), Some(b)) = (&reference.logprob, &g.logprob) {
                        assert!(
                            (a.logprob - b.logprob).abs() < 1e-3,
                            "{name}: logprob {} vs {}",
                            a.logprob,
                            b.logprob
                        );
                    }
                }
                if *exact {
                    assert_eq!(reference.token, g.token, "{name}, row {r}, step {step}");
                }
                if params.has_penalties() && params.temperature == 0.0 {
                    let unpenalised = sampling::sample(l.clone(), &greedy_spec(None));
                    penalties_moved += usize::from(unpenalised.token != reference.token);
                }
            }
        }
        let share = same as f64 / total as f64;
        println!("RESULT device sampler, {name}: {same}/{total} draws equal the reference");
        assert!(share >= 0.99, "{name}: only {same}/{total} draws agree");
    }
    println!("RESULT penalties changed {penalties_moved} greedy tokens");
    assert!(penalties_moved > 0, "the penalties changed no greedy token");
}

/// A grammar-style mask over `vocab` tokens allowing those `allow` picks (bit `t % 32` of word
/// `t / 32` is token `t`).
fn mask_of(vocab: usize, allow: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut mask = vec![0u32; vocab.div_ceil(32)];
    for t in (0..vocab).filter(|&t| allow(t)) {
        mask[t / 32] |= 1 << (t % 32);
    }
    mask
}

/// Grammar masks and `logit_bias` applied by the device sampler against the reference sampler
/// on the same logits: the same token for every greedy row and at least 99% of seeded draws,
/// never a token outside the mask, the raw logprobs of the reference, and still one copy each
/// way per step (the masks and biases travel in the packed inputs). Masks given late
/// (`start_step` queues the forward pass, `finish_step` brings the masks) draw the same tokens,
/// with one more host-to-device copy.
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/gpu-check.sh runs it with --include-ignored"]
fn device_sampler_applies_masks_and_logit_bias_like_the_reference() {
    use inferno::constrain::is_allowed;
    use inferno::engine::sampling;
    let model = tiny_on_gpu();
    let vocab = model.config.vocab_size;
    let (mut host, mut device, seqs) = prefilled_host_and_device(&model, 500);
    let plain: Vec<SampleSpec<'_>> = (0..16).map(|_| greedy_spec(None)).collect();
    let first = logits(host.step(&decode_rows(&seqs, &plain)).expect("decode"));
    let best: Vec<usize> = first.iter().map(|l| argmax(l).0).collect();

    // Per row: a mask of about a third of the vocabulary without the row's greedy token, and a
    // mask of two tokens (one past the last full word when the vocabulary has a partial one).
    let wide: Vec<Vec<u32>> = (0..16)
        .map(|r| mask_of(vocab, |t| t != best[r] && (t * 7 + r) % 3 == 0))
        .collect();
    let narrow: Vec<Vec<u32>> = (0..16)
        .map(|r| mask_of(vocab, |t| t == (r * 37) % vocab || t == vocab - 1 - r))
        .collect();
    // Per row: +100 on one token (it must win), -100 on the greedy token, and a few mild ones.
    let forced: Vec<SamplingParams> = (0..16)
        .map(|r| SamplingParams {
            logit_bias: vec![(((r * 53 + 11) % vocab) as u32, 100.0)],
            ..SamplingParams::default()
        })
        .collect();
    let mut mild_bias: Vec<Vec<(u32, f32)>> = (0..16)
        .map(|r| {
            let mut bias = vec![(best[r] as u32, -100.0), ((r * 13 % vocab) as u32, 2.5)];
            bias.push((((r * 13 + 1) % vocab) as u32, -1.25));
            bias.sort_by_key(|b| b.0);
            bias.dedup_by_key(|b| b.0);
            bias
        })
        .collect();
    let greedy_mild: Vec<SamplingParams> = mild_bias
        .iter()
        .map(|bias| SamplingParams {
            logit_bias: bias.clone(),
            ..SamplingParams::default()
        })
        .collect();
    let seeded_mild: Vec<SamplingParams> = mild_bias
        .drain(..)
        .map(|bias| SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            logit_bias: bias,
            ..SamplingParams::default()
        })
        .collect();
    let greedy_params: Vec<SamplingParams> = (0..16).map(|_| SamplingParams::default()).collect();
    let seeded_params: Vec<SamplingParams> = (0..16)
        .map(|_| SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        })
        .collect();
    let none: Vec<Option<Vec<u32>>> = (0..16).map(|_| None).collect();
    let wide_masks: Vec<Option<Vec<u32>>> = wide.iter().cloned().map(Some).collect();
    let narrow_masks: Vec<Option<Vec<u32>>> = narrow.iter().cloned().map(Some).collect();
    // (name, per-row parameters, per-row masks, exact)
    type Mode<'a> = (&'a str, &'a [SamplingParams], &'a [Option<Vec<u32>>], bool);
    let modes: Vec<Mode<'_>> = vec![
        ("greedy + wide mask", &greedy_params, &wide_masks, true),
        (
            "greedy + two-token mask",
            &greedy_params,
            &narrow_masks,
            true,
        ),
        ("greedy + logit_bias +100", &forced, &none, true),
        ("greedy + mild logit_bias", &greedy_mild, &none, true),
        (
            "greedy + mild logit_bias + wide mask",
            &greedy_mild,
            &wide_masks,
            true,
        ),
        ("T=1 + wide mask", &seeded_params, &wide_masks, false),
        ("T=1 + two-token mask", &seeded_params, &narrow_masks, false),
        (
            "T=0.9 top_k top_p penalties + mild logit_bias",
            &seeded_mild,
            &none,
            false,
        ),
        (
            "T=0.9 top_k top_p penalties + mild logit_bias + wide mask",
            &seeded_mild,
            &wide_masks,
            false,
        ),
    ];
    let outputs: Vec<Vec<u32>> = best.iter().map(|&b| vec![b as u32, 7]).collect();
    let mut moved = 0;
    for (name, params, masks, exact) in &modes {
        let (mut same, mut total) = (0usize, 0usize);
        let steps = if *exact { 2 } else { 30 };
        for step in 0..steps {
            let specs: Vec<SampleSpec<'_>> = (0..16)
                .map(|r| SampleSpec {
                    params: &params[r],
                    seed: 2000 + r as u64,
                    draw_index: step,
                    prompt: &seqs[r].tokens,
                    output: &outputs[r],
                    logprobs: (r % 3 == 0).then_some(4),
                    mask: masks[r].as_deref(),
                })
                .collect();
            let rows = decode_rows(&seqs, &specs);
            let want = logits(host.step(&rows).expect("host decode"));
            let before = device.copy_stats();
            let StepOutput::Sampled(got) = device.step(&rows).expect("device decode") else {
                panic!(
                    "{name}: expected sampled tokens: masked and biased rows sample on the device"
                );
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!(
                (copies.steps, copies.h2d, copies.d2h),
                (1, 1, 1),
                "{name}: {copies:?}"
            );
            // The same step started before its masks were ready (the engine computes them, and
            // streams the previous tokens, while the forward pass runs): a device-sampling
            // backend starts every step; the same tokens and logprobs, one extra small
            // host-to-device copy for the late masks, none when no row has a mask.
            let late: Vec<bool> = specs.iter().map(|s| s.mask.is_some()).collect();
            let early: Vec<SampleSpec<'_>> = specs
                .iter()
                .map(|s| SampleSpec { mask: None, ..*s })
                .collect();
            let before = device.copy_stats();
            let started = device
                .start_step(&decode_rows(&seqs, &early), &late)
                .expect("start a step");
            assert!(started, "{name}: the step was not started");
            let StepOutput::Sampled(late_got) = device.finish_step(&rows).expect("finish a step")
            else {
                panic!("{name}: expected sampled tokens");
            };
            let copies = device.copy_stats().since(&before);
            assert_eq!(
                (copies.steps, copies.h2d, copies.d2h),
                (1, 1 + u64::from(late.contains(&true)), 1),
                "{name}, late masks: {copies:?}"
            );
            assert_eq!(late_got, got, "{name}: late masks changed the draws");
            for (r, (l, g)) in want.iter().zip(&got).enumerate() {
                if let Some(mask) = specs[r].mask {
                    assert!(
                        is_allowed(mask, g.token),
                        "{name}: row {r} took {}",
                        g.token
                    );
                }
                let reference = sampling::sample(l.clone(), &specs[r]);
                moved += usize::from(*exact && reference.token as usize != best[r]);
                total += 1;
                if reference.token == g.token {
                    same += 1;
                }
                if *exact {
                    assert_eq!(reference.token, g.token, "{name}, row {r}, step {step}");
                }
                // Logprobs are those of the raw logits, whatever the mask and biases did.
                if let (Some(a), Some(b)) = (&reference.logprob, &g.logprob)
                    && reference.token == g.token
                {
                    assert!(
                        (a.logprob - b.logprob).abs() < 1e-3,
                        "{name}: logprob {} vs {}",
                        a.logprob,
                        b.logprob
                    );
                }
            }
        }
        let share = same as f64 / total as f64;
        println!("RESULT device sampler, {name}: {same}/{total} draws equal the reference");
        assert!(share >= 0.99, "{name}: only {same}/{total} draws agree");
    }
    println!("RESULT masks and biases moved {moved} greedy tokens off the unconstrained argmax");
    assert!(moved > 0, "no mask or bias changed a greedy token");
}
