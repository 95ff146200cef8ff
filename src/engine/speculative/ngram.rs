//! The prompt-lookup (n-gram) proposer: the tokens that followed the latest earlier occurrence
//! of the sequence's last `n` tokens in its own prompt and output, no extra model.

/// Up to `k` tokens proposed to follow `context`: for `n` from `max_n` down to `min_n`, the
/// continuation of the latest earlier occurrence of the context's last `n` tokens (empty when
/// none occurs).
pub fn propose(context: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    if k == 0 || min_n == 0 {
        return Vec::new();
    }
    let len = context.len();
    for n in (min_n..=max_n).rev() {
        if len <= n {
            continue;
        }
        let suffix = &context[len - n..];
        // The latest occurrence that ends before the suffix itself begins to overlap its end.
        if let Some(start) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
            let from = start + n;
            return context[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // "a b c d ... a b c" -> "d e"; the 3-gram wins over later 1-gram matches.
        let context = [1, 2, 3, 4, 5, 9, 3, 7, 1, 2, 3];
        assert_eq!(propose(&context, 1, 3, 2), vec![4, 5]);
        // Only the 1-gram "3" matches: its latest earlier occurrence is followed by 7, 1.
        let context = [1, 2, 3, 4, 5, 9, 3, 7, 1, 8, 3];
        assert_eq!(propose(&context, 1, 3, 2), vec![7, 1]);
        // Below the shortest n-gram, nothing.
        assert!(propose(&context, 2, 3, 2).is_empty());
        // A continuation shorter than k at the end of the context.
        assert_eq!(propose(&[5, 6, 5], 1, 2, 4), vec![6, 5]);
        assert!(propose(&[1, 2, 3], 1, 3, 0).is_empty());
    }
}
