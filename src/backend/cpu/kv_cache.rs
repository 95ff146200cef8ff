//! The paged KV cache in host memory: per layer, keys and values of every slot
//! (`block * BLOCK_SIZE + offset`), each `kv_heads * head_dim` floats.

use crate::engine::BLOCK_SIZE;

/// Keys and values of one layer.
#[derive(Debug)]
pub struct LayerCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// The whole cache.
#[derive(Debug)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    pub num_blocks: usize,
}

impl KvCache {
    /// Bytes one token occupies across all layers.
    pub fn bytes_per_token(layers: usize, slot_width: usize) -> usize {
        layers * 2 * slot_width * std::mem::size_of::<f32>()
    }

    /// A zeroed cache of `num_blocks` blocks.
    pub fn new(layers: usize, slot_width: usize, num_blocks: usize) -> Self {
        let floats = num_blocks * BLOCK_SIZE * slot_width;
        Self {
            layers: (0..layers)
                .map(|_| LayerCache {
                    keys: vec![0.0; floats],
                    values: vec![0.0; floats],
                })
                .collect(),
            num_blocks,
        }
    }
}

/// The cache slot of `position` under `block_table`.
pub fn slot(block_table: &[u32], position: usize) -> usize {
    block_table[position / BLOCK_SIZE] as usize * BLOCK_SIZE + position % BLOCK_SIZE
}
