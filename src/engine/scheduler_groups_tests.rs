//! The scheduler over a cache of two KV groups (full-attention and sliding layers): sliding
//! blocks given back as the window moves, reused by other sequences, counted at admission, and
//! the prefix cache.

use super::tests::{complete, limited, sequence};
use super::*;

/// A full-attention group and a sliding group of `window` tokens.
fn gpt_oss_like(window: usize) -> KvGroups {
    KvGroups {
        full: true,
        sliding_window: Some(window),
    }
}

#[test]
fn a_sequence_far_past_the_window_holds_a_bounded_number_of_sliding_blocks() {
    let groups = gpt_oss_like(32);
    let mut s = limited(4, 64).with_groups(groups);
    s.waiting.push_back(sequence(1, 40));
    for _ in 0..400 {
        let plan = s.schedule(usize::MAX);
        assert_eq!(plan.len(), 1);
        complete(&mut s, &plan);
        let seq = s.get(1).expect("running");
        let (full, sliding) = (seq.blocks.held(0), seq.blocks.held(1));
        assert_eq!(full, Sequence::blocks_for(seq.num_computed));
        assert!(
            sliding <= groups.sliding_reserve(),
            "{sliding} sliding blocks at {}",
            seq.num_computed
        );
        assert_eq!(s.blocks.num_held(), full + sliding);
    }
    // 439 positions: 28 blocks of the full group and 3 at most of the sliding one, where keeping
    // every block of both would take 56.
    let seq = s.get(1).expect("running");
    assert_eq!(seq.num_computed, 439);
    assert!(s.blocks.num_held() <= 28 + 3);
    assert_eq!(s.counters.preemptions, 0);
}

#[test]
fn blocks_the_window_left_are_reused_by_another_sequence() {
    // 12 blocks: sequence 1's 96-token prompt takes 6 logical blocks in each group, all of them.
    let mut s = limited(4, 12).with_groups(gpt_oss_like(16));
    s.waiting.push_back(sequence(1, 96));
    let plan = s.schedule(usize::MAX);
    assert_eq!(s.blocks.num_available(), 0);
    let sliding = s.get(1).expect("running").blocks.table(1).to_vec();
    complete(&mut s, &plan);
    // The next token (position 96) reads positions 81..=96: blocks 5 and 6. Blocks 0..5 of
    // the sliding group go back.
    let seq = s.get(1).expect("running");
    assert_eq!(seq.blocks.table(1)[..5], [FREED_BLOCK; 5]);
    assert_eq!(seq.blocks.table(1)[5], sliding[5]);
    assert_eq!(s.blocks.num_available(), 5);
    // Sequence 1 decodes into block 6 (two blocks) and sequence 2 is admitted on two more, all
    // of them blocks that sequence 1's sliding layers gave back.
    s.waiting.push_back(sequence(2, 16));
    let plan = s.schedule(usize::MAX);
    let rows: Vec<(u64, usize)> = plan.iter().map(|p| (p.seq_id, p.num_tokens)).collect();
    assert_eq!(rows, vec![(1, 1), (2, 16)]);
    let second = s.get(2).expect("admitted");
    for block in second.blocks.table(0).iter().chain(second.blocks.table(1)) {
        assert!(sliding[..5].contains(block), "block {block}");
    }
    assert_eq!(s.blocks.num_available(), 1);
    assert_eq!(s.counters.preemptions, 0);
}

#[test]
fn a_prefill_alone_computes_the_part_of_its_chunk_that_fits() {
    // 10 blocks and a window of 16: 128 tokens fit (8 blocks of the full group, 2 of the
    // sliding one), but a 120-token chunk at once would take 16.
    let groups = gpt_oss_like(16);
    let mut s = limited(4, 10).with_groups(groups);
    let shape = crate::engine::KvCacheShape {
        num_blocks: 10,
        block_size: BLOCK_SIZE,
        groups,
    };
    assert_eq!(shape.capacity_tokens(), 128);
    s.waiting.push_back(sequence(1, 120));
    let mut chunks = Vec::new();
    while s.get(1).is_none_or(|seq| seq.tokens.len() < 128) {
        let plan = s.schedule(usize::MAX);
        assert_eq!(plan.len(), 1, "the sequence runs every step");
        chunks.push(plan[0].num_tokens);
        complete(&mut s, &plan);
    }
    assert_eq!(chunks[..3], [80, 32, 8]);
    assert!(chunks[3..].iter().all(|&n| n == 1));
    assert_eq!(s.counters.preemptions, 0);
}

#[test]
fn a_cached_prefix_brings_the_sliding_blocks_its_window_reads() {
    let config = EngineConfig {
        max_num_seqs: Some(4),
        max_batched_tokens: 512,
        prefix_caching: true,
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(config, 64, [0; 32]).with_groups(gpt_oss_like(16));
    let run = |s: &mut Scheduler, id: u64| {
        let mut seq = sequence(1, 100);
        seq.id = id;
        s.waiting.push_back(seq);
        s.schedule(usize::MAX)
    };
    let plan = run(&mut s, 1);
    complete(&mut s, &plan);
    s.remove(1).expect("running");
    // The sliding blocks that the window left first are the oldest in the cache: evicted.
    let sliding_4 = group_hash(&prompt_hash(&s, 4), 1);
    evict(&mut s, &sliding_4);
    // The same prompt again: 6 full blocks are reusable (one token is always computed). The
    // token at position 96 reads 81..=96, so the sliding group needs its block 5 only, still
    // cached.
    let plan = run(&mut s, 2);
    assert_eq!(
        plan,
        vec![Scheduled {
            seq_id: 2,
            num_tokens: 4
        }]
    );
    let seq = s.get(2).expect("admitted");
    assert_eq!((seq.cached_tokens, seq.num_computed), (96, 96));
    assert_eq!(seq.blocks.table(1)[..5], [FREED_BLOCK; 5]);
    assert_eq!((seq.blocks.held(0), seq.blocks.held(1)), (7, 2));
    // Without the sliding block 5 no prefix has its window's blocks (each shorter one needs an
    // evicted block too): nothing is reused, though the full group's blocks are cached.
    s.remove(2).expect("running");
    let sliding_5 = group_hash(&prompt_hash(&s, 5), 1);
    evict(&mut s, &sliding_5);
    assert!(s.blocks.contains(&prompt_hash(&s, 5)));
    let plan = run(&mut s, 3);
    assert_eq!(plan[0].num_tokens, 100);
    assert_eq!(s.get(3).expect("admitted").cached_tokens, 0);
}

/// The content hash of block `b` of the 100-token prompt of `sequence(1, _)`.
fn prompt_hash(s: &Scheduler, b: usize) -> BlockHash {
    let mut seq = sequence(1, 100);
    extend_hashes(&s.model_key, false, &mut seq, b + 1);
    seq.block_hashes[b]
}

/// Takes blocks from the pool (free ones, then cached ones oldest first) until the block cached
/// under `hash` is evicted, then gives them back.
fn evict(s: &mut Scheduler, hash: &BlockHash) {
    let mut taken = Vec::new();
    while s.blocks.contains(hash) {
        taken.push(s.blocks.allocate().expect("a block to take"));
    }
    for block in taken {
        s.blocks.release(block);
    }
}
