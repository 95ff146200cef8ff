//! KV-cache groups: layers that attend over the same positions share one block table.
//!
//! A model whose layers all attend over the whole context has one group, and every sequence one
//! block table, as before groups existed. A model with sliding-window layers (gpt-oss alternates
//! them with full-attention layers; Mistral and Mixtral may have only them) puts those layers in
//! a group of their own: their table keeps only the blocks that the next token's window reaches,
//! and the blocks that fell out of it go back to the pool (the table keeps [`FREED_BLOCK`] in
//! their place, so logical block `i` still holds positions `i * BLOCK_SIZE..`).
//!
//! The groups share one pool of physical blocks. A block belongs to one group at a time; its
//! storage is one page per *slot*, and slot `i` holds the `i`-th layer of whichever group owns
//! the block, so a block is as large as the largest group's layers.

use super::config::BLOCK_SIZE;

/// A block table entry whose block was given back: its positions are outside every window that
/// will read them again. A backend never reads it.
pub const FREED_BLOCK: u32 = u32::MAX;

/// The KV-cache groups of a model: at most one of full-attention layers and one of sliding
/// layers (one window). Group 0 is the full-attention group when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGroups {
    /// Whether some layers attend over the whole context.
    pub full: bool,
    /// The window of the sliding layers, when some layers have one.
    pub sliding_window: Option<usize>,
}

impl Default for KvGroups {
    /// One full-attention group.
    fn default() -> Self {
        Self {
            full: true,
            sliding_window: None,
        }
    }
}

impl KvGroups {
    /// The groups of layers with these windows (`None`: full attention). Layers with different
    /// windows would need a group each: they are all kept in one full-attention group instead,
    /// which is correct (nothing is freed) and serves no model that is supported today.
    pub fn of(windows: impl IntoIterator<Item = Option<usize>>) -> Self {
        let mut full = false;
        let mut window = None;
        for w in windows {
            match (w, window) {
                (None, _) => full = true,
                (Some(w), None) => window = Some(w),
                (Some(w), Some(seen)) if w == seen => {}
                (Some(_), Some(_)) => return Self::default(),
            }
        }
        Self {
            full: full || window.is_none(),
            sliding_window: window,
        }
    }

    /// How many groups there are (1 or 2).
    pub fn count(&self) -> usize {
        usize::from(self.full) + usize::from(self.sliding_window.is_some())
    }

    /// The window of group `group` (`None`: it attends over the whole context).
    pub fn window(&self, group: usize) -> Option<usize> {
        if self.full && group == 0 {
            None
        } else {
            self.sliding_window
        }
    }

    /// The group of a layer with this window.
    pub fn group_of(&self, window: Option<usize>) -> usize {
        match window {
            Some(_) if self.full && self.sliding_window.is_some() => 1,
            _ => 0,
        }
    }

    /// The most blocks the sliding group holds for one sequence whose steps compute one token
    /// (the window's positions and the new one span this many blocks at most); 0 without it.
    pub fn sliding_reserve(&self) -> usize {
        self.sliding_window
            .map_or(0, |window| window.div_ceil(BLOCK_SIZE) + 1)
    }

    /// The blocks one sequence holds across the groups when it spans `blocks` blocks of
    /// positions: all of them in the full-attention group, at most `sliding_reserve` in the
    /// sliding one.
    pub fn blocks_per_sequence(&self, blocks: usize) -> usize {
        (0..self.count())
            .map(|group| match self.window(group) {
                None => blocks,
                Some(_) => blocks.min(self.sliding_reserve()),
            })
            .sum()
    }

    /// The first logical block that a token at `position` or later reads in group `group`: the
    /// blocks before it can be given back.
    pub fn first_needed_block(&self, group: usize, position: usize) -> usize {
        self.window(group).map_or(0, |window| {
            (position + 1).saturating_sub(window) / BLOCK_SIZE
        })
    }
}

/// Where a layer's keys and values live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPlace {
    /// Its KV group (which block table of a row it reads).
    pub group: usize,
    /// Its storage slot: the `slot`-th layer of its group.
    pub slot: usize,
}

/// The groups of layers with these windows (`None`: full attention), each layer's place, and
/// the number of storage slots (the largest group's layers; one per layer with one group).
pub fn layer_places(windows: &[Option<usize>]) -> (KvGroups, Vec<LayerPlace>, usize) {
    let groups = KvGroups::of(windows.iter().copied());
    let mut sizes = vec![0; groups.count()];
    let places = windows
        .iter()
        .map(|&window| {
            let group = groups.group_of(window);
            sizes[group] += 1;
            LayerPlace {
                group,
                slot: sizes[group] - 1,
            }
        })
        .collect();
    (groups, places, sizes.into_iter().max().unwrap_or(0))
}

/// One sequence's block tables, one per KV group, all of the same logical length, stored one
/// after the other (the layout a [`crate::engine::BatchRow`] carries).
#[derive(Debug, Clone, Default)]
pub struct BlockTables {
    /// Group `g`'s table is `ids[g * len..(g + 1) * len]`.
    ids: Vec<u32>,
    /// Logical blocks per group.
    len: usize,
    /// Groups (set by the first [`BlockTables::push`]).
    groups: usize,
}

impl BlockTables {
    /// Logical blocks: positions `0..len() * BLOCK_SIZE` have a table entry in every group.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the sequence holds no block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Group `group`'s table.
    pub fn table(&self, group: usize) -> &[u32] {
        self.ids
            .get(group * self.len..(group + 1) * self.len)
            .unwrap_or(&[])
    }

    /// The tables a step's row carries when it covers the first `blocks` logical blocks: with
    /// one group, that group's first `blocks` entries; with several, every group's whole table,
    /// one after the other.
    pub fn row(&self, blocks: usize) -> &[u32] {
        if self.groups <= 1 {
            &self.ids[..blocks.min(self.ids.len())]
        } else {
            &self.ids
        }
    }

    /// Appends one logical block: `blocks[g]` to group `g`'s table.
    pub fn push(&mut self, blocks: &[u32]) {
        if self.len == 0 {
            self.groups = blocks.len();
            self.ids.clear();
        }
        assert_eq!(blocks.len(), self.groups, "one block per group");
        for (g, &block) in blocks.iter().enumerate().rev() {
            self.ids.insert((g + 1) * self.len, block);
        }
        self.len += 1;
    }

    /// Keeps the first `len` logical blocks and returns the blocks of the others that were held.
    pub fn truncate(&mut self, len: usize) -> Vec<u32> {
        if len >= self.len {
            return Vec::new();
        }
        let mut released = Vec::new();
        for g in (0..self.groups).rev() {
            let tail = self.ids.drain(g * self.len + len..(g + 1) * self.len);
            released.extend(tail.filter(|&b| b != FREED_BLOCK));
        }
        self.len = len;
        released
    }

    /// Gives back group `group`'s blocks before logical block `first` and returns those that
    /// were held.
    pub fn free_before(&mut self, group: usize, first: usize) -> Vec<u32> {
        let start = group * self.len;
        let end = start + first.min(self.len);
        let mut released = Vec::new();
        for id in &mut self.ids[start..end] {
            if *id != FREED_BLOCK {
                released.push(*id);
                *id = FREED_BLOCK;
            }
        }
        released
    }

    /// Blocks held (entries not given back) in group `group`.
    pub fn held(&self, group: usize) -> usize {
        self.table(group)
            .iter()
            .filter(|&&b| b != FREED_BLOCK)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacity_reads_as_tokens_or_any_length_where_every_layer_slides() {
        let shape = |groups| crate::engine::KvCacheShape {
            num_blocks: 10,
            block_size: 16,
            groups,
        };
        assert_eq!(
            shape(KvGroups::of([None, None])).capacity_label(),
            "160 tokens"
        );
        let mistral = shape(KvGroups::of([Some(24), Some(24)]));
        assert_eq!(mistral.capacity_tokens(), usize::MAX);
        assert_eq!(
            mistral.capacity_label(),
            "any length (every layer keeps a window of 24)"
        );
    }

    #[test]
    fn groups_follow_the_layers_windows() {
        let dense = KvGroups::of([None, None]);
        assert_eq!((dense.count(), dense.window(0)), (1, None));
        assert_eq!(dense, KvGroups::default());
        let gpt_oss = KvGroups::of([Some(128), None, Some(128)]);
        assert_eq!(gpt_oss.count(), 2);
        assert_eq!((gpt_oss.window(0), gpt_oss.window(1)), (None, Some(128)));
        assert_eq!(
            (gpt_oss.group_of(None), gpt_oss.group_of(Some(128))),
            (0, 1)
        );
        let mistral = KvGroups::of([Some(24), Some(24)]);
        assert_eq!((mistral.count(), mistral.window(0)), (1, Some(24)));
        assert_eq!(mistral.group_of(Some(24)), 0);
        // Two windows: one full group, nothing freed.
        assert_eq!(KvGroups::of([Some(8), Some(16)]), KvGroups::default());
        // A window of 8 spans at most two blocks of 16 with the new token.
        assert_eq!(gpt_oss.sliding_reserve(), 128 / BLOCK_SIZE + 1);
        assert_eq!(KvGroups::of([Some(8)]).sliding_reserve(), 2);
        // The token at position 40 with a window of 8 reads 33..=40: blocks 2 on.
        assert_eq!(KvGroups::of([Some(8)]).first_needed_block(0, 40), 2);
        assert_eq!(gpt_oss.first_needed_block(0, 4000), 0);
    }

    #[test]
    fn layers_of_two_groups_share_slots() {
        // gpt-oss's tiny fixture: sliding, full, sliding.
        let (groups, places, slots) = layer_places(&[Some(8), None, Some(8)]);
        assert_eq!(groups.count(), 2);
        let got: Vec<(usize, usize)> = places.iter().map(|p| (p.group, p.slot)).collect();
        assert_eq!(got, vec![(1, 0), (0, 0), (1, 1)]);
        assert_eq!(slots, 2);
        // One group: one slot per layer, as before groups.
        let (groups, places, slots) = layer_places(&[None, None, None]);
        assert_eq!((groups.count(), slots), (1, 3));
        assert_eq!(places[2], LayerPlace { group: 0, slot: 2 });
        // gpt-oss-120b: 18 and 18, nothing padded.
        let windows: Vec<Option<usize>> = (0..36).map(|l| (l % 2 == 0).then_some(128)).collect();
        assert_eq!(layer_places(&windows).2, 18);
    }

    #[test]
    fn tables_grow_together_and_give_back_their_blocks() {
        let mut t = BlockTables::default();
        t.push(&[1, 2]);
        t.push(&[3, 4]);
        t.push(&[5, 6]);
        assert_eq!((t.table(0), t.table(1)), (&[1, 3, 5][..], &[2, 4, 6][..]));
        assert_eq!(t.row(3), &[1, 3, 5, 2, 4, 6]);
        assert_eq!(t.free_before(1, 2), vec![2, 4]);
        assert_eq!(t.free_before(1, 2), Vec::<u32>::new());
        assert_eq!(t.table(1), &[FREED_BLOCK, FREED_BLOCK, 6]);
        assert_eq!((t.held(0), t.held(1)), (3, 1));
        let mut released = t.truncate(2);
        released.sort_unstable();
        assert_eq!(released, vec![5, 6]);
        assert_eq!(
            (t.table(0), t.table(1)),
            (&[1, 3][..], &[FREED_BLOCK; 2][..])
        );
        let mut released = t.truncate(0);
        released.sort_unstable();
        assert_eq!(released, vec![1, 3]);
        assert!(t.is_empty());
        // One group: the row is today's single table, cut at the blocks the step covers.
        t.push(&[9]);
        t.push(&[8]);
        assert_eq!(t.row(1), &[9]);
    }
}
