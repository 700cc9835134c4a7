//! The random numbers llama.cpp's samplers draw: `std::mt19937` and the way libstdc++
//! turns its 32-bit outputs into floats (`std::generate_canonical`) and into an index
//! (`std::discrete_distribution`). Same seed, same draws, same tokens.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The 32-bit Mersenne twister, bit for bit `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937").field("index", &self.index).finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// Seeds the generator as `std::mt19937(seed)` does.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    /// Re-seeds in place (`rng.seed(seed)`).
    pub fn reseed(&mut self, seed: u32) {
        *self = Mt19937::new(seed);
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.state[i] = self.state[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// `std::uniform_real_distribution<double>(0, 1)` with libstdc++: two draws x0, x1
    /// give (x0 + x1·2^32) / 2^64, kept below 1.
    pub fn uniform_f64(&mut self) -> f64 {
        let x0 = self.next_u32() as f64;
        let x1 = self.next_u32() as f64;
        let sum = x0 + x1 * 4_294_967_296.0;
        let r = sum / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }

    /// `std::uniform_real_distribution<float>(0, 1)` with libstdc++: one draw, converted
    /// to float, divided by 2^32, kept below 1.
    pub fn uniform_f32(&mut self) -> f32 {
        let x0 = self.next_u32() as f32;
        let r = x0 / 4_294_967_296.0f32;
        if r >= 1.0 {
            1.0 - f32::EPSILON / 2.0
        } else {
            r
        }
    }
}

/// llama.cpp's LLAMA_DEFAULT_SEED: a sampler given this seed draws a random one.
pub const DEFAULT_SEED: u32 = 0xFFFF_FFFF;

/// The seed a sampler actually uses (llama.cpp's get_rng_seed): the given one, or for
/// [`DEFAULT_SEED`] a fresh random one (from the standard library's per-process random keys
/// and the clock).
pub fn resolve_seed(seed: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    if seed != DEFAULT_SEED {
        return seed;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish() as u32
}

/// `std::discrete_distribution<int>(weights)(rng)` as libstdc++ computes it: with fewer
/// than two weights it returns 0 without drawing; otherwise it normalizes the weights in
/// double, accumulates them (the last forced to 1) and returns the first index whose
/// cumulative probability is not below one uniform double.
pub fn discrete_sample(weights: &[f32], rng: &mut Mt19937) -> usize {
    if weights.len() < 2 {
        return 0;
    }
    let sum: f64 = weights.iter().fold(0.0f64, |acc, &w| acc + w as f64);
    let mut cumulative = Vec::with_capacity(weights.len());
    let mut running = 0.0f64;
    for &w in weights {
        running += w as f64 / sum;
        cumulative.push(running);
    }
    let last = cumulative.len() - 1;
    cumulative[last] = 1.0;
    let u = rng.uniform_f64();
    // lower_bound: the first position whose value is not less than u
    cumulative.partition_point(|&c| c < u).min(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_standard_10000th_output() {
        // The C++ standard requires the 10000th output of a default-seeded mt19937
        // (seed 5489) to be 4123659995.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn uniform_doubles_combine_two_draws() {
        let mut a = Mt19937::new(42);
        let mut b = Mt19937::new(42);
        let x0 = b.next_u32() as f64;
        let x1 = b.next_u32() as f64;
        assert_eq!(a.uniform_f64(), (x0 + x1 * 2f64.powi(32)) / 2f64.powi(64));
    }

    #[test]
    fn discrete_with_one_weight_does_not_draw() {
        let mut a = Mt19937::new(7);
        let mut b = Mt19937::new(7);
        assert_eq!(discrete_sample(&[0.3], &mut a), 0);
        assert_eq!(a.next_u32(), b.next_u32());
    }

    /// Values printed by g++ 12 / libstdc++ (tests/data/libstdcxx_check.cpp).
    #[test]
    fn matches_libstdcxx_distributions() {
        let mut g = Mt19937::new(1234);
        assert_eq!(g.uniform_f64(), 0.49766366630595166);
        assert_eq!(g.uniform_f32(), 0.622_108_76_f32);
        assert_eq!(g.uniform_f64(), 0.43772773743091115);
        let weights = [0.1f32, 0.2, 0.3, 0.4];
        for expected in [3, 3, 1, 1, 3] {
            assert_eq!(discrete_sample(&weights, &mut g), expected);
        }
        assert_eq!(discrete_sample(&[1.0], &mut g), 0);
        assert_eq!(g.next_u32(), 3_501_098_142);
    }
}
