//! Continuous-batching scheduler: which sequences run in the next step, and how many tokens each.
//!
//! Each step has a token budget (the engine sizes it from measured step costs, see
//! `step_cost.rs`). Running sequences come first, in admission order: every decode takes its one
//! token, an unfinished prefill takes the next chunk that fits in the rest. Waiting sequences are then
//! admitted first-come first-served while the budget, the sequence limit and free KV blocks allow,
//! with their prompt's cached prefix taken from the prefix cache. When a running sequence needs a
//! block and none is free, the most recently admitted sequence is preempted: its blocks are freed
//! and it goes back to the front of the queue, to be recomputed later. Nothing is dropped for lack
//! of memory: a request that fits the whole cache on its own always runs eventually.
//!
//! With a sliding-window group of layers (`kv_groups.rs`), every logical block costs one block
//! per group, and the sliding group's blocks that its window left go back to the pool after each
//! step, so a sequence holds its whole context in the full-attention group only. A prefill that
//! cannot get its chunk's blocks once every later sequence is preempted computes the part of the
//! chunk that fits (its window's blocks come back after each part), so a sequence within
//! [`super::KvCacheShape::capacity_tokens`] still always runs.
//!
//! A plan names each row by its sequence's id ([`Sequence::id`]), never by a position in the
//! running list, and the engine reaches running sequences through accessors keyed by that id, so
//! removing a sequence cannot change what the other rows of a plan refer to.

use std::collections::{HashMap, VecDeque};

use ring::digest::{Context, SHA256};

use super::block_manager::{BlockHash, BlockManager};
use super::config::{BLOCK_SIZE, EngineConfig};
use super::kv_groups::{FREED_BLOCK, KvGroups};
use super::sequence::Sequence;
use super::step_cost::DecodeLoad;

/// One sequence's share of the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// The running sequence's id ([`Sequence::id`]).
    pub seq_id: u64,
    /// Tokens to compute, starting at the sequence's `num_computed`.
    pub num_tokens: usize,
}

/// Counters the scheduler keeps since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Tokens found there.
    pub prefix_hits: u64,
    /// Preemptions.
    pub preemptions: u64,
}

/// Queues, KV blocks and the prefix cache.
#[derive(Debug)]
pub struct Scheduler {
    config: EngineConfig,
    /// The sequence limit in force (`config.max_num_seqs`, or the one derived from the blocks).
    max_num_seqs: usize,
    /// The physical KV blocks.
    pub blocks: BlockManager,
    /// The groups of layers that share a block table.
    groups: KvGroups,
    /// Sequences waiting for admission, in order.
    pub waiting: VecDeque<Sequence>,
    /// Admitted sequences, in admission order.
    running: Vec<Sequence>,
    /// Position in `running` of each admitted sequence, by id.
    positions: HashMap<u64, usize>,
    /// Identity of the model in the prefix hash chain.
    model_key: [u8; 32],
    /// Counters since start.
    pub counters: SchedulerCounters,
}

impl Scheduler {
    /// A scheduler over `num_blocks` KV blocks for the model identified by `model_key`.
    pub fn new(config: EngineConfig, num_blocks: usize, model_key: [u8; 32]) -> Self {
        Self {
            max_num_seqs: config.max_num_seqs_for(num_blocks),
            config,
            blocks: BlockManager::new(num_blocks),
            groups: KvGroups::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            positions: HashMap::new(),
            model_key,
            counters: SchedulerCounters::default(),
        }
    }

    /// The same scheduler for a cache of these KV groups (one full-attention group by default).
    pub fn with_groups(mut self, groups: KvGroups) -> Self {
        self.groups = groups;
        self
    }

    /// Whether there is nothing to run.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// The admitted sequences, in admission order.
    pub fn running(&self) -> impl Iterator<Item = &Sequence> {
        self.running.iter()
    }

    /// The admitted sequences, in admission order, for changes that keep their ids.
    pub fn running_mut(&mut self) -> impl Iterator<Item = &mut Sequence> {
        self.running.iter_mut()
    }

    /// How many sequences are admitted.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The running sequence with id `seq_id`.
    pub fn get(&self, seq_id: u64) -> Option<&Sequence> {
        let position = *self.positions.get(&seq_id)?;
        Some(&self.running[position])
    }

    /// The running sequence with id `seq_id`, for changes that keep its id.
    pub fn get_mut(&mut self, seq_id: u64) -> Option<&mut Sequence> {
        let position = *self.positions.get(&seq_id)?;
        Some(&mut self.running[position])
    }

    /// The sequence with id `seq_id`, running or waiting (a preempted one waits), for changes
    /// that keep its id.
    pub fn find_mut(&mut self, seq_id: u64) -> Option<&mut Sequence> {
        match self.positions.get(&seq_id) {
            Some(&position) => Some(&mut self.running[position]),
            None => self.waiting.iter_mut().find(|s| s.id == seq_id),
        }
    }

    /// Running sequences whose next step is a decode (one token).
    pub fn decoding_rows(&self) -> usize {
        self.running
            .iter()
            .filter(|s| s.decode_context().is_some())
            .count()
    }

    /// The decode part of the next step: the running sequences that decode one token, the
    /// context they attend to, and the rows the batch would hold with the waiting requests
    /// admitted (within the sequence limit).
    pub fn decode_load(&self) -> DecodeLoad {
        let (rows, kv_tokens) = self
            .running
            .iter()
            .filter_map(Sequence::decode_context)
            .fold((0, 0), |(rows, kv), context| (rows + 1, kv + context));
        let wanted = (self.running.len() + self.waiting.len()).min(self.max_num_seqs);
        DecodeLoad {
            rows,
            kv_tokens,
            target_rows: wanted.max(rows),
        }
    }

    /// What `plan` computes: its decode part (rows and the context they attend to; the target
    /// rows left at zero) and its prompt tokens.
    pub fn plan_load(&self, plan: &[Scheduled]) -> (DecodeLoad, usize) {
        let mut decode = DecodeLoad::default();
        let mut prefill_tokens = 0;
        for scheduled in plan {
            let Some(seq) = self.get(scheduled.seq_id) else {
                continue;
            };
            match seq.decode_context() {
                Some(context) => {
                    decode.rows += 1;
                    decode.kv_tokens += context;
                    // Verified proposals cost what prompt tokens of a mixed step cost.
                    prefill_tokens += scheduled.num_tokens - 1;
                }
                None => prefill_tokens += scheduled.num_tokens,
            }
        }
        (decode, prefill_tokens)
    }

    /// Plans the next step within `token_budget` tokens (and `max_batched_tokens`). Every running
    /// decode gets its token first; unfinished prefills, then admissions, share what is left.
    pub fn schedule(&mut self, token_budget: usize) -> Vec<Scheduled> {
        let budget = token_budget.min(self.config.max_batched_tokens);
        let mut prefill_budget = budget.saturating_sub(self.decoding_rows());
        let mut decode_budget = budget - prefill_budget;
        // Proposals to verify take at most half of the prompt share while prompts wait or are
        // being computed, so that speculation cannot hold their admission back.
        let prompts_pending =
            !self.waiting.is_empty() || self.running.iter().any(|s| s.pending() > 1);
        let mut draft_budget = if prompts_pending {
            prefill_budget / 2
        } else {
            prefill_budget
        };
        let mut plan = Vec::new();
        let mut preempted = false;
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            let decoding = seq.pending() == 1;
            // A decode row verifies its proposals too, as far as the prefill budget allows.
            let proposed = if decoding && decode_budget > 0 {
                seq.draft.len().min(prefill_budget).min(draft_budget)
            } else {
                0
            };
            let mut num_tokens = if decoding {
                seq.pending().min(decode_budget) + proposed
            } else {
                seq.pending().min(prefill_budget)
            };
            if num_tokens == 0 {
                index += 1;
                continue;
            }
            let mut needed = self.blocks_needed(seq, num_tokens);
            while self.blocks.num_available() < needed && self.running.len() - 1 > index {
                self.preempt_last();
                preempted = true;
            }
            if self.blocks.num_available() < needed {
                let fit = if decoding {
                    0
                } else {
                    self.tokens_that_fit(&self.running[index], num_tokens)
                };
                if fit == 0 {
                    // Only this sequence is left to give up its blocks.
                    self.preempt_last();
                    preempted = true;
                    break;
                }
                num_tokens = fit;
                needed = self.blocks_needed(&self.running[index], num_tokens);
            }
            self.grow(index, needed / self.groups.count());
            let seq = &mut self.running[index];
            seq.draft.truncate(proposed);
            if proposed > 0 {
                seq.verify.clear();
                seq.verify.push(seq.tokens[seq.num_computed]);
                seq.verify.extend_from_slice(&seq.draft);
            }
            plan.push(Scheduled {
                seq_id: seq.id,
                num_tokens,
            });
            if decoding {
                decode_budget -= num_tokens - proposed;
                prefill_budget -= proposed;
                draft_budget -= proposed;
            } else {
                prefill_budget -= num_tokens;
            }
            index += 1;
        }
        if !preempted {
            self.admit(&mut plan, prefill_budget);
        }
        plan
    }

    /// Admits waiting sequences while budget, sequence limit and blocks allow.
    fn admit(&mut self, plan: &mut Vec<Scheduled>, mut budget: usize) {
        while budget > 0 && self.running.len() < self.max_num_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            // Prompt logprobs need every prompt position computed.
            if seq.blocks.is_empty()
                && self.config.prefix_caching
                && seq.request.prompt_logprobs.is_none()
            {
                self.take_cached_prefix(&mut seq);
            }
            let mut num_tokens = seq.pending().min(budget);
            let mut needed = self.blocks_needed(&seq, num_tokens);
            if self.blocks.num_available() < needed {
                let fit = if self.running.is_empty() {
                    self.tokens_that_fit(&seq, num_tokens)
                } else {
                    0
                };
                if fit == 0 {
                    self.free_blocks(&mut seq);
                    self.waiting.push_front(seq);
                    break;
                }
                num_tokens = fit;
                needed = self.blocks_needed(&seq, num_tokens);
            }
            seq.admitted_before = true;
            seq.first_scheduled
                .get_or_insert_with(std::time::Instant::now);
            let seq_id = seq.id;
            let index = self.running.len();
            self.positions.insert(seq_id, index);
            self.running.push(seq);
            self.grow(index, needed / self.groups.count());
            plan.push(Scheduled { seq_id, num_tokens });
            budget -= num_tokens;
        }
    }

    /// Blocks a row of `num_tokens` tokens of `seq` takes from the pool: one per group for each
    /// logical block it adds.
    fn blocks_needed(&self, seq: &Sequence, num_tokens: usize) -> usize {
        Sequence::blocks_for(seq.num_computed + num_tokens).saturating_sub(seq.blocks.len())
            * self.groups.count()
    }

    /// With a sliding group, the most of `num_tokens` prefill tokens of `seq` whose blocks are
    /// available now (0 when none are, or without a sliding group: a prefill of a cache of
    /// full-attention layers only waits for its whole chunk, as the cache holds it).
    fn tokens_that_fit(&self, seq: &Sequence, num_tokens: usize) -> usize {
        if self.groups.sliding_window.is_none() {
            return 0;
        }
        let logical = self.blocks.num_available() / self.groups.count();
        let end = (seq.blocks.len() + logical) * BLOCK_SIZE;
        num_tokens.min(end.saturating_sub(seq.num_computed))
    }

    /// Reuses cached full blocks of the sequence's prefix: in every full-attention group all the
    /// prefix's blocks, in a sliding group those that the window of the first token to compute
    /// reads (the prefix is shortened until every group has them). At least one token is always
    /// left to compute, so the step produces logits.
    fn take_cached_prefix(&mut self, seq: &mut Sequence) {
        let reusable = (seq.tokens.len() - 1) / BLOCK_SIZE;
        extend_hashes(
            &self.model_key,
            self.config.share_prefix_cache,
            seq,
            reusable,
        );
        let groups = self.groups;
        let cached =
            |b: usize, g: usize| self.blocks.contains(&group_hash(&seq.block_hashes[b], g));
        let full: Vec<usize> = (0..groups.count())
            .filter(|&g| groups.window(g).is_none())
            .collect();
        let mut hits = (0..reusable)
            .take_while(|&b| full.iter().all(|&g| cached(b, g)))
            .count();
        while hits > 0
            && !(0..groups.count()).all(|g| {
                groups.window(g).is_none()
                    || (groups.first_needed_block(g, hits * BLOCK_SIZE)..hits).all(|b| cached(b, g))
            })
        {
            hits -= 1;
        }
        for b in 0..hits {
            let ids: Vec<u32> = (0..groups.count())
                .map(|g| {
                    if b < groups.first_needed_block(g, hits * BLOCK_SIZE) {
                        return FREED_BLOCK;
                    }
                    self.blocks
                        .lookup(&group_hash(&seq.block_hashes[b], g))
                        .expect("the block was found cached just before")
                })
                .collect();
            seq.blocks.push(&ids);
        }
        seq.num_computed = hits * BLOCK_SIZE;
        seq.registered_blocks = hits;
        self.counters.prefix_queries += seq.tokens.len() as u64;
        self.counters.prefix_hits += (hits * BLOCK_SIZE) as u64;
        if !seq.admitted_before {
            seq.cached_tokens = hits * BLOCK_SIZE;
        }
    }

    /// Records that the planned tokens were computed, and offers newly full blocks to the prefix
    /// cache. A sequence removed since the plan was made has nothing to record.
    pub fn complete(&mut self, scheduled: Scheduled) {
        let Some(&position) = self.positions.get(&scheduled.seq_id) else {
            return;
        };
        let seq = &mut self.running[position];
        seq.num_computed += scheduled.num_tokens;
        if self.config.prefix_caching {
            let full = seq.num_computed / BLOCK_SIZE;
            extend_hashes(&self.model_key, self.config.share_prefix_cache, seq, full);
            while seq.registered_blocks < full {
                let b = seq.registered_blocks;
                for g in 0..self.groups.count() {
                    let block = seq.blocks.table(g)[b];
                    if block != FREED_BLOCK {
                        self.blocks
                            .register(block, group_hash(&seq.block_hashes[b], g));
                    }
                }
                seq.registered_blocks += 1;
            }
        }
        // Blocks that no later token's window reaches go back (after they were offered to the
        // prefix cache above).
        for g in 0..self.groups.count() {
            let first = self.groups.first_needed_block(g, seq.num_computed);
            for block in seq.blocks.free_before(g, first) {
                self.blocks.release(block);
            }
        }
    }

    /// Ends a verification row: the proposals it did not accept leave the sequence, and the
    /// blocks that held only their keys and values go back to the pool (the rejected slots of a
    /// block that is kept are overwritten when their positions are computed again; no block
    /// holding them was offered to the prefix cache, which takes only computed full blocks).
    pub fn end_verification(&mut self, seq_id: u64) {
        let Some(&position) = self.positions.get(&seq_id) else {
            return;
        };
        let seq = &mut self.running[position];
        seq.draft.clear();
        seq.verify.clear();
        let keep = Sequence::blocks_for(seq.num_computed);
        for block in seq.blocks.truncate(keep.max(seq.registered_blocks)) {
            self.blocks.release(block);
        }
    }

    /// Removes the running sequence with id `seq_id` and releases its blocks; the others keep
    /// their admission order.
    pub fn remove_running(&mut self, seq_id: u64) -> Option<Sequence> {
        let position = self.positions.remove(&seq_id)?;
        let mut seq = self.running.remove(position);
        self.index_positions_from(position);
        self.free_blocks(&mut seq);
        Some(seq)
    }

    /// Removes a sequence by id from wherever it is, releasing its blocks.
    pub fn remove(&mut self, id: u64) -> Option<Sequence> {
        if let Some(seq) = self.remove_running(id) {
            return Some(seq);
        }
        let index = self.waiting.iter().position(|s| s.id == id)?;
        let mut seq = self.waiting.remove(index)?;
        self.free_blocks(&mut seq);
        Some(seq)
    }

    /// Records the positions of the running sequences from `start` on, after they moved.
    fn index_positions_from(&mut self, start: usize) {
        for (position, seq) in self.running.iter().enumerate().skip(start) {
            self.positions.insert(seq.id, position);
        }
    }

    /// Adds `logical` blocks to the tables of the running sequence at `index`, one per group each.
    fn grow(&mut self, index: usize, logical: usize) {
        for _ in 0..logical {
            let ids: Vec<u32> = (0..self.groups.count())
                .map(|_| {
                    self.blocks
                        .allocate()
                        .expect("availability checked by the caller")
                })
                .collect();
            self.running[index].blocks.push(&ids);
        }
    }

    fn preempt_last(&mut self) {
        if let Some(mut seq) = self.running.pop() {
            self.positions.remove(&seq.id);
            self.free_blocks(&mut seq);
            self.counters.preemptions += 1;
            tracing::debug!(request = %seq.request.id, "preempted: KV cache full");
            self.waiting.push_front(seq);
        }
    }

    fn free_blocks(&mut self, seq: &mut Sequence) {
        for block in seq.blocks.truncate(0) {
            self.blocks.release(block);
        }
        seq.num_computed = 0;
        seq.registered_blocks = 0;
        seq.draft.clear();
        seq.verify.clear();
    }
}

/// The prefix-cache key of group `group`'s block whose content is `hash`: the content hash itself
/// for group 0 (so a cache of one group keys its blocks as before groups existed), a hash of it
/// and the group for the others.
fn group_hash(hash: &BlockHash, group: usize) -> BlockHash {
    if group == 0 {
        return *hash;
    }
    let mut ctx = Context::new(&SHA256);
    ctx.update(b"inferno-kv-group-v1");
    ctx.update(&(group as u64).to_le_bytes());
    ctx.update(hash);
    let mut out: BlockHash = [0; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Makes the hash chain of `seq` cover its first `count` blocks. The chain starts from the model's
/// key and the request's cache salt (unless the cache is shared), so different principals never
/// share a cached block.
fn extend_hashes(model_key: &[u8; 32], shared: bool, seq: &mut Sequence, count: usize) {
    while seq.block_hashes.len() < count {
        let b = seq.block_hashes.len();
        let mut ctx = Context::new(&SHA256);
        match b.checked_sub(1) {
            Some(prev) => ctx.update(&seq.block_hashes[prev]),
            None => {
                let salt = if shared { 0 } else { seq.request.cache_salt };
                ctx.update(b"inferno-prefix-v1");
                ctx.update(model_key);
                ctx.update(&salt.to_le_bytes());
            }
        }
        for token in &seq.tokens[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE] {
            ctx.update(&token.to_le_bytes());
        }
        let mut hash: BlockHash = [0; 32];
        hash.copy_from_slice(ctx.finish().as_ref());
        seq.block_hashes.push(hash);
    }
}

#[cfg(test)]
#[path = "scheduler_groups_tests.rs"]
mod groups_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::{GenerationRequest, SamplingParams, StopParams};
    use crate::engine::stop::StopMatcher;

    pub(super) fn sequence(id: u64, prompt_len: usize) -> Sequence {
        let request = GenerationRequest {
            id: format!("r{id}"),
            prompt: (0..prompt_len as u32)
                .map(|t| t + 100 * id as u32)
                .collect(),
            sampling: SamplingParams::default(),
            stop: StopParams::default(),
            logprobs: None,
            cache_salt: 0,
            prompt_logprobs: None,
            constraint: None,
        };
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        Sequence::new(
            id,
            request,
            StopMatcher::new(&[]).expect("no stops"),
            events,
        )
    }

    fn scheduler() -> Scheduler {
        let config = EngineConfig {
            max_batched_tokens: 512,
            prefix_caching: false,
            ..EngineConfig::default()
        };
        Scheduler::new(config, 1024, [0; 32])
    }

    /// A scheduler of at most `max_num_seqs` sequences over `num_blocks` blocks, 512-token steps
    /// and no prefix cache.
    pub(super) fn limited(max_num_seqs: usize, num_blocks: usize) -> Scheduler {
        let config = EngineConfig {
            max_num_seqs: Some(max_num_seqs),
            max_batched_tokens: 512,
            prefix_caching: false,
            ..EngineConfig::default()
        };
        Scheduler::new(config, num_blocks, [0; 32])
    }

    /// Runs a plan as the engine would: computes the tokens and, for rows whose prompt is done,
    /// appends a generated token. Rows whose sequence was removed meanwhile are skipped.
    pub(super) fn complete(s: &mut Scheduler, plan: &[Scheduled]) {
        for p in plan {
            s.complete(*p);
            if let Some(seq) = s.get_mut(p.seq_id)
                && seq.pending() == 0
            {
                seq.tokens.push(7);
            }
        }
    }

    #[test]
    fn the_default_sequence_limit_follows_the_kv_cache_not_a_fixed_64() {
        // 4096 blocks: 256 sequences may run (the cap), so 100 short prompts are all admitted.
        let config = EngineConfig {
            max_batched_tokens: 4096,
            prefix_caching: false,
            ..EngineConfig::default()
        };
        let mut s = Scheduler::new(config.clone(), 4096, [0; 32]);
        for id in 1..=100 {
            s.waiting.push_back(sequence(id, 4));
        }
        assert_eq!(s.schedule(usize::MAX).len(), 100);
        // 160 blocks: 10 sequences.
        let mut s = Scheduler::new(config.clone(), 160, [0; 32]);
        for id in 1..=100 {
            s.waiting.push_back(sequence(id, 4));
        }
        assert_eq!(s.schedule(usize::MAX).len(), 10);
        // An explicit limit wins over the derived one.
        let explicit = EngineConfig {
            max_num_seqs: Some(3),
            ..config
        };
        let mut s = Scheduler::new(explicit, 4096, [0; 32]);
        for id in 1..=100 {
            s.waiting.push_back(sequence(id, 4));
        }
        assert_eq!(s.schedule(usize::MAX).len(), 3);
    }

    #[test]
    fn the_decode_load_counts_decoding_rows_their_context_and_the_batch_being_filled() {
        let mut s = limited(4, 1024);
        s.waiting.push_back(sequence(1, 20));
        s.waiting.push_back(sequence(2, 30));
        let plan = s.schedule(usize::MAX);
        complete(&mut s, &plan);
        // Two rows decode their 21st and 31st tokens; nothing waits.
        let load = s.decode_load();
        assert_eq!((load.rows, load.kv_tokens, load.target_rows), (2, 52, 2));
        // A prefilling sequence is no decode row, but the batch is filling towards it and the
        // waiting requests, within the sequence limit of 4.
        s.waiting.push_back(sequence(3, 600));
        let plan = s.schedule(2 + 100);
        let (decode, prefill_tokens) = s.plan_load(&plan);
        assert_eq!(
            (decode.rows, decode.kv_tokens, prefill_tokens),
            (2, 52, 100)
        );
        complete(&mut s, &plan);
        for id in 4..=9 {
            s.waiting.push_back(sequence(id, 4));
        }
        let load = s.decode_load();
        assert_eq!((load.rows, load.kv_tokens, load.target_rows), (2, 54, 4));
    }

    #[test]
    fn decodes_run_before_an_earlier_prefill_takes_the_budget() {
        let mut s = scheduler();
        s.waiting.push_back(sequence(1, 20));
        s.waiting.push_back(sequence(2, 20));
        let plan = s.schedule(usize::MAX);
        complete(&mut s, &plan);
        assert_eq!(s.decoding_rows(), 2);
        // A long prompt is admitted with a small budget, then comes first in running order.
        s.running.insert(0, sequence(3, 1000));
        s.index_positions_from(0);
        let plan = s.schedule(2 + 100);
        let tokens: Vec<(u64, usize)> = plan.iter().map(|p| (p.seq_id, p.num_tokens)).collect();
        assert_eq!(tokens, vec![(3, 100), (1, 1), (2, 1)]);
    }

    #[test]
    fn plans_name_sequences_by_id_across_a_removal_and_a_preemption() {
        // Eight blocks of 16 tokens, all taken by the first step's four prompts (1, 2, 2 and 3
        // blocks).
        let mut s = limited(8, 8);
        for (id, prompt_len) in [(1, 16), (2, 20), (3, 32), (4, 48)] {
            s.waiting.push_back(sequence(id, prompt_len));
        }
        let plan = s.schedule(usize::MAX);
        let rows: Vec<(u64, usize)> = plan.iter().map(|p| (p.seq_id, p.num_tokens)).collect();
        assert_eq!(rows, vec![(1, 16), (2, 20), (3, 32), (4, 48)]);
        // Sequence 2 goes away from the middle of the running list before the step completes:
        // the other rows still complete their own sequences.
        assert_eq!(s.remove(2).map(|seq| seq.id), Some(2));
        complete(&mut s, &plan);
        for (id, computed) in [(1, 16), (3, 32), (4, 48)] {
            let seq = s.get(id).expect("still running");
            assert_eq!((seq.id, seq.num_computed), (id, computed));
        }
        assert!(s.get(2).is_none());
        // Each decode needs a new block and two are free: the last admitted sequence, 4, is
        // preempted, and the plan names the two that run.
        let plan = s.schedule(usize::MAX);
        let rows: Vec<(u64, usize)> = plan.iter().map(|p| (p.seq_id, p.num_tokens)).collect();
        assert_eq!(rows, vec![(1, 1), (3, 1)]);
        assert_eq!(s.counters.preemptions, 1);
        assert!(s.get(4).is_none());
        assert_eq!(s.waiting.front().map(|seq| seq.id), Some(4));
        // Removing the first running sequence does not shift what the other row refers to.
        let removed = s.remove_running(1).expect("sequence 1 was running");
        assert_eq!(removed.id, 1);
        complete(&mut s, &plan);
        let seq = s.get(3).expect("still running");
        assert_eq!((seq.num_computed, seq.tokens.len()), (33, 34));
        let running: Vec<u64> = s.running().map(|seq| seq.id).collect();
        assert_eq!(running, vec![3]);
    }

    #[test]
    fn the_budget_bounds_prefill_and_admission_but_not_decodes() {
        let mut s = scheduler();
        for id in 1..=3 {
            s.waiting.push_back(sequence(id, 10));
        }
        let plan = s.schedule(usize::MAX);
        assert_eq!(plan.len(), 3);
        complete(&mut s, &plan);
        s.waiting.push_back(sequence(4, 300));
        // Three decodes and 64 prompt tokens.
        let plan = s.schedule(3 + 64);
        let total: usize = plan.iter().map(|p| p.num_tokens).sum();
        assert_eq!(total, 67);
        assert_eq!(plan.last().map(|p| p.num_tokens), Some(64));
        // The configured maximum still caps a larger budget.
        complete(&mut s, &plan);
        let plan = s.schedule(10_000);
        let total: usize = plan.iter().map(|p| p.num_tokens).sum();
        assert_eq!(total, 3 + 236);
        assert!(total <= 512);
    }

    #[test]
    fn a_verification_row_grows_then_gives_back_the_blocks_of_rejected_proposals() {
        let mut s = limited(4, 8);
        // A 15-token prompt: its first token to decode sits at position 15, the block's last.
        s.waiting.push_back(sequence(1, 15));
        let plan = s.schedule(usize::MAX);
        complete(&mut s, &plan);
        let available = s.blocks.num_available();
        s.get_mut(1).expect("running").draft = vec![3, 4, 5, 6];
        let plan = s.schedule(usize::MAX);
        assert_eq!(
            plan,
            vec![Scheduled {
                seq_id: 1,
                num_tokens: 5
            }]
        );
        let seq = s.get(1).expect("running");
        assert_eq!(seq.verify, vec![7, 3, 4, 5, 6]);
        // Positions 15..20 span a second block.
        assert_eq!(
            (seq.blocks.len(), s.blocks.num_available()),
            (2, available - 1)
        );
        // One proposal accepted: positions 15 and 16 are computed, 17..20 are rolled back; the
        // second block holds position 16, so it stays.
        s.get_mut(1).expect("running").tokens.extend([3, 9]);
        s.complete(Scheduled {
            seq_id: 1,
            num_tokens: 2,
        });
        s.end_verification(1);
        let seq = s.get(1).expect("running");
        assert_eq!(
            (seq.num_computed, seq.pending(), seq.blocks.len()),
            (17, 1, 2)
        );
        assert!(seq.draft.is_empty() && seq.verify.is_empty());
        // None accepted from the block boundary: the block that held only proposals goes back.
        let mut s = limited(4, 8);
        s.waiting.push_back(sequence(2, 15));
        let plan = s.schedule(usize::MAX);
        complete(&mut s, &plan);
        s.get_mut(2).expect("running").draft = vec![3, 4];
        s.schedule(usize::MAX);
        assert_eq!(s.blocks.num_available(), 6);
        s.get_mut(2).expect("running").tokens.push(8);
        s.complete(Scheduled {
            seq_id: 2,
            num_tokens: 1,
        });
        s.end_verification(2);
        assert_eq!(s.get(2).expect("running").blocks.len(), 1);
        assert_eq!(s.blocks.num_available(), 7);
    }
}
