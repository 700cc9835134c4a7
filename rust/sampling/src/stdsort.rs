//! libstdc++'s `std::sort` (introsort) and `std::partial_sort` (heap select), step for step.
//!
//! Neither is stable: among equal keys the order they leave depends on every swap they
//! make. llama.cpp's records compare candidate order, so ties (for example the -inf
//! logits that `temp 0` leaves) must come out as libstdc++ leaves them; only a replica of
//! its algorithms does that. The few bounds checks added to the "unguarded" loops never
//! fire for a comparator that is a strict weak order; they keep NaN keys from reading
//! outside the slice.

/// Below this many elements introsort leaves a range to the final insertion sort.
const INSERTION_THRESHOLD: usize = 16;

/// `std::sort(v.begin(), v.end(), less)`.
pub fn sort<T: Copy, F: FnMut(&T, &T) -> bool>(v: &mut [T], less: &mut F) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let depth_limit = 2 * floor_log2(n);
    introsort_loop(v, 0, n, depth_limit, less);
    final_insertion_sort(v, 0, n, less);
}

/// `std::partial_sort(v.begin(), v.begin() + middle, v.end(), less)`: the first `middle`
/// elements become the smallest ones (by `less`), in order; the rest is left in heap-select order.
pub fn partial_sort<T: Copy, F: FnMut(&T, &T) -> bool>(v: &mut [T], middle: usize, less: &mut F) {
    let last = v.len();
    let middle = middle.min(last);
    heap_select(v, 0, middle, last, less);
    sort_heap(v, 0, middle, less);
}

fn floor_log2(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn introsort_loop<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    mut last: usize,
    mut depth_limit: usize,
    less: &mut F,
) {
    while last - first > INSERTION_THRESHOLD {
        if depth_limit == 0 {
            // heap sort of the whole range
            heap_select(v, first, last, last, less);
            sort_heap(v, first, last, less);
            return;
        }
        depth_limit -= 1;
        let cut = unguarded_partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth_limit, less);
        last = cut;
    }
}

fn unguarded_partition_pivot<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &mut F,
) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    unguarded_partition(v, first + 1, last, first, less)
}

fn move_median_to_first<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &mut F,
) {
    let chosen = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, chosen);
}

fn unguarded_partition<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    less: &mut F,
) -> usize {
    let end = last;
    loop {
        while first < end && less(&v[first], &v[pivot]) {
            first += 1;
        }
        last -= 1;
        while last > pivot && less(&v[pivot], &v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &mut F,
) {
    if last - first > INSERTION_THRESHOLD {
        insertion_sort(v, first, first + INSERTION_THRESHOLD, less);
        for i in first + INSERTION_THRESHOLD..last {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, first, last, less);
    }
}

fn insertion_sort<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &mut F,
) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        if less(&v[i], &v[first]) {
            let value = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = value;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

fn unguarded_linear_insert<T: Copy, F: FnMut(&T, &T) -> bool>(v: &mut [T], mut last: usize, less: &mut F) {
    let value = v[last];
    while last > 0 && less(&value, &v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = value;
}

fn heap_select<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    middle: usize,
    last: usize,
    less: &mut F,
) {
    make_heap(v, first, middle, less);
    if first >= v.len() {
        return;
    }
    for i in middle..last {
        if less(&v[i], &v[first]) {
            pop_heap(v, first, middle, i, less);
        }
    }
}

fn make_heap<T: Copy, F: FnMut(&T, &T) -> bool>(v: &mut [T], first: usize, last: usize, less: &mut F) {
    let len = (last - first) as isize;
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = v[first + parent as usize];
        adjust_heap(v, first, parent, len, value, less);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

fn sort_heap<T: Copy, F: FnMut(&T, &T) -> bool>(v: &mut [T], first: usize, mut last: usize, less: &mut F) {
    while last - first > 1 {
        last -= 1;
        pop_heap(v, first, last, last, less);
    }
}

fn pop_heap<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    result: usize,
    less: &mut F,
) {
    let value = v[result];
    v[result] = v[first];
    adjust_heap(v, first, 0, (last - first) as isize, value, less);
}

/// Signed arithmetic on purpose: libstdc++ works in `ptrdiff_t`, and `(len - 1) / 2`
/// for len 0 must be 0 (C++ division truncates toward zero), not a huge unsigned value.
fn adjust_heap<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    mut hole: isize,
    len: isize,
    value: T,
    less: &mut F,
) {
    let top = hole;
    let mut second = hole;
    let at = |i: isize| first + i as usize;
    while second < (len - 1) / 2 {
        second = 2 * (second + 1);
        if less(&v[at(second)], &v[at(second - 1)]) {
            second -= 1;
        }
        v[at(hole)] = v[at(second)];
        hole = second;
    }
    if (len & 1) == 0 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        v[at(hole)] = v[at(second - 1)];
        hole = second - 1;
    }
    push_heap(v, first, hole, top, value, less);
}

fn push_heap<T: Copy, F: FnMut(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    mut hole: isize,
    top: isize,
    value: T,
    less: &mut F,
) {
    let at = |i: isize| first + i as usize;
    let mut parent = (hole - 1) / 2;
    while hole > top && less(&v[at(parent)], &value) {
        v[at(hole)] = v[at(parent)];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    v[at(hole)] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn sort_orders_any_input() {
        let mut seed = 1;
        for n in [0, 1, 2, 5, 16, 17, 40, 100, 1000, 5000] {
            let mut v: Vec<u64> = (0..n).map(|_| lcg(&mut seed) % 50).collect();
            let mut expected = v.clone();
            expected.sort();
            sort(&mut v, &mut |a, b| a < b);
            assert_eq!(v, expected, "n = {n}");
        }
    }

    #[test]
    fn partial_sort_puts_the_smallest_first_in_order() {
        let mut seed = 3;
        for (n, k) in [(10, 3), (100, 40), (1000, 128), (7, 7), (5, 1)] {
            let mut v: Vec<u64> = (0..n).map(|_| lcg(&mut seed) % 1000).collect();
            let mut expected = v.clone();
            expected.sort();
            partial_sort(&mut v, k, &mut |a, b| a < b);
            assert_eq!(&v[..k], &expected[..k]);
            let mut rest = v[k..].to_vec();
            rest.sort();
            assert_eq!(rest, expected[k..].to_vec());
        }
    }

    #[derive(Clone, Copy)]
    struct Pair {
        key: u32,
        id: u32,
    }

    fn fnv(v: &[Pair]) -> u64 {
        let mut h: u64 = 1469598103934665603;
        for p in v {
            h ^= p.id as u64;
            h = h.wrapping_mul(1099511628211);
        }
        h
    }

    /// tests/data/libstdcxx_check.txt holds what g++ 12 / libstdc++ leaves (hashed) for
    /// tie-heavy inputs; libstdcxx_check.cpp beside it wrote it.
    #[test]
    fn ties_come_out_as_libstdcxx_leaves_them() {
        let text = include_str!("../tests/data/libstdcxx_check.txt");
        let mut checked = 0;
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f[0] != "sort" && f[0] != "psort" {
                continue;
            }
            let n: usize = f[1].parse().unwrap();
            let r: u64 = f[2].parse().unwrap();
            let mut seed = n as u64 * 31 + r;
            let v: Vec<Pair> = (0..n).map(|i| Pair { key: (lcg(&mut seed) % r) as u32, id: i as u32 }).collect();
            let mut greater = |a: &Pair, b: &Pair| a.key > b.key;
            if f[0] == "sort" {
                let mut a = v.clone();
                sort(&mut a, &mut greater);
                assert_eq!(fnv(&a).to_string(), f[3], "{line}");
            } else {
                let k: usize = f[3].parse().unwrap();
                let mut b = v.clone();
                partial_sort(&mut b, k, &mut greater);
                assert_eq!(fnv(&b[..k]).to_string(), f[4], "{line}");
                assert_eq!(fnv(&b).to_string(), f[5], "{line}");
            }
            checked += 1;
        }
        assert!(checked > 150);
    }
}
