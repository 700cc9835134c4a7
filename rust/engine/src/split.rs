//! How a batch becomes micro-batches (llama_batch_allocr's splits).
//!
//! An attention-only model takes the batch in order, n_ubatch tokens at a time. A model with
//! recurrent layers needs micro-batches of whole sequence groups with as many tokens each
//! (llama.cpp's `split_equal`): each group's state is read once and advanced over its tokens.

use ferrollama_kv::SeqSet;

use crate::batch::Batch;
use crate::error::{EngineError, Result};

/// One micro-batch: which batch indices it computes, in its own order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UBatchPlan {
    /// Batch indices, group-major for an equal split.
    pub idx: Vec<usize>,
    /// Sequence groups and tokens per group (an equal split; 0 groups for a simple one).
    pub n_seqs: usize,
    pub n_seq_tokens: usize,
}

/// The batch in order, `n_ubatch` tokens at a time (llama.cpp's split_simple).
pub fn split_simple(n_tokens: usize, n_ubatch: usize) -> Vec<UBatchPlan> {
    (0..n_tokens).step_by(n_ubatch)
        .map(|s| UBatchPlan { idx: (s..(s + n_ubatch).min(n_tokens)).collect(), n_seqs: 0, n_seq_tokens: 0 })
        .collect()
}

/// llama_batch_allocr::split_equal until the batch is used up: each micro-batch takes
/// sequence groups that share no sequence (with `sequential`, only groups whose first ids
/// follow each other: 0, 1, 2 …), and the same number of tokens from each, at most
/// n_ubatch tokens in all. A token in several sequences (coupled sequences) cannot be split
/// sequentially, as in llama.cpp. With `keep_tail` > 0 the last `keep_tail` tokens of each
/// group stay in one micro-batch (a recurrent context's rollback snapshots cover the last
/// tokens of a group's last micro-batch).
pub fn split_equal(batch: &Batch, n_ubatch: usize, sequential: bool, keep_tail: usize) -> Result<Vec<UBatchPlan>> {
    let n = batch.len();
    let sets: Vec<SeqSet> = batch.seq_ids.iter().map(|ids| ids.iter().copied().collect()).collect();
    if sequential && batch.seq_ids.iter().any(|ids| ids.len() > 1) {
        return Err(EngineError::Decode(
            "a token belongs to several sequences, which a recurrent model's sequential split cannot place \
             (decode the sequences separately and share the state with seq_cp)".into()));
    }
    // the token indices of each distinct sequence set, in batch order
    let mut groups: Vec<(SeqSet, Vec<usize>)> = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        match groups.iter_mut().find(|(s, _)| s == set) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((*set, vec![i])),
        }
    }
    let mut used = vec![false; n];
    let mut next = vec![0usize; groups.len()];
    let mut plans = Vec::new();
    let mut n_used = 0;
    while n_used < n {
        let mut chosen = choose_groups(batch, &sets, &groups, &used, n_ubatch, sequential);
        let mut per_group: Vec<Vec<usize>> = vec![Vec::new(); chosen.len()];
        loop {
            let can_expand = chosen.iter().all(|&g| next[g] < groups[g].1.len());
            if !can_expand {
                break;
            }
            for (k, &g) in chosen.iter().enumerate() {
                let i = groups[g].1[next[g]];
                per_group[k].push(i);
                used[i] = true;
                n_used += 1;
                next[g] += 1;
            }
            if (per_group[0].len() + 1) * chosen.len() > n_ubatch {
                break;
            }
        }
        if keep_tail > 0 {
            keep_tails_whole(&groups, &mut chosen, &mut per_group, &mut next, &mut used, &mut n_used, n_ubatch, keep_tail);
        }
        let n_seq_tokens = per_group[0].len();
        plans.push(UBatchPlan { idx: per_group.concat(), n_seqs: chosen.len(), n_seq_tokens });
    }
    Ok(plans)
}

/// llama.cpp's n_keep_tail rule: keep the longest run of groups that either end in this
/// micro-batch or leave at least `keep_tail` tokens for a later one; if the first group does
/// neither, it goes alone, to its end when that fits, else leaving `keep_tail` tokens. The
/// other groups' tokens go back to the pool.
#[allow(clippy::too_many_arguments)]
fn keep_tails_whole(groups: &[(SeqSet, Vec<usize>)], chosen: &mut Vec<usize>, per_group: &mut Vec<Vec<usize>>,
                    next: &mut [usize], used: &mut [bool], n_used: &mut usize, n_ubatch: usize, keep_tail: usize) {
    let remaining = |next: &[usize], g: usize| groups[g].1.len() - next[g];
    let mut n_keep = chosen.iter().take_while(|&&g| {
        let r = remaining(next, g);
        r == 0 || r >= keep_tail
    }).count();
    if n_keep == 0 {
        let g = chosen[0];
        if per_group[0].len() + remaining(next, g) <= n_ubatch {
            while remaining(next, g) > 0 {
                let i = groups[g].1[next[g]];
                per_group[0].push(i);
                used[i] = true;
                *n_used += 1;
                next[g] += 1;
            }
        } else {
            while remaining(next, g) < keep_tail && per_group[0].len() > 1 {
                let i = per_group[0].pop().expect("more than one token");
                used[i] = false;
                *n_used -= 1;
                next[g] -= 1;
            }
        }
        n_keep = 1;
    }
    for (k, &g) in chosen.iter().enumerate().skip(n_keep) {
        for &i in &per_group[k] {
            used[i] = false;
            *n_used -= 1;
        }
        next[g] -= per_group[k].len();
    }
    chosen.truncate(n_keep);
    per_group.truncate(n_keep);
}

/// The groups of the next micro-batch: in order of their first unused token, none sharing a
/// sequence with another, at most n_ubatch of them.
fn choose_groups(batch: &Batch, sets: &[SeqSet], groups: &[(SeqSet, Vec<usize>)], used: &[bool], n_ubatch: usize,
                 sequential: bool) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut last_seq = -1;
    for i in (0..batch.len()).filter(|&i| !used[i]) {
        let overlaps = chosen.iter().any(|&g| groups[g].0.iter().any(|s| sets[i].contains(s)));
        let in_order = !sequential || chosen.is_empty() || batch.seq_ids[i][0] == last_seq + 1;
        if overlaps || !in_order {
            continue;
        }
        chosen.push(groups.iter().position(|(s, _)| *s == sets[i]).expect("every token's set is a group"));
        last_seq = batch.seq_ids[i][0];
        // llama.cpp lets one group more than n_ubatch in (a micro-batch of more tokens than
        // the graph was sized for); stop at n_ubatch.
        if chosen.len() == n_ubatch {
            break;
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rows: &[(i32, &[i32])]) -> Batch {
        let mut b = Batch::new(rows.len(), 4).unwrap();
        for (k, (pos, seqs)) in rows.iter().enumerate() {
            b.add(k as u32, *pos, seqs, false).unwrap();
        }
        b
    }

    #[test]
    fn equal_split_takes_as_many_tokens_from_each_sequence() {
        // seq 0: 3 tokens, seq 1: 2 tokens, interleaved
        let b = batch(&[(0, &[0]), (0, &[1]), (1, &[0]), (1, &[1]), (2, &[0])]);
        let plans = split_equal(&b, 16, true, 0).unwrap();
        assert_eq!(plans[0], UBatchPlan { idx: vec![0, 2, 1, 3], n_seqs: 2, n_seq_tokens: 2 });
        assert_eq!(plans[1], UBatchPlan { idx: vec![4], n_seqs: 1, n_seq_tokens: 1 });
    }

    #[test]
    fn sequential_split_takes_only_consecutive_sequence_ids() {
        let b = batch(&[(0, &[0]), (0, &[2])]);
        let plans = split_equal(&b, 16, true, 0).unwrap();
        assert_eq!(plans.len(), 2);
        let plans = split_equal(&b, 16, false, 0).unwrap();
        assert_eq!(plans.len(), 1);
    }

    #[test]
    fn a_long_sequence_is_cut_at_n_ubatch() {
        let rows: Vec<(i32, &[i32])> = (0..10).map(|p| (p, &[0][..])).collect();
        let plans = split_equal(&batch(&rows), 4, true, 0).unwrap();
        assert_eq!(plans.iter().map(|p| p.idx.len()).collect::<Vec<_>>(), vec![4, 4, 2]);
    }

    #[test]
    fn coupled_sequences_are_refused_by_the_sequential_split() {
        assert!(split_equal(&batch(&[(0, &[0, 1])]), 8, true, 0).is_err());
        assert_eq!(split_equal(&batch(&[(0, &[0, 1])]), 8, false, 0).unwrap().len(), 1);
    }

    #[test]
    fn the_last_tokens_of_each_sequence_stay_together() {
        // seq 0: 1 token, seq 1: 6 tokens (a verification batch after a prompt chunk)
        let mut rows: Vec<(i32, &[i32])> = vec![(5, &[0])];
        rows.extend((0..6).map(|p| (p, &[1][..])));
        let b = batch(&rows);
        for plans in [split_equal(&b, 8, false, 4).unwrap(), split_equal(&b, 4, false, 3).unwrap()] {
            let last_of_seq1 = plans.iter().rev().find(|p| p.idx.iter().any(|&i| i >= 1)).unwrap();
            let tail: Vec<usize> = last_of_seq1.idx.iter().copied().filter(|&i| i >= 1).collect();
            assert!(tail.len() >= 3, "{plans:?}");
            assert_eq!(plans.iter().map(|p| p.idx.len()).sum::<usize>(), 7);
        }
    }
}
