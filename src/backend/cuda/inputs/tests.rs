use super::*;
use crate::engine::{SampleSpec, SamplingParams};

fn limits() -> StepLimits {
    StepLimits {
        max_tokens: 64,
        max_rows: 8,
        num_blocks: 10,
        kv_groups: KvGroups::default(),
        vocab: 100,
        max_words: 1024,
        tile_tokens: 2,
        small_tile_tokens: 0,
        min_big_tiles: 0,
    }
}

/// A decode of token 5 at position 17 (in the second block of its table), sampled by `spec`.
fn second_block_decode(spec: SampleSpec<'_>) -> BatchRow<'_> {
    BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 17,
        block_table: &[3, 7],
        sample: Some(spec),
    }
}

/// Sequence 2's first prefill chunk, three tokens in block 4, sampling nothing.
fn prefill_chunk() -> BatchRow<'static> {
    BatchRow {
        seq_id: 2,
        tokens: &[1, 2, 3],
        start_pos: 0,
        block_table: &[4],
        sample: None,
    }
}

/// A row's sampling request with `params`, seed 1, no history and `logprobs` alternatives.
fn plain_spec(params: &SamplingParams, logprobs: u32) -> SampleSpec<'_> {
    SampleSpec {
        params,
        seed: 1,
        draw_index: 0,
        prompt: &[],
        output: &[],
        logprobs: Some(logprobs),
        mask: None,
    }
}

/// With a small-tile kernel, the tiles of at most `small_tile_tokens` tokens (a chunk's
/// one-token tail) follow the others, each group in step order; a step with fewer full tiles
/// than `min_big_tiles`, or with a decode row, is cut into small tiles only.
#[test]
fn packs_small_tiles_last() {
    let second_chunk = BatchRow {
        seq_id: 3,
        tokens: &[6, 7],
        start_pos: 0,
        block_table: &[5],
        sample: None,
    };
    let rows = [prefill_chunk(), second_chunk];
    let limits = StepLimits {
        small_tile_tokens: 1,
        ..limits()
    };
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::None, &limits, &mut out).expect("packs");
    assert_eq!((layout.num_tiles, layout.num_small_tiles), (3, 1));
    assert_eq!(&out[layout.tiles()..], &[0, 2, 3, 2, 2, 1]);
    let without = pack_step(&rows, Padding::None, &self::limits(), &mut out).expect("packs");
    assert_eq!((without.num_tiles, without.num_small_tiles), (3, 0));
    assert_eq!(&out[without.tiles()..], &[0, 2, 2, 1, 3, 2]);
    // Two full tiles where three are wanted: every row in small tiles.
    let few = StepLimits {
        min_big_tiles: 3,
        ..limits
    };
    let layout = pack_step(&rows, Padding::None, &few, &mut out).expect("packs");
    assert_eq!((layout.num_tiles, layout.num_small_tiles), (5, 5));
    assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 1, 2, 1, 3, 1, 4, 1]);
    // Beside a decode row, too: the chunk's full tile goes to small tiles as well.
    let params = SamplingParams::default();
    let mixed = [second_block_decode(plain_spec(&params, 3)), prefill_chunk()];
    let layout = pack_step(&mixed, Padding::None, &limits, &mut out).expect("packs");
    assert_eq!((layout.num_tiles, layout.num_small_tiles), (4, 4));
    assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 1, 2, 1, 3, 1]);
    let without = pack_step(&mixed, Padding::None, &self::limits(), &mut out).expect("packs");
    assert_eq!((without.num_tiles, without.num_small_tiles), (3, 0));
}

#[test]
fn packs_a_mixed_batch() {
    let params = SamplingParams::default();
    let spec = plain_spec(&params, 3);
    let rows = [
        second_block_decode(spec),
        // A prefill chunk that needs no token yet.
        prefill_chunk(),
    ];
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::None, &limits(), &mut out).expect("packs");
    assert_eq!(
        (
            layout.num_tokens,
            layout.num_rows,
            layout.num_samples,
            layout.max_blocks
        ),
        (4, 2, 1, 2)
    );
    assert_eq!(out[layout.max_blocks_word()], 2);
    assert_eq!(layout.max_context, 18);
    assert_eq!(out.len(), layout.len());
    assert_eq!(&out[layout.tokens()..layout.tokens() + 4], &[5, 1, 2, 3]);
    assert_eq!(
        &out[layout.positions()..layout.positions() + 4],
        &[17, 0, 1, 2]
    );
    assert_eq!(
        &out[layout.slots(0)..layout.slots(0) + 4],
        &[7 * 16 + 1, 64, 65, 66]
    );
    assert_eq!(
        &out[layout.token_rows(0)..layout.token_rows(0) + 4],
        &[0, 1, 1, 1]
    );
    assert_eq!(
        &out[layout.block_tables()..layout.block_tables() + 4],
        &[3, 7, 4, 0]
    );
    assert_eq!(out[layout.sample_tokens()], 0);
    assert_eq!(out[layout.top_n()], 3);
    // Prefill tiles of at most 2 tokens per row: the decode token, then the 3-token chunk.
    assert_eq!(layout.num_tiles, 3);
    assert_eq!(&out[layout.tiles()..], &[0, 1, 1, 2, 3, 1]);
    assert_eq!(out.len(), layout.len());
}

#[test]
fn refuses_what_a_kernel_would_read_out_of_bounds() {
    let mut out = Vec::new();
    let short = [BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 16,
        block_table: &[3],
        sample: None,
    }];
    assert!(pack_step(&short, Padding::None, &limits(), &mut out).is_err());
    let far = [BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 0,
        block_table: &[10],
        sample: None,
    }];
    assert!(pack_step(&far, Padding::None, &limits(), &mut out).is_err());
    let bad_token = [BatchRow {
        seq_id: 1,
        tokens: &[100],
        start_pos: 0,
        block_table: &[1],
        sample: None,
    }];
    assert!(pack_step(&bad_token, Padding::None, &limits(), &mut out).is_err());
    let tokens = [0u32; 65];
    let table = [0u32; 5];
    let long = [BatchRow {
        seq_id: 1,
        tokens: &tokens,
        start_pos: 0,
        block_table: &table,
        sample: None,
    }];
    assert!(pack_step(&long, Padding::None, &limits(), &mut out).is_err());
}

#[test]
fn pads_a_decode_batch_to_its_bucket() {
    let params = SamplingParams::default();
    let spec = plain_spec(&params, 2);
    let rows = [
        second_block_decode(spec),
        BatchRow {
            seq_id: 2,
            tokens: &[9],
            start_pos: 4,
            block_table: &[2],
            sample: Some(spec),
        },
    ];
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::DecodeRows(2), &limits(), &mut out).expect("packs");
    assert_eq!(
        (
            layout.num_tokens,
            layout.num_rows,
            layout.num_samples,
            layout.real_samples()
        ),
        (4, 2, 4, 2)
    );
    // The offsets of a padded step depend on the bucket alone, not on the table lengths.
    let mut other = Vec::new();
    let short_rows = [
        BatchRow {
            block_table: &[3],
            start_pos: 3,
            ..rows[0]
        },
        rows[1],
    ];
    let short =
        pack_step(&short_rows, Padding::DecodeRows(2), &limits(), &mut other).expect("packs");
    assert_eq!(short.sample_tokens(), layout.sample_tokens());
    assert_eq!(short.top_n(), layout.top_n());
    assert_eq!(short.block_tables(), layout.block_tables());
    assert_eq!((other[0], out[0]), (1, 2));
    assert_eq!(&out[layout.tokens()..layout.tokens() + 4], &[5, 9, 0, 0]);
    assert_eq!(
        &out[layout.slots(0)..layout.slots(0) + 4],
        &[7 * 16 + 1, 2 * 16 + 4, -1, -1]
    );
    assert_eq!(
        &out[layout.token_rows(0)..layout.token_rows(0) + 4],
        &[0, 1, -1, -1]
    );
    assert_eq!(
        &out[layout.sample_tokens()..layout.sample_tokens() + 4],
        &[0, 1, 2, 3]
    );
    assert_eq!(&out[layout.top_n()..layout.top_n() + 4], &[2, 2, 0, 0]);
    assert_eq!(&out[layout.block_tables()..], &[3, 7, 2, 0]);
    // Padding past the row limit is refused.
    assert!(pack_step(&rows, Padding::DecodeRows(7), &limits(), &mut out).is_err());
}

#[test]
fn pads_a_mixed_step_with_unsampled_tokens() {
    let params = SamplingParams::default();
    let spec = plain_spec(&params, 1);
    let rows = [second_block_decode(spec), prefill_chunk()];
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::Tokens(4), &limits(), &mut out).expect("packs");
    assert_eq!(
        (
            layout.num_tokens,
            layout.num_rows,
            layout.num_samples,
            layout.real_samples(),
            layout.token_padding
        ),
        (8, 2, 1, 1, 4)
    );
    assert_eq!(
        &out[layout.tokens()..layout.tokens() + 8],
        &[5, 1, 2, 3, 0, 0, 0, 0]
    );
    assert_eq!(
        &out[layout.slots(0)..layout.slots(0) + 8],
        &[7 * 16 + 1, 4 * 16, 4 * 16 + 1, 4 * 16 + 2, -1, -1, -1, -1]
    );
    assert_eq!(
        &out[layout.token_rows(0)..layout.token_rows(0) + 8],
        &[0, 1, 1, 1, -1, -1, -1, -1]
    );
    // Only the decode row is sampled; the padding is in no prefill tile.
    assert_eq!(&out[layout.sample_tokens()..layout.top_n()], &[0]);
    let tiles = &out[layout.tiles()..layout.late_mask_slots()];
    assert_eq!(tiles, &[0, 1, 1, 2, 3, 1]);
    // The token-indexed arrays sit where any step of 8 tokens has them.
    let decode = [second_block_decode(spec)];
    let other = pack_step(&decode, Padding::Tokens(7), &limits(), &mut Vec::new()).expect("packs");
    assert_eq!(
        (other.positions(), other.slots(0), other.sample_tokens()),
        (layout.positions(), layout.slots(0), layout.sample_tokens())
    );
    // Padding past the token limit is refused.
    assert!(pack_step(&rows, Padding::Tokens(61), &limits(), &mut out).is_err());
}

#[test]
fn packs_sampling_parameters_and_penalty_lists() {
    let params = SamplingParams {
        temperature: 0.5,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.3,
        frequency_penalty: 0.25,
        presence_penalty: 0.5,
        seed: None,
        logit_bias: Vec::new(),
    };
    let spec = SampleSpec {
        params: &params,
        seed: 0x1234_5678_9abc_def0,
        draw_index: 7,
        prompt: &[1, 2],
        output: &[2, 2, 3],
        logprobs: None,
        mask: None,
    };
    let plain = SamplingParams::default();
    let rows = [
        BatchRow {
            seq_id: 1,
            tokens: &[3],
            start_pos: 4,
            block_table: &[1],
            sample: Some(SampleSpec {
                params: &plain,
                ..spec
            }),
        },
        BatchRow {
            seq_id: 2,
            tokens: &[3],
            start_pos: 5,
            block_table: &[2],
            sample: Some(spec),
        },
    ];
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::DecodeRows(1), &limits(), &mut out).expect("packs");
    let words = |s: usize| {
        let at = layout.sample_params() + s * SAMPLE_PARAMS;
        out[at..at + SAMPLE_PARAMS].to_vec()
    };
    let f = |x: f32| x.to_bits() as i32;
    // No penalties: an empty list.
    assert_eq!(words(0)[12], 0);
    let w = words(1);
    assert_eq!(
        &w[..11],
        &[
            f(0.5),
            40,
            f(0.9),
            f(0.05),
            f(0.5),
            f(0.25),
            f(1.3),
            0x9abc_def0_u32 as i32,
            0x1234_5678,
            7,
            0
        ]
    );
    // Distinct (token, times generated) pairs over prompt and output.
    let list = &out[layout.lists() + w[11] as usize..][..2 * w[12] as usize];
    let mut pairs: Vec<(i32, i32)> = list.chunks_exact(2).map(|p| (p[0], p[1])).collect();
    pairs.sort_unstable();
    assert_eq!(pairs, vec![(1, 0), (2, 2), (3, 1)]);
    assert_eq!(layout.len(), out.len());
    // The padding row is greedy with no penalties.
    assert_eq!(words(2), padding_params().to_vec());
    // A penalised token outside the vocabulary is refused.
    let bad = [BatchRow {
        sample: Some(SampleSpec {
            output: &[100],
            ..spec
        }),
        ..rows[1]
    }];
    assert!(pack_step(&bad, Padding::None, &limits(), &mut out).is_err());
}

#[test]
fn packs_biases_and_grammar_masks_into_the_lists() {
    // vocab 100: masks of 4 words (tokens 96..99 in the last word's low bits).
    let biased = SamplingParams {
        temperature: 0.7,
        logit_bias: vec![(3, 100.0), (70, -2.5)],
        ..Default::default()
    };
    let plain = SamplingParams::default();
    // A grammar's mask may be shorter than the vocabulary (the rest is disallowed) or longer
    // (bits past the vocabulary are dropped).
    let short_mask = [1u32 << 5, 0x8000_0001];
    let long_mask = [0u32, 0, 0, 1 << 3, 0xffff_ffff];
    let spec = |params, mask| SampleSpec {
        mask,
        ..plain_spec(params, 0)
    };
    let rows = [
        BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 4,
            block_table: &[1],
            sample: Some(spec(&biased, Some(&short_mask))),
        },
        BatchRow {
            seq_id: 2,
            tokens: &[6],
            start_pos: 4,
            block_table: &[2],
            sample: Some(spec(&plain, None)),
        },
        BatchRow {
            seq_id: 3,
            tokens: &[7],
            start_pos: 4,
            block_table: &[3],
            sample: Some(spec(&plain, Some(&long_mask))),
        },
    ];
    let mut out = Vec::new();
    let layout = pack_step(&rows, Padding::DecodeRows(1), &limits(), &mut out).expect("packs");
    let words = |s: usize| {
        let at = layout.sample_params() + s * SAMPLE_PARAMS;
        out[at..at + SAMPLE_PARAMS].to_vec()
    };
    let lists = &out[layout.lists()..layout.tiles()];
    // Row 0: two (token, bias bits) pairs, then its mask widened to 4 words.
    let w = words(0);
    assert_eq!((w[13], w[14]), (0, 2));
    assert_eq!(
        &lists[w[13] as usize..][..4],
        &[3, 100.0f32.to_bits() as i32, 70, (-2.5f32).to_bits() as i32]
    );
    let mask = &lists[w[15] as usize..][..4];
    assert_eq!(mask, &[1 << 5, 0x8000_0001_u32 as i32, 0, 0]);
    // Bit t % 32 of word t / 32 is token t: 5, 32 and 63 allowed here.
    let allowed: Vec<usize> = (0..100)
        .filter(|t| (mask[t / 32] as u32 >> (t % 32)) & 1 == 1)
        .collect();
    assert_eq!(allowed, vec![5, 32, 63]);
    // Row 1: no biases, no mask.
    assert_eq!((words(1)[14], words(1)[15]), (0, -1));
    // Row 2: the long mask cut to the vocabulary's 4 words.
    let w = words(2);
    assert_eq!(w[14], 0);
    assert_eq!(&lists[w[15] as usize..][..4], &[0, 0, 0, 1 << 3]);
    // The lists hold exactly the biases and the two masks; the padding row has no mask.
    assert_eq!(layout.list_words, 4 + 2 * mask_words(100));
    assert_eq!(words(3)[15], -1);
    assert_eq!(layout.len(), out.len());
}

#[test]
fn late_masks_take_slots_after_everything_the_first_copy_holds() {
    // vocab 100: masks of 4 words.
    let biased = SamplingParams {
        logit_bias: vec![(3, 100.0)],
        ..Default::default()
    };
    let plain = SamplingParams::default();
    static READY_MASK: [u32; 1] = [1 << 9];
    static LATE_MASK: [u32; 2] = [1 << 5, 0x8000_0001];
    let spec = |params, mask| SampleSpec {
        mask,
        ..plain_spec(params, 0)
    };
    let rows = |first: Option<&'static [u32]>| {
        [
            BatchRow {
                seq_id: 1,
                tokens: &[5],
                start_pos: 4,
                block_table: &[1],
                sample: Some(spec(&biased, first)),
            },
            // A prefill chunk: the step has tiles, which the late slots follow.
            prefill_chunk(),
            BatchRow {
                seq_id: 3,
                tokens: &[6],
                start_pos: 4,
                block_table: &[2],
                sample: Some(spec(&plain, Some(&READY_MASK))),
            },
            BatchRow {
                seq_id: 4,
                tokens: &[7],
                start_pos: 4,
                block_table: &[3],
                sample: Some(spec(&plain, None)),
            },
        ]
    };
    let late = [true, false, true];
    let mut out = Vec::new();
    let layout = pack_step_with_late_masks(&rows(None), &late, Padding::None, &limits(), &mut out)
        .expect("packs");
    assert_eq!((layout.late_masks, layout.mask_words), (2, 4));
    assert!(layout.num_tiles > 0);
    assert_eq!(
        layout.late_mask_slots(),
        layout.tiles() + 2 * layout.num_tiles
    );
    assert_eq!(layout.len(), layout.late_mask_slots() + 2 * 4);
    assert_eq!(out.len(), layout.len());
    // The lists hold row 0's bias and row 2's ready mask only; the late rows point at their
    // slots (offsets count from the lists' start), zeros until they are filled.
    assert_eq!(layout.list_words, 2 + 4);
    let mask_at = |s: usize| out[layout.sample_params() + s * SAMPLE_PARAMS + 15] as usize;
    let slots = layout.late_mask_slots() - layout.lists();
    assert_eq!((mask_at(0), mask_at(2)), (slots, slots + 4));
    assert_eq!(&out[layout.lists() + mask_at(1)..][..4], &[1 << 9, 0, 0, 0]);
    assert!(out[layout.late_mask_slots()..].iter().all(|&w| w == 0));
    // Finishing: row 0's mask arrived; row 3's grammar failed (no mask: every token allowed).
    let first_copy = out[..layout.late_mask_slots()].to_vec();
    let range = fill_late_masks(&rows(Some(&LATE_MASK)), &late, &layout, &mut out).expect("fills");
    assert_eq!(range, layout.late_mask_slots()..layout.len());
    assert_eq!(
        &out[range.clone()][..4],
        &[1 << 5, 0x8000_0001_u32 as i32, 0, 0]
    );
    assert_eq!(&out[range][4..], &[-1; 4]);
    assert_eq!(&out[..layout.late_mask_slots()], &first_copy[..]);
    // A late row must not bring its mask up front, the flags must match the sampled rows,
    // and the step must be finished with the rows it was started with.
    let mut scratch = Vec::new();
    let early = rows(Some(&LATE_MASK));
    assert!(
        pack_step_with_late_masks(&early, &late, Padding::None, &limits(), &mut scratch).is_err()
    );
    assert!(
        pack_step_with_late_masks(
            &rows(None),
            &late[..2],
            Padding::None,
            &limits(),
            &mut scratch
        )
        .is_err()
    );
    assert!(fill_late_masks(&rows(None)[..2], &late, &layout, &mut out).is_err());
    // Without late rows the layout is pack_step's.
    let mut plain_out = Vec::new();
    let plain_layout =
        pack_step(&rows(None), Padding::None, &limits(), &mut plain_out).expect("packs");
    assert_eq!(plain_layout.late_masks, 0);
    assert_eq!(plain_layout.len(), plain_layout.late_mask_slots());
}

#[test]
fn refuses_biases_a_kernel_could_not_apply() {
    let mut out = Vec::new();
    let row = |params| BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 0,
        block_table: &[1],
        sample: Some(plain_spec(params, 0)),
    };
    let outside = SamplingParams {
        logit_bias: vec![(100, 1.0)],
        ..Default::default()
    };
    let repeated = SamplingParams {
        logit_bias: vec![(4, 1.0), (4, 2.0)],
        ..Default::default()
    };
    let unsorted = SamplingParams {
        logit_bias: vec![(9, 1.0), (4, 2.0)],
        ..Default::default()
    };
    let too_many = SamplingParams {
        logit_bias: (0..=MAX_LOGIT_BIAS_TOKENS as u32)
            .map(|t| (t, 1.0))
            .collect(),
        ..Default::default()
    };
    let big = StepLimits {
        vocab: 10_000,
        max_words: 1 << 20,
        ..limits()
    };
    for (params, limits) in [
        (&outside, limits()),
        (&repeated, limits()),
        (&unsorted, limits()),
        (&too_many, big),
    ] {
        assert!(pack_step(&[row(params)], Padding::None, &limits, &mut out).is_err());
    }
    // At the limit it packs, and the buffer sized by max_words holds every row at the limit
    // with a mask.
    let full = SamplingParams {
        logit_bias: (0..MAX_LOGIT_BIAS_TOKENS as u32)
            .map(|t| (t, 1.0))
            .collect(),
        ..Default::default()
    };
    let mask = vec![u32::MAX; mask_words(big.vocab)];
    let spec = SampleSpec {
        mask: Some(&mask),
        ..plain_spec(&full, 0)
    };
    let rows: Vec<BatchRow<'_>> = (0..big.max_rows)
        .map(|r| BatchRow {
            seq_id: r as u64,
            tokens: &[5],
            start_pos: 0,
            block_table: &[1],
            sample: Some(spec),
        })
        .collect();
    let sized = StepLimits {
        max_words: max_words(big.max_tokens, big.max_rows, (1, 1), 0, big.vocab),
        ..big
    };
    let layout = pack_step(&rows, Padding::None, &sized, &mut out).expect("fits max_words");
    assert!(layout.len() <= sized.max_words);
    assert_eq!(
        layout.list_words,
        big.max_rows * (2 * MAX_LOGIT_BIAS_TOKENS + mask_words(big.vocab))
    );
}

#[test]
fn copy_stats_count_per_interval() {
    let mut stats = CopyStats::default();
    stats.record_h2d(100);
    let mark = stats;
    stats.steps += 1;
    stats.record_h2d(40);
    stats.record_d2h(8);
    let delta = stats.since(&mark);
    assert_eq!(
        (
            delta.steps,
            delta.h2d,
            delta.d2h,
            delta.h2d_bytes,
            delta.d2h_bytes
        ),
        (1, 1, 1, 40, 8)
    );
}

/// Sampled positions (a verification row's last token and proposals, each with its own spec)
/// become sampled rows of their own: their token indices, draw indices and penalty lists; a
/// row's `sample` is ignored and a position count beyond its tokens is refused.
#[test]
fn packs_several_sampled_positions_of_a_row() {
    let penalised = SamplingParams {
        frequency_penalty: 0.5,
        ..SamplingParams::default()
    };
    let verify = BatchRow {
        seq_id: 4,
        tokens: &[9, 8, 7],
        start_pos: 20,
        block_table: &[1, 2],
        sample: None,
    };
    let outputs: [&[u32]; 3] = [&[], &[8], &[8, 7]];
    let specs: Vec<SampleSpec<'_>> = outputs
        .iter()
        .enumerate()
        .map(|(j, output)| SampleSpec {
            output,
            draw_index: 5 + j as u64,
            ..plain_spec(&penalised, 0)
        })
        .collect();
    let decode_spec = [plain_spec(&penalised, 2)];
    let rows = [prefill_chunk(), verify, second_block_decode(decode_spec[0])];
    let per_row: [&[SampleSpec<'_>]; 3] = [&[], &specs, &decode_spec];
    let mut out = Vec::new();
    let layout =
        pack_positions(&rows, &per_row, Padding::None, &limits(), &mut out).expect("packs");
    assert_eq!((layout.num_tokens, layout.num_samples), (7, 4));
    assert_eq!(&out[layout.sample_tokens()..][..4], &[3, 4, 5, 6]);
    assert_eq!(&out[layout.top_n()..][..4], &[0, 0, 0, 2]);
    let draw = |s: usize| out[layout.sample_params() + s * SAMPLE_PARAMS + 9];
    assert_eq!([draw(0), draw(1), draw(2), draw(3)], [5, 6, 7, 0]);
    // Penalty list lengths: the outputs each position sees (one pair per distinct token).
    let penalties = |s: usize| out[layout.sample_params() + s * SAMPLE_PARAMS + 12];
    assert_eq!([penalties(0), penalties(1), penalties(2)], [0, 1, 2]);
    let too_many: [&[SampleSpec<'_>]; 3] = [&[], &[], &specs[..2]];
    assert!(pack_positions(&rows, &too_many, Padding::None, &limits(), &mut out).is_err());
}

/// With two KV groups (full and sliding layers), each row carries a table per group: the slots
/// and rows of each group follow each other, group 1's rows index its tables after group 0's, and
/// the entries a sliding window gave back are written as 0. One group packs as before.
#[test]
fn packs_a_table_per_kv_group() {
    let two = StepLimits {
        kv_groups: KvGroups {
            full: true,
            sliding_window: Some(8),
        },
        ..limits()
    };
    let params = SamplingParams::default();
    // Position 40 with a window of 8 reads 33..=40: blocks 2 on of the sliding table (5, 6, 9).
    let decode = BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 40,
        block_table: &[0, 1, 2, FREED_BLOCK, FREED_BLOCK, 9],
        sample: Some(plain_spec(&params, 0)),
    };
    let chunk = BatchRow {
        seq_id: 2,
        tokens: &[1, 2],
        start_pos: 0,
        block_table: &[4, 8],
        sample: None,
    };
    let mut out = Vec::new();
    let layout =
        pack_step(&[decode, chunk], Padding::DecodeRows(1), &two, &mut out).expect("packs");
    assert_eq!(
        (layout.kv_groups, layout.max_blocks, layout.num_tokens),
        (2, 3, 4)
    );
    assert_eq!(layout.slots(1), layout.slots(0) + 4);
    assert_eq!(layout.token_rows(0), layout.slots(0) + 8);
    assert_eq!(layout.sample_tokens(), layout.token_rows(0) + 8);
    let words = |at: usize, n: usize| out[at..at + n].to_vec();
    assert_eq!(words(layout.slots(0), 4), [2 * 16 + 8, 64, 65, -1]);
    assert_eq!(
        words(layout.slots(1), 4),
        [9 * 16 + 8, 8 * 16, 8 * 16 + 1, -1]
    );
    assert_eq!(words(layout.token_rows(0), 4), [0, 1, 1, -1]);
    assert_eq!(words(layout.token_rows(1), 4), [2, 3, 3, -1]);
    // Rows (group, row) of 3 entries: (0, 0), (0, 1), (1, 0), (1, 1).
    assert_eq!(
        words(layout.block_tables(), 12),
        [0, 1, 2, 4, 0, 0, 0, 0, 9, 8, 0, 0]
    );
    assert_eq!(layout.lists(), layout.block_tables() + 12);
    // A given-back block where the window still reads is refused, and so is a table that is not
    // one per group.
    let short = BatchRow {
        seq_id: 1,
        tokens: &[5],
        start_pos: 40,
        block_table: &[0, 1, 2, FREED_BLOCK, 4, FREED_BLOCK],
        sample: None,
    };
    let lopsided = BatchRow {
        block_table: &[0, 1, 2, 9, 9],
        ..short
    };
    let given_back = pack_step(&[short], Padding::None, &two, &mut out).unwrap_err();
    assert!(
        given_back
            .to_string()
            .contains("was given back, but the window reads it"),
        "{given_back}"
    );
    assert!(pack_step(&[lopsided], Padding::None, &two, &mut out).is_err());
    // The same rows with one group (their first tables): the layout of before.
    let one = [
        BatchRow {
            block_table: &[0, 1, 2],
            ..decode
        },
        BatchRow {
            block_table: &[4],
            ..chunk
        },
    ];
    let layout = pack_step(&one, Padding::None, &limits(), &mut out).expect("packs");
    assert_eq!(layout.kv_groups, 1);
    assert_eq!(
        (
            layout.slots(0),
            layout.token_rows(0),
            layout.sample_tokens()
        ),
        (1 + 2 * 3, 1 + 3 * 3, 1 + 4 * 3)
    );
}

/// A decode graph is captured on a step of padding alone and replayed on real rows: with two KV
/// groups, every group's slots and rows and the block tables sit at the same offsets in both, the
/// padding's are -1 in every group, and the replayed step's tables fit the buffer `max_words`
/// sizes for two tables per row.
#[test]
fn a_decode_graph_finds_both_kv_groups_where_it_was_captured() {
    let two = StepLimits {
        kv_groups: KvGroups {
            full: true,
            sliding_window: Some(8),
        },
        max_words: max_words(64, 8, (2, 4), 0, 100),
        ..limits()
    };
    let mut out = Vec::new();
    let captured = pack_step(&[], Padding::DecodeRows(4), &two, &mut out).expect("packs");
    for g in 0..2 {
        assert_eq!(&out[captured.slots(g)..captured.slots(g) + 4], &[-1; 4]);
        assert_eq!(
            &out[captured.token_rows(g)..captured.token_rows(g) + 4],
            &[-1; 4]
        );
    }
    let params = SamplingParams::default();
    // Position 40 reads 33..=40 in the sliding group (blocks 2 on); position 17 reads 10..=17.
    let rows = [
        BatchRow {
            seq_id: 1,
            tokens: &[5],
            start_pos: 40,
            block_table: &[0, 1, 2, FREED_BLOCK, FREED_BLOCK, 9],
            sample: Some(plain_spec(&params, 0)),
        },
        BatchRow {
            seq_id: 2,
            tokens: &[9],
            start_pos: 17,
            block_table: &[3, 7, 5, 6],
            sample: Some(plain_spec(&params, 0)),
        },
    ];
    let replayed = pack_step(&rows, Padding::DecodeRows(2), &two, &mut out).expect("packs");
    let offsets = |l: &StepLayout| {
        [
            l.positions(),
            l.slots(0),
            l.slots(1),
            l.token_rows(0),
            l.token_rows(1),
            l.sample_tokens(),
            l.block_tables(),
        ]
    };
    assert_eq!(offsets(&replayed), offsets(&captured));
    assert_eq!(
        &out[replayed.slots(0)..replayed.slots(0) + 4],
        &[2 * 16 + 8, 7 * 16 + 1, -1, -1]
    );
    assert_eq!(
        &out[replayed.slots(1)..replayed.slots(1) + 4],
        &[9 * 16 + 8, 6 * 16 + 1, -1, -1]
    );
    assert_eq!(
        &out[replayed.token_rows(1)..replayed.token_rows(1) + 4],
        &[2, 3, -1, -1]
    );
    // Rows (group, row) of 3 entries; the given-back entries are 0.
    assert_eq!(
        &out[replayed.block_tables()..replayed.lists()],
        &[0, 1, 2, 3, 7, 0, 0, 0, 9, 5, 6, 0]
    );
    assert!(replayed.len() <= two.max_words);
}
