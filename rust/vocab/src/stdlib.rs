//! Two libstdc++ behaviours llama.cpp's vocabulary loader depends on without meaning to:
//!
//! * the iteration order of `std::unordered_map<std::string, int>` filled token by token
//!   (the loader scans `token_to_id` and keeps the *first* "<|im_end|>"-like text it meets as
//!   EOT, FIM prefix, ...), and
//! * `std::sort`, which is not stable, ordering the special tokens by length (ties between
//!   equally long tokens decide which one claims overlapping text).
//!
//! Both are reproduced exactly (GCC's libstdc++, 64-bit).

/// `std::_Hash_bytes` (MurmurHash2-64 variant) with `std::hash<std::string>`'s seed.
pub fn hash_string(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793u64 << 32) + 0x5bd1_e995;
    const SEED: u64 = 0xc70f_6907;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let len = bytes.len() as u64;
    let mut hash = SEED ^ len.wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let data = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        hash ^= u64::from_le_bytes(word);
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// Bucket counts `_Prime_rehash_policy` goes through when elements are inserted one by one
/// into an empty map (max load factor 1): the count grows when the element count would
/// exceed it.
const BUCKET_COUNTS: &[usize] = &[
    13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061,
    712697, 1447153, 2938679, 5967347,
];

/// The most keys [`unordered_map_order`] handles (the last recorded bucket count).
pub const MAX_MAP_KEYS: usize = BUCKET_COUNTS[BUCKET_COUNTS.len() - 1];

const NIL: u32 = u32::MAX;

/// `hash % count` of every hash, into `out`. A constant divisor is a multiplication instead
/// of a division: the known bucket counts get one each.
fn bucket_indices(hashes: &[u64], count: usize, out: &mut Vec<u32>) {
    out.clear();
    macro_rules! by_constant {
        ($($c:literal)*) => {
            match count {
                $($c => out.extend(hashes.iter().map(|&h| (h % $c) as u32)),)*
                _ => out.extend(hashes.iter().map(|&h| (h % count as u64) as u32)),
            }
        };
    }
    by_constant!(13 29 59 127 257 541 1109 2357 5087 10273 20753 42043 85229 172933 351061 712697 1447153 2938679 5967347);
}

/// Iteration order of an `unordered_map<std::string, int>` into which `keys` were inserted in
/// order (all distinct), as indices into `keys`. `None` beyond [`MAX_MAP_KEYS`].
pub fn unordered_map_order<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<u32>> {
    let hashes: Vec<u64> = keys.into_iter().map(hash_string).collect();
    order_of_hashes(&hashes)
}

/// Which of `candidates` (distinct indices of keys, as for [`unordered_map_order`]) the
/// iteration of that map meets first; `key(i)` is key `i` of `n`. None without candidates or
/// beyond [`MAX_MAP_KEYS`].
///
/// Usually decided from the buckets of the last rehash alone, in one pass over the keys
/// without a table: the groups of nodes made after it come before the others, the latest
/// first, and a group lists the nodes added after it before those it had, the latest first.
/// So a candidate in such a group, or alone with newer nodes in one older group, settles
/// it (vocabularies add their special tokens last: those are such candidates). Otherwise
/// the whole order is simulated.
pub fn first_in_map_order<'a>(n: usize, key: impl Fn(usize) -> &'a [u8], candidates: &[u32]) -> Option<u32> {
    let last = BUCKET_COUNTS.iter().position(|&count| count >= n)?;
    if candidates.len() <= 1 {
        return candidates.first().copied();
    }
    let count = BUCKET_COUNTS[last] as u64;
    // the nodes before this one were in the map at its last rehash
    let rehashed = if last == 0 { 0 } else { BUCKET_COUNTS[last - 1] } as u32;
    let buckets: Vec<u64> = candidates.iter().map(|&c| hash_string(key(c as usize)) % count).collect();
    // per candidate bucket: whether it had nodes at the rehash, and its first node after
    let mut had_nodes = vec![false; candidates.len()];
    let mut first_new = vec![u32::MAX; candidates.len()];
    for node in 0..n as u32 {
        let bucket = hash_string(key(node as usize)) % count;
        for (i, _) in buckets.iter().enumerate().filter(|&(_, &b)| b == bucket) {
            if node < rehashed {
                had_nodes[i] = true;
            } else {
                first_new[i] = first_new[i].min(node);
            }
        }
    }
    let latest_in = |bucket: u64| candidates.iter().zip(&buckets).filter(|&(_, &b)| b == bucket).map(|(&c, _)| c).max();
    let newest_group = (0..candidates.len()).filter(|&i| !had_nodes[i]).max_by_key(|&i| first_new[i]);
    if let Some(i) = newest_group {
        return latest_in(buckets[i]);
    }
    let one_group = buckets.iter().all(|&b| b == buckets[0]);
    if one_group && candidates.iter().any(|&c| c >= rehashed) {
        return latest_in(buckets[0]);
    }
    let order = unordered_map_order((0..n).map(key))?;
    order.into_iter().find(|node| candidates.contains(node))
}

/// [`unordered_map_order`] of keys with these `std::hash` values.
fn order_of_hashes(hashes: &[u64]) -> Option<Vec<u32>> {
    let n = hashes.len();
    if n > MAX_MAP_KEYS {
        return None;
    }
    let mut list = Vec::with_capacity(n);
    let (mut next_list, mut bucket) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut inserted = 0;
    // the map rehashes when one more element would exceed the bucket count
    for &count in BUCKET_COUNTS {
        if inserted == n {
            break;
        }
        let until = n.min(count);
        bucket_indices(&hashes[..until], count, &mut bucket);
        rehash_and_insert(&list, inserted..until, &bucket, count, &mut next_list);
        std::mem::swap(&mut list, &mut next_list);
        inserted = until;
    }
    Some(list)
}

/// The node list of a libstdc++ hashtable after its rehash into `count` buckets
/// (`_M_rehash_aux`, walking the list `old`) and the insertion of the nodes `new`
/// (`_M_insert_bucket_begin`), into `out`; `bucket` holds every node's bucket.
///
/// Both put each node they meet at the front of its bucket's group of nodes (the nodes of a
/// bucket stay together), or at the front of the list when its bucket is still empty. So
/// the groups come in the reverse order of the arrival of their first node, each holding
/// its nodes in the reverse order of arrival: the list is the reverse of the arrivals (the
/// old list, then the new nodes) sorted by group, stably, groups numbered by first arrival.
/// A counting sort, rather than following the links node by node (a cache miss each).
fn rehash_and_insert(old: &[u32], new: std::ops::Range<usize>, bucket: &[u32], count: usize, out: &mut Vec<u32>) {
    let arrivals = || old.iter().copied().chain(new.clone().map(|node| node as u32));
    let mut group_of_bucket = vec![NIL; count];
    // the size of each group, then where its next node goes
    let mut next_at: Vec<u32> = Vec::new();
    for node in arrivals() {
        let group = &mut group_of_bucket[bucket[node as usize] as usize];
        if *group == NIL {
            *group = next_at.len() as u32;
            next_at.push(0);
        }
        next_at[*group as usize] += 1;
    }
    let mut start = 0;
    for at in next_at.iter_mut() {
        let size = *at;
        *at = start;
        start += size;
    }
    out.clear();
    out.resize(old.len() + new.len(), 0);
    for node in arrivals() {
        let at = &mut next_at[group_of_bucket[bucket[node as usize] as usize] as usize];
        out[*at as usize] = node;
        *at += 1;
    }
    out.reverse();
}

/// libstdc++'s `std::sort` (introsort, median-of-three, insertion sort below 16 elements,
/// heap sort past the depth limit). `less(a, b)` is the strict weak order.
pub fn std_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let n = v.len();
    if n == 0 {
        return;
    }
    let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(v, 0, n, depth, less);
    final_insertion_sort(v, 0, n, less);
}

const THRESHOLD: usize = 16;

fn introsort_loop<T: Copy>(v: &mut [T], first: usize, mut last: usize, mut depth: usize, less: &impl Fn(&T, &T) -> bool) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = unguarded_partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

fn move_median_to_first<T: Copy>(v: &mut [T], result: usize, a: usize, b: usize, c: usize, less: &impl Fn(&T, &T) -> bool) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) { b } else if less(&v[a], &v[c]) { c } else { a }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn unguarded_partition_pivot<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    let (mut lo, mut hi) = (first + 1, last);
    let pivot = first;
    loop {
        while less(&v[lo], &v[pivot]) {
            lo += 1;
        }
        hi -= 1;
        while less(&v[pivot], &v[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

fn unguarded_linear_insert<T: Copy>(v: &mut [T], mut last: usize, less: &impl Fn(&T, &T) -> bool) {
    let val = v[last];
    let mut next = last - 1;
    while less(&val, &v[next]) {
        v[last] = v[next];
        last = next;
        next -= 1;
    }
    v[last] = val;
}

fn insertion_sort<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        if less(&v[i], &v[first]) {
            let val = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = val;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

fn final_insertion_sort<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) {
    if last - first > THRESHOLD {
        insertion_sort(v, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, first, last, less);
    }
}

fn adjust_heap<T: Copy>(v: &mut [T], mut hole: usize, len: usize, value: T, less: &impl Fn(&T, &T) -> bool) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // __push_heap
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(&v[parent], &value) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = value;
}

/// `__partial_sort(first, last, last)`: make_heap then sort_heap.
fn heap_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let value = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, value, less);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

        /// The node list and buckets of a libstdc++ hashtable with unique keys, linked node by
    /// node as libstdc++ links them.
    struct Table {
        /// Bucket of each node (for the current bucket count; nodes not inserted yet may be missing).
        bucket: Vec<u32>,
        next: Vec<u32>,
        /// Node *before* each bucket's first node; `before_begin` stands for the list head.
        buckets: Vec<u32>,
        head: u32,
        before_begin: u32,
    }

    impl Table {
        fn next_of(&self, node: u32) -> u32 {
            if node == self.before_begin { self.head } else { self.next[node as usize] }
        }

        fn set_next(&mut self, node: u32, value: u32) {
            if node == self.before_begin { self.head = value } else { self.next[node as usize] = value }
        }

        /// `_M_insert_bucket_begin`.
        fn insert(&mut self, node: u32) {
            let bkt = self.bucket[node as usize] as usize;
            let before = self.buckets[bkt];
            if before != NIL {
                let after = self.next_of(before);
                self.next[node as usize] = after;
                self.set_next(before, node);
            } else {
                let old_head = self.head;
                self.next[node as usize] = old_head;
                self.head = node;
                if old_head != NIL {
                    let b = self.bucket[old_head as usize] as usize;
                    self.buckets[b] = node;
                }
                self.buckets[bkt] = self.before_begin;
            }
        }

        /// `_M_rehash_aux` for unique keys, once `bucket` holds the new count's buckets.
        fn rehash(&mut self, count: usize) {
            self.buckets.clear();
            self.buckets.resize(count, NIL);
            let mut p = self.head;
            self.head = NIL;
            let mut bbegin_bkt = 0;
            while p != NIL {
                let next = self.next[p as usize];
                let bkt = self.bucket[p as usize] as usize;
                if self.buckets[bkt] == NIL {
                    self.next[p as usize] = self.head;
                    self.head = p;
                    self.buckets[bkt] = self.before_begin;
                    if self.next[p as usize] != NIL {
                        self.buckets[bbegin_bkt] = p;
                    }
                    bbegin_bkt = bkt;
                } else {
                    let before = self.buckets[bkt];
                    self.next[p as usize] = self.next_of(before);
                    self.set_next(before, p);
                }
                p = next;
            }
        }
    }

    /// Iteration order of an `unordered_map<std::string, int>` into which `keys` were inserted in
    /// order (all distinct), as indices into `keys`. `None` beyond [`MAX_MAP_KEYS`].
    pub fn unordered_map_order<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<u32>> {
        let hashes: Vec<u64> = keys.into_iter().map(hash_string).collect();
        let n = hashes.len();
        if n > MAX_MAP_KEYS {
            return None;
        }
        Some(order_by_links(&hashes))
    }

    /// `unordered_map_order` by inserting the nodes one by one into linked lists (the map
    /// rehashes when one more element would exceed the bucket count).
    pub(super) fn order_by_links(hashes: &[u64]) -> Vec<u32> {
        let n = hashes.len();
        let mut table = Table { bucket: Vec::with_capacity(n), next: vec![NIL; n], buckets: Vec::new(), head: NIL, before_begin: n as u32 };
        let mut inserted = 0;
        for &count in BUCKET_COUNTS {
            if inserted == n {
                break;
            }
            let until = n.min(count);
            bucket_indices(&hashes[..until], count, &mut table.bucket);
            table.rehash(count);
            for node in inserted..until {
                table.insert(node as u32);
            }
            inserted = until;
        }
        let mut order = Vec::with_capacity(n);
        let mut p = table.head;
        while p != NIL {
            order.push(p);
            p = table.next[p as usize];
        }
        order
    }

    #[test]
    fn first_in_map_order_is_that_of_the_whole_order() {
        let mut state = 7u64;
        let mut random = |below: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize % below
        };
        for n in [2usize, 13, 14, 20, 29, 30, 45, 300, 1109, 1110, 2000] {
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let order = unordered_map_order(keys.iter().map(|k| k.as_bytes())).unwrap();
            for trial in 0..300 {
                let size = 2 + random(4).min(n - 2);
                // half of the sets among the last keys (as special tokens are)
                let from = if trial % 2 == 0 { 0 } else { n - n.min(8) };
                let mut candidates: Vec<u32> = Vec::new();
                while candidates.len() < size.min(n - from) {
                    let c = (from + random(n - from)) as u32;
                    if !candidates.contains(&c) {
                        candidates.push(c);
                    }
                }
                let expected = order.iter().copied().find(|c| candidates.contains(c));
                assert_eq!(first_in_map_order(n, |i| keys[i].as_bytes(), &candidates), expected, "{n} keys, {candidates:?}");
            }
        }
        assert_eq!(first_in_map_order(3, |_| b"".as_slice(), &[]), None);
        assert_eq!(first_in_map_order(3, |_| b"".as_slice(), &[2]), Some(2));
    }

    #[test]
    fn grouped_order_is_the_linked_order() {
        let mut state = 99u64;
        for n in [0usize, 1, 12, 13, 14, 29, 30, 500, 20753, 20754, 50000] {
            let hashes: Vec<u64> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    state
                })
                .collect();
            assert_eq!(order_of_hashes(&hashes).unwrap(), order_by_links(&hashes), "{n} keys");
        }
        // the order of real strings, collisions of buckets included
        let keys: Vec<String> = (0..3000).map(|i| format!("<|tok{i}|>")).collect();
        let hashes: Vec<u64> = keys.iter().map(|k| hash_string(k.as_bytes())).collect();
        assert_eq!(unordered_map_order(keys.iter().map(|k| k.as_bytes())).unwrap(), order_by_links(&hashes));
    }

    #[test]
    fn hash_matches_libstdcxx() {
        // std::hash<std::string>{}(s) printed by a C++ program (g++ 12, x86-64)
        assert_eq!(hash_string(b""), 6142509188972423790);
        assert_eq!(hash_string(b"a"), 4993892634952068459);
        assert_eq!(hash_string(b"<|im_end|>"), 2038672007907099973);
        assert_eq!(hash_string(b"hello world, this is long"), 2369277252547399713);
    }

    #[test]
    fn std_sort_matches_libstdcxx_on_ties() {
        // ids 0..40 with lengths 1,2,3,4,1,2,...; order printed by std::sort (g++ 12)
        let lens: Vec<u32> = (0..40).map(|i| i % 4 + 1).collect();
        let mut ids: Vec<usize> = (0..40).collect();
        std_sort(&mut ids, &|&a: &usize, &b: &usize| lens[a] > lens[b]);
        let expected = [
            39, 27, 19, 15, 31, 23, 11, 35, 7, 3, 34, 10, 6, 38, 14, 30, 22, 18, 2, 26, 1, 25, 29,
            33, 37, 21, 17, 13, 9, 5, 24, 20, 28, 16, 32, 12, 8, 36, 4, 0,
        ];
        assert_eq!(ids, expected);
    }

    #[test]
    fn std_sort_sorts() {
        let mut state = 12345u64;
        for n in [0usize, 1, 5, 16, 17, 100, 1000] {
            let mut v: Vec<(u32, usize)> = (0..n)
                .map(|i| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 60) as u32, i)
                })
                .collect();
            std_sort(&mut v, &|a: &(u32, usize), b: &(u32, usize)| a.0 > b.0);
            assert!(v.windows(2).all(|w| w[0].0 >= w[1].0));
        }
    }
}
