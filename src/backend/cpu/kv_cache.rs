//! The paged KV cache in host memory: per storage slot, keys and values of every block position
//! (`block * BLOCK_SIZE + offset`), each `kv_heads * head_dim` floats.
//!
//! The layers form KV groups (`engine::kv_groups`): the full-attention layers one, the sliding
//! layers another. A block belongs to one group at a time, and slot `i` holds the `i`-th layer of
//! that group, so the cache has as many slots as the largest group has layers (one slot per
//! layer for a model with one group).

use crate::engine::kv_groups::{LayerPlace, layer_places};
use crate::engine::{BLOCK_SIZE, FREED_BLOCK, KvGroups};

/// Keys and values of one slot.
#[derive(Debug)]
pub struct LayerCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// The whole cache.
#[derive(Debug)]
pub struct KvCache {
    pub slots: Vec<LayerCache>,
    pub num_blocks: usize,
    /// The groups of the model's layers.
    pub groups: KvGroups,
    /// Each layer's group and slot.
    pub layers: Vec<LayerPlace>,
}

impl KvCache {
    /// Bytes one token occupies across `slots` slots.
    pub fn bytes_per_token(slots: usize, slot_width: usize) -> usize {
        slots * 2 * slot_width * std::mem::size_of::<f32>()
    }

    /// A zeroed cache of `num_blocks` blocks for layers with these sliding windows.
    pub fn new(windows: &[Option<usize>], slot_width: usize, num_blocks: usize) -> Self {
        let (groups, layers, slots) = layer_places(windows);
        let floats = num_blocks * BLOCK_SIZE * slot_width;
        Self {
            slots: (0..slots)
                .map(|_| LayerCache {
                    keys: vec![0.0; floats],
                    values: vec![0.0; floats],
                })
                .collect(),
            num_blocks,
            groups,
            layers,
        }
    }
}

/// The cache position of `position` under `block_table`.
pub fn slot(block_table: &[u32], position: usize) -> usize {
    let block = block_table[position / BLOCK_SIZE];
    debug_assert_ne!(block, FREED_BLOCK, "position {position} was given back");
    block as usize * BLOCK_SIZE + position % BLOCK_SIZE
}
