//! `torch.topk` on the CPU, index for index, ties included.
//!
//! A mixture of experts chooses each token's experts with `torch.topk` over the router's
//! probabilities. When two experts tie at the boundary of the top k, which one is chosen is not
//! "the lower index": it is whatever PyTorch's CPU kernel (`aten/src/ATen/native/TopKImpl.h`)
//! leaves in front, and that kernel runs the C++ standard library's selection algorithms on
//! `(value, index)` pairs compared by value alone. PyTorch's Linux builds use GNU libstdc++, so
//! this module performs libstdc++'s algorithms step by step: for `k · 64 <= n` `partial_sort`
//! (a binary heap of the first k pairs that a later pair enters only when strictly greater than
//! the heap's front, then `sort_heap`), otherwise `nth_element` (introselect: median-of-three
//! partitions, heap selection past the depth limit, insertion sort below four elements) and, for
//! the order of the result, an insertion sort of the first k − 1 pairs (PyTorch sorts
//! `begin .. begin + k - 1`). `tests/fixtures/moe/topk_ties.json` holds torch 2.15's own answers
//! for inputs full of ties, on both paths.

use std::cmp::Ordering;

/// A probability and the expert it belongs to.
type Pair = (f32, usize);

/// PyTorch's comparison for the largest values: `a` goes before `b` when it is NaN and `b` is
/// not, or when it is greater.
fn before(a: &Pair, b: &Pair) -> bool {
    (a.0.is_nan() && !b.0.is_nan()) || a.0.partial_cmp(&b.0) == Some(Ordering::Greater)
}

/// The indices of the `k` largest `values` (`1 <= k <= values.len()`), in the order
/// `torch.topk(values, k)` returns them on the CPU (`sorted=True`).
pub fn topk(values: &[f32], k: usize) -> Vec<usize> {
    let n = values.len();
    assert!(k >= 1 && k <= n, "top-{k} of {n} values");
    if k * 64 <= n {
        let mut queue: Vec<Pair> = values.iter().copied().zip(0..).collect();
        heap_select(&mut queue, k);
        sort_heap(&mut queue[..k]);
        queue[..k].iter().map(|&(_, index)| index).collect()
    } else {
        let mut queue: Vec<Pair> = values.iter().copied().zip(0..).collect();
        nth_element(&mut queue, k - 1);
        insertion_sort(&mut queue[..k - 1]);
        queue[..k].iter().map(|&(_, index)| index).collect()
    }
}

/// Moves `value` up from `hole` towards `top` while its parent goes after it (libstdc++'s
/// `__push_heap`).
fn push_hole(heap: &mut [Pair], mut hole: usize, top: usize, value: Pair) {
    while hole > top {
        let parent = (hole - 1) / 2;
        if !before(&heap[parent], &value) {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

/// Moves the hole at `hole` down to a leaf along the larger children, then pushes `value` up
/// from there (libstdc++'s `__adjust_heap`) over the first `len` pairs.
fn adjust_heap(heap: &mut [Pair], mut hole: usize, len: usize, value: Pair) {
    let top = hole;
    let mut child = hole;
    while child < (len.saturating_sub(1)) / 2 {
        child = 2 * (child + 1);
        if before(&heap[child], &heap[child - 1]) {
            child -= 1;
        }
        heap[hole] = heap[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    push_hole(heap, hole, top, value);
}

/// Makes a heap of `heap` whose front goes after every other pair.
fn make_heap(heap: &mut [Pair]) {
    let len = heap.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = heap[parent];
        adjust_heap(heap, parent, len, value);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// Swaps the front of the heap of the first `len` pairs into `result`, re-heaping the rest
/// (libstdc++'s `__pop_heap`).
fn pop_heap_into(heap: &mut [Pair], len: usize, result: usize) {
    let value = heap[result];
    heap[result] = heap[0];
    adjust_heap(heap, 0, len, value);
}

/// Moves the heap's front to its end and re-heaps the rest.
fn pop_heap(heap: &mut [Pair]) {
    let len = heap.len();
    if len > 1 {
        pop_heap_into(heap, len - 1, len - 1);
    }
}

/// Sorts a heap, pair by pair from its end.
fn sort_heap(heap: &mut [Pair]) {
    let mut len = heap.len();
    while len > 1 {
        pop_heap(&mut heap[..len]);
        len -= 1;
    }
}

/// Puts the pair that belongs at `nth` there, with no pair after it going before it and none
/// before it going after (libstdc++'s introselect).
fn nth_element(queue: &mut [Pair], nth: usize) {
    let (mut first, mut last) = (0, queue.len());
    if first == last || nth == last {
        return;
    }
    let mut depth = 2 * (usize::BITS - 1 - last.leading_zeros());
    while last - first > 3 {
        if depth == 0 {
            heap_select(&mut queue[first..last], nth + 1 - first);
            queue.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = first + partition_pivot(&mut queue[first..last]);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(&mut queue[first..last]);
}

/// Keeps the `middle` pairs that go first in a heap at the front (libstdc++'s `__heap_select`).
fn heap_select(queue: &mut [Pair], middle: usize) {
    make_heap(&mut queue[..middle]);
    for i in middle..queue.len() {
        if before(&queue[i], &queue[0]) {
            pop_heap_into(queue, middle, i);
        }
    }
}

/// Partitions around the median of the second, middle and last pairs moved to the front;
/// returns where the second part starts.
fn partition_pivot(queue: &mut [Pair]) -> usize {
    let len = queue.len();
    let (a, b, c) = (1, len / 2, len - 1);
    let median = if before(&queue[a], &queue[b]) {
        if before(&queue[b], &queue[c]) {
            b
        } else if before(&queue[a], &queue[c]) {
            c
        } else {
            a
        }
    } else if before(&queue[a], &queue[c]) {
        a
    } else if before(&queue[b], &queue[c]) {
        c
    } else {
        b
    };
    queue.swap(0, median);
    let (mut first, mut last) = (1, len);
    loop {
        while before(&queue[first], &queue[0]) {
            first += 1;
        }
        last -= 1;
        while before(&queue[0], &queue[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        queue.swap(first, last);
        first += 1;
    }
}

/// libstdc++'s insertion sort: a pair that goes before the first one moves to the front,
/// others move left past the pairs they go before.
fn insertion_sort(queue: &mut [Pair]) {
    for i in 1..queue.len() {
        let value = queue[i];
        if before(&value, &queue[0]) {
            queue.copy_within(0..i, 1);
            queue[0] = value;
        } else {
            let mut hole = i;
            while before(&value, &queue[hole - 1]) {
                queue[hole] = queue[hole - 1];
                hole -= 1;
            }
            queue[hole] = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_values_come_out_largest_first() {
        let values = [0.1, 0.7, 0.3, 0.9, 0.2, 0.8, 0.05, 0.6];
        assert_eq!(topk(&values, 3), vec![3, 5, 1]);
        assert_eq!(topk(&values, 8), vec![3, 5, 1, 7, 2, 4, 0, 6]);
        let many: Vec<f32> = (0..300).map(|i| ((i * 37) % 300) as f32).collect();
        let top = topk(&many, 4);
        let want: Vec<usize> = [299.0f32, 298.0, 297.0, 296.0]
            .iter()
            .map(|v| many.iter().position(|x| x == v).unwrap())
            .collect();
        assert_eq!(top, want);
    }

    /// torch's own answers for inputs full of ties, on both of its paths
    /// (`scripts/make_moe_fixtures.py`).
    #[test]
    fn ties_come_out_as_torch_orders_them() {
        #[derive(serde::Deserialize)]
        struct Case {
            values: Vec<f32>,
            k: usize,
            indices: Vec<usize>,
        }
        #[derive(serde::Deserialize)]
        struct Fixture {
            cases: Vec<Case>,
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/moe/topk_ties.json");
        let fixture: Fixture =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(fixture.cases.len() > 200);
        let mut partial = 0;
        for (i, case) in fixture.cases.iter().enumerate() {
            partial += usize::from(case.k * 64 <= case.values.len());
            assert_eq!(
                topk(&case.values, case.k),
                case.indices,
                "case {i}: top-{} of {}",
                case.k,
                case.values.len()
            );
        }
        assert!(partial > 0, "the heap path is covered");
    }

    #[test]
    fn nan_counts_as_largest() {
        assert_eq!(topk(&[0.5, f32::NAN, 0.9], 1), vec![1]);
    }
}
