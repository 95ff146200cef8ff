//! Physical KV blocks: allocation, reference counts and the prefix cache.
//!
//! A block is free, held by one or more sequences, or cached: full, registered under the hash of
//! its prefix chain, and kept after its last holder released it until memory is needed (least
//! recently used first). Sequences that share a prompt prefix share its cached blocks.

use std::collections::{BTreeMap, HashMap};

/// Identifies the content of a full block: a hash chain over the model, the cache salt and every
/// token from the start of the sequence to the end of the block.
pub type BlockHash = [u8; 32];

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_count: u32,
    hash: Option<BlockHash>,
    /// When the block was last released, for LRU eviction of cached blocks.
    released_at: u64,
}

/// Allocates KV blocks and keeps the prefix cache.
#[derive(Debug)]
pub struct BlockManager {
    blocks: Vec<BlockMeta>,
    /// Free blocks that hold no cached content.
    free: Vec<u32>,
    /// Cached blocks no sequence holds, by release time (oldest first).
    evictable: BTreeMap<u64, u32>,
    /// Registered full blocks by content hash.
    cached: HashMap<BlockHash, u32>,
    clock: u64,
}

impl BlockManager {
    /// A manager of `num_blocks` free blocks.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            blocks: vec![BlockMeta::default(); num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            clock: 0,
        }
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that an allocation can take now (free, or cached and unheld).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks held by at least one sequence.
    pub fn num_held(&self) -> usize {
        self.num_blocks() - self.num_available()
    }

    /// Takes a block for new content: a free one, else the least recently used cached one.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let (_, block) = self.evictable.pop_first()?;
                if let Some(hash) = self.blocks[block as usize].hash.take() {
                    self.cached.remove(&hash);
                }
                block
            }
        };
        self.blocks[block as usize].ref_count = 1;
        Some(block)
    }

    /// Whether a cached block has this content.
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.cached.contains_key(hash)
    }

    /// Takes a cached block with this content, if there is one, adding a holder.
    pub fn lookup(&mut self, hash: &BlockHash) -> Option<u32> {
        let block = *self.cached.get(hash)?;
        let meta = &mut self.blocks[block as usize];
        if meta.ref_count == 0 {
            self.evictable.remove(&meta.released_at);
        }
        meta.ref_count += 1;
        Some(block)
    }

    /// Records that a held block is now full with the content `hash`, so later sequences can reuse
    /// it. If another block already has this content, the cache keeps that one.
    pub fn register(&mut self, block: u32, hash: BlockHash) {
        if self.cached.contains_key(&hash) || self.blocks[block as usize].hash.is_some() {
            return;
        }
        self.blocks[block as usize].hash = Some(hash);
        self.cached.insert(hash, block);
    }

    /// Drops one holder of `block`. An unheld block returns to the free list, or stays cached
    /// (evictable) if it has registered content.
    pub fn release(&mut self, block: u32) {
        let meta = &mut self.blocks[block as usize];
        debug_assert!(
            meta.ref_count > 0,
            "block {block} released more often than held"
        );
        meta.ref_count = meta.ref_count.saturating_sub(1);
        if meta.ref_count > 0 {
            return;
        }
        if meta.hash.is_some() {
            self.clock += 1;
            meta.released_at = self.clock;
            self.evictable.insert(self.clock, block);
        } else {
            self.free.push(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> BlockHash {
        [n; 32]
    }

    #[test]
    fn allocates_every_block_once_then_runs_out() {
        let mut m = BlockManager::new(3);
        let mut got: Vec<u32> = (0..3)
            .map(|_| m.allocate().expect("a free block"))
            .collect();
        got.sort();
        assert_eq!(got, vec![0, 1, 2]);
        assert_eq!(m.allocate(), None);
        m.release(1);
        assert_eq!(m.allocate(), Some(1));
    }

    #[test]
    fn cached_blocks_are_shared_then_evicted_lru() {
        let mut m = BlockManager::new(2);
        let a = m.allocate().expect("block");
        let b = m.allocate().expect("block");
        m.register(a, hash(1));
        m.register(b, hash(2));
        m.release(a);
        m.release(b);
        assert_eq!(m.num_available(), 2);
        // A hit takes the block out of the evictable set and shares it.
        assert_eq!(m.lookup(&hash(2)), Some(b));
        assert_eq!(m.lookup(&hash(2)), Some(b));
        assert_eq!(m.num_available(), 1);
        // Allocation evicts the least recently released cached block (a).
        assert_eq!(m.allocate(), Some(a));
        assert_eq!(m.lookup(&hash(1)), None);
        m.release(b);
        assert_eq!(m.num_available(), 0);
        m.release(b);
        assert_eq!(m.num_available(), 1);
        assert_eq!(m.lookup(&hash(2)), Some(b));
    }

    #[test]
    fn duplicate_content_keeps_the_first_block() {
        let mut m = BlockManager::new(2);
        let a = m.allocate().expect("block");
        let b = m.allocate().expect("block");
        m.register(a, hash(7));
        m.register(b, hash(7));
        m.release(b);
        // b had no registered content, so it is plainly free.
        assert_eq!(m.lookup(&hash(7)), Some(a));
        assert_eq!(m.allocate(), Some(b));
    }
}
