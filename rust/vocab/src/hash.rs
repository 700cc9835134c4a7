//! Hashing for the vocabulary's tables: a small fast hasher for byte strings and integer keys
//! (FxHash's multiply-rotate scheme) behind `FastMap`, and [`IdIndex`], the open-addressing
//! index of ids that finds token texts kept in one buffer. The maps hold vocabulary data
//! only; their iteration order is never observed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash-style hasher.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

/// The last 1 to 7 bytes of a string as one word, without a variable-length copy (a call to
/// `memcpy` per hash otherwise): overlapping loads from both ends, which together see every
/// byte. Strings of one length give distinct words; the callers mix the length in.
#[inline]
fn tail_word(rest: &[u8]) -> u64 {
    let n = rest.len();
    match n {
        0 => 0,
        1..=3 => rest[0] as u64 | (rest[n / 2] as u64) << 8 | (rest[n - 1] as u64) << 16,
        _ => {
            let head = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let tail = u32::from_le_bytes([rest[n - 4], rest[n - 3], rest[n - 2], rest[n - 1]]);
            head as u64 | (tail as u64) << 32
        }
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            self.add(tail_word(rest) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) { self.add(i as u64) }
    #[inline]
    fn write_u32(&mut self, i: u32) { self.add(i as u64) }
    #[inline]
    fn write_u64(&mut self, i: u64) { self.add(i) }
    #[inline]
    fn write_usize(&mut self, i: usize) { self.add(i as u64) }
    /// The multiply leaves the low bits depending on the low input bits only, and hashbrown
    /// picks buckets by the low bits: rotate the well-mixed high bits down (as rustc-hash 2).
    #[inline]
    fn finish(&self) -> u64 { self.hash.rotate_left(26) }
}

/// HashMap with [`FxHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// An empty [`FastMap`] with room for `n` entries.
pub fn fast_map<K, V>(n: usize) -> FastMap<K, V> {
    FastMap::with_capacity_and_hasher(n, BuildHasherDefault::default())
}

/// A 64-bit hash of a byte string for [`IdIndex`]: FxHash's word loop and the length, then
/// MurmurHash3's finalizer so that both halves are well mixed (the low half picks the slot, the high half
/// is the tag).
#[inline]
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(bytes);
    hasher.write_usize(bytes.len());
    let mut h = hasher.hash;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// An open-addressing set of ids whose keys are stored elsewhere (the caller says whether an
/// id's key is the one looked for). It lets a table of strings keep each string once, in one
/// buffer, instead of as a separately allocated map key.
///
/// Each slot holds the high half of the key's hash (a tag that rules out almost every wrong
/// candidate without reading its key) and the id; linear probing from a slot picked by the
/// low half, at most 2/3 full.
#[derive(Debug, Clone)]
pub struct IdIndex {
    slots: Vec<u64>,
    len: usize,
}

const EMPTY: u64 = u64::MAX;
const TAG: u64 = 0xffff_ffff_0000_0000;

/// What [`IdIndex::find_or_slot`] found.
pub enum Probe {
    /// The id whose key matched.
    Found(u32),
    /// The free slot where the key would go.
    Vacant(usize),
}

impl Default for IdIndex {
    fn default() -> Self { IdIndex::with_capacity(0) }
}

impl IdIndex {
    /// An index with room for `n` ids before it grows.
    pub fn with_capacity(n: usize) -> IdIndex {
        IdIndex { slots: vec![EMPTY; n + n / 2 + 8], len: 0 }
    }

    /// Number of ids held.
    pub fn len(&self) -> usize { self.len }

    /// The slot probing starts at (the low half of the hash scaled to the slot count).
    fn home(&self, hash: u64) -> usize { (((hash & 0xffff_ffff) * self.slots.len() as u64) >> 32) as usize }

    /// The id whose key `is_key` accepts, among those stored under `hash`; else the free slot
    /// where it belongs.
    #[inline]
    pub fn find_or_slot(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Probe {
        let tag = hash & TAG;
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return Probe::Vacant(i);
            }
            if slot & TAG == tag && is_key(slot as u32) {
                return Probe::Found(slot as u32);
            }
            i = if i + 1 == self.slots.len() { 0 } else { i + 1 };
        }
    }

    /// The id whose key `is_key` accepts, among those stored under `hash`.
    #[inline]
    pub fn find(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Option<u32> {
        match self.find_or_slot(hash, is_key) {
            Probe::Found(id) => Some(id),
            Probe::Vacant(_) => None,
        }
    }

    /// Starts fetching the slot where probing for `hash` begins into the cache, so that a
    /// later [`IdIndex::find_or_slot`] for it does not wait for memory.
    #[inline]
    pub fn prefetch(&self, hash: u64) { prefetch(&self.slots[self.home(hash)]) }

    /// Whether one more id fits without passing the maximum load.
    pub fn has_room(&self) -> bool { (self.len + 1) * 3 <= self.slots.len() * 2 }

    /// Stores `id` in the free `slot` given by [`IdIndex::find_or_slot`] for `hash`, which
    /// must have been called since the last change and found no key (and [`IdIndex::has_room`]).
    pub fn fill(&mut self, slot: usize, hash: u64, id: u32) {
        debug_assert_eq!(self.slots[slot], EMPTY);
        self.slots[slot] = (hash & TAG) | id as u64;
        self.len += 1;
    }

    /// The ids held, in slot order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().filter(|&&s| s != EMPTY).map(|&s| s as u32)
    }

    /// A copy with room for `n` ids holding the same ids (`hash_of` gives each id's hash again:
    /// slots keep only half of it).
    pub fn regrown(&self, n: usize, hash_of: impl Fn(u32) -> u64) -> IdIndex {
        let mut grown = IdIndex::with_capacity(n.max(self.len));
        for id in self.ids() {
            let hash = hash_of(id);
            let mut i = grown.home(hash);
            while grown.slots[i] != EMPTY {
                i = if i + 1 == grown.slots.len() { 0 } else { i + 1 };
            }
            grown.fill(i, hash, id);
        }
        grown
    }
}

/// Asks the CPU to bring the cache line holding `value` closer (a hint; nothing elsewhere
/// than on x86-64). Lets a loop overlap the memory waits of its next iterations.
#[inline(always)]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault; the address is a
    // valid reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(value as *const T as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
