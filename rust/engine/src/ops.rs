//! The element-wise and row operations the architectures share, written to follow ggml's
//! arithmetic where it decides agreement (sums of squares in f64, RoPE angles accumulated
//! by repeated multiplication in f32).

use half::f16;

/// y = x / sqrt(mean(x²) + eps) * w, row by row (ggml_rms_norm then a multiply).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for_row_scales(x, n, eps, |r, scale| {
        for ((o, &v), &g) in out[r * n..(r + 1) * n].iter_mut().zip(&x[r * n..(r + 1) * n]).zip(w) {
            *o = v * scale * g;
        }
    });
}

/// In-place RMSNorm without weights (ggml_rms_norm alone: Llama 4's L2 norm of Q and K) of
/// each row of `n` values of `x`.
pub fn rms_norm_unweighted_inplace(x: &mut [f32], n: usize, eps: f32) {
    let mut scales = [0f32; ROWS_AT_ONCE];
    for chunk in x.chunks_mut((ROWS_AT_ONCE * n).max(1)) {
        let rows = chunk.len() / n.max(1);
        for_row_scales(chunk, n, eps, |r, scale| scales[r] = scale);
        for (xr, &scale) in chunk.chunks_exact_mut(n.max(1)).zip(&scales[..rows]) {
            xr.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// In-place RMSNorm of each row of `x` (rows of w.len()).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    let mut scales = [0f32; ROWS_AT_ONCE];
    for chunk in x.chunks_mut((ROWS_AT_ONCE * n).max(1)) {
        let rows = chunk.len() / n.max(1);
        for_row_scales(chunk, n, eps, |r, scale| scales[r] = scale);
        for (xr, &scale) in chunk.chunks_exact_mut(n).zip(&scales[..rows]) {
            for (v, &g) in xr.iter_mut().zip(w) {
                *v = *v * scale * g;
            }
        }
    }
}

/// In-place RMSNorm without weights (ggml_rms_norm alone) of each row of n values.
pub fn rms_norm_plain_inplace(x: &mut [f32], n: usize, eps: f32) {
    let mut scales = [0f32; ROWS_AT_ONCE];
    for chunk in x.chunks_mut((ROWS_AT_ONCE * n).max(1)) {
        let rows = chunk.len() / n.max(1);
        for_row_scales(chunk, n, eps, |r, scale| scales[r] = scale);
        for (xr, &scale) in chunk.chunks_exact_mut(n).zip(&scales[..rows]) {
            xr.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// Each row of `row` values divided by its L2 norm, as llama.cpp's build_gdn_l2_norm computes
/// it: ggml_rms_norm with epsilon eps/row (x / sqrt(mean(x²) + eps/row)), then ggml_scale by
/// 1/sqrt(row) — two products, in that order (the gated delta net's queries and keys).
pub fn l2_norm_rows(x: &mut [f32], row: usize, eps: f32) {
    let n = row as f32;
    let inv_sqrt_n = 1.0 / n.sqrt();
    let mut scales = [0f32; ROWS_AT_ONCE];
    for chunk in x.chunks_mut((ROWS_AT_ONCE * row).max(1)) {
        let rows = chunk.len() / row.max(1);
        for_row_scales(chunk, row, eps / n, |r, scale| scales[r] = scale);
        for (xr, &scale) in chunk.chunks_exact_mut(row).zip(&scales[..rows]) {
            for v in xr.iter_mut() {
                *v = *v * scale * inv_sqrt_n;
            }
        }
    }
}

/// Rows whose sums of squares are accumulated together.
const ROWS_AT_ONCE: usize = 8;

/// Calls f(row, 1 / sqrt(mean(row²) + eps)) for each row of n elements of x.
///
/// ggml squares in f32 and sums in ggml_float (f64), element by element, before taking the
/// mean: one chain of dependent f64 adds per row. Eight rows' chains advance together (each
/// still in its row's order, so the same bits), which hides the adds' latency: the norms of
/// an eight-token step ran one add every three cycles, all on the main thread.
fn for_row_scales(x: &[f32], n: usize, eps: f32, mut f: impl FnMut(usize, f32)) {
    let scale = |sum: f64| {
        let mean = (sum / n as f64) as f32;
        1.0 / (mean + eps).sqrt()
    };
    let rows = if n == 0 { 0 } else { x.len() / n };
    let mut r0 = 0;
    while r0 + ROWS_AT_ONCE <= rows {
        let row = |r: usize| x[(r0 + r) * n..(r0 + r + 1) * n].iter();
        let mut sums = [0f64; ROWS_AT_ONCE];
        // Zipped iterators: indexing kept a bounds check on every load.
        let columns = row(0).zip(row(1)).zip(row(2)).zip(row(3)).zip(row(4)).zip(row(5)).zip(row(6)).zip(row(7));
        for (((((((&a, &b), &c), &d), &e), &f), &g), &h) in columns {
            for (s, v) in sums.iter_mut().zip([a, b, c, d, e, f, g, h]) {
                *s += (v * v) as f64;
            }
        }
        for (r, &s) in sums.iter().enumerate() {
            f(r0 + r, scale(s));
        }
        r0 += ROWS_AT_ONCE;
    }
    for r in r0..rows {
        let sum = x[r * n..(r + 1) * n].iter().fold(0f64, |s, &v| s + (v * v) as f64);
        f(r, scale(sum));
    }
}

/// RoPE parameters of a model (ggml_rope_ext's arguments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions of each head (n_rot).
    pub n_dims: usize,
    /// NEOX mode rotates (i, i + n_dims/2) pairs; normal mode rotates (2i, 2i+1).
    pub neox: bool,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: usize,
}

impl RopeParams {
    /// The YaRN correction dims (ggml_rope_yarn_corr_dims).
    fn corr_dims(&self) -> [f32; 2] {
        let dim = |n_rot: f32| -> f32 {
            self.n_dims as f32 * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = dim(self.beta_fast).floor().max(0.0);
        let end = dim(self.beta_slow).ceil().min(self.n_dims as f32 - 1.0);
        [start, end]
    }

    /// cos and sin of each rotated pair at position `pos`, as ggml_rope_cache_init builds them:
    /// `cache` receives [cos0, sin0, cos1, sin1, ...] for n_dims/2 pairs. `factors` (a model's
    /// rope_freqs or LongRoPE factors, n_dims/2 of them) divide each pair's angle.
    pub fn fill_cache(&self, pos: f32, factors: Option<&[f32]>, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let corr = self.corr_dims();
        let mut theta = pos;
        for i in 0..self.n_dims / 2 {
            let factor = factors.map_or(1.0, |f| f[i]);
            let (c, s) = self.yarn(theta / factor, corr, 2 * i);
            cache[2 * i] = c;
            cache[2 * i + 1] = s;
            theta *= theta_scale;
        }
    }

    /// cos and sin of each rotated pair of a token of M-RoPE (ggml_rope_multi's cache,
    /// ggml_mrope_cache_init): `pos` holds its time, height, width and extra positions, and
    /// each pair turns by the angle of the axis `mrope` gives it, all four angles accumulated
    /// by the same repeated multiplications as `fill_cache`'s. (A text token's positions are
    /// (p, p, p, 0): the pairs of the first three axes turn as in `fill_cache`, those of the
    /// extra axis by the angle of position 0.)
    pub fn fill_cache_mrope(&self, pos: [i32; 4], mrope: &Mrope, factors: Option<&[f32]>, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let corr = self.corr_dims();
        let mut theta = pos.map(|p| p as f32);
        for i in 0..self.n_dims / 2 {
            let factor = factors.map_or(1.0, |f| f[i]);
            let (c, s) = self.yarn(theta[mrope.axis_of(i)] / factor, corr, 2 * i);
            cache[2 * i] = c;
            cache[2 * i + 1] = s;
            theta.iter_mut().for_each(|t| *t *= theta_scale);
        }
    }

    fn yarn(&self, theta_extrap: f32, corr: [f32; 2], i0: usize) -> (f32, f32) {
        let theta_interp = self.freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            let y = (i0 as f32 / 2.0 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * self.ext_factor;
            theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }
}

/// Multi-axis RoPE (ggml's rope modes MROPE, Qwen2-VL, and IMROPE, Qwen3-VL and Qwen3.5):
/// each token has four positions (time, height, width, extra) and `rope.dimension_sections`
/// say which rotated pairs turn with which, the NEOX way (pairs (i, i + n_dims/2)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mrope {
    /// Pairs per axis (time, height, width, extra); pair i is in sector i mod their sum.
    pub sections: [usize; 4],
    /// The sections interleave (IMROPE: t, h, w, t, h, w ...) instead of following each other.
    pub interleaved: bool,
}

impl Mrope {
    /// The axis (0 time, 1 height, 2 width, 3 extra) whose position turns rotated pair `i`.
    pub fn axis_of(&self, i: usize) -> usize {
        let s = self.sections;
        let sector = i % s.iter().sum::<usize>().max(1);
        if self.interleaved {
            match sector % 3 {
                1 if sector < 3 * s[1] => 1,
                2 if sector < 3 * s[2] => 2,
                0 if sector < 3 * s[0] => 0,
                _ => 3,
            }
        } else if sector < s[0] {
            0
        } else if sector < s[0] + s[1] {
            1
        } else if sector < s[0] + s[1] + s[2] {
            2
        } else {
            3
        }
    }
}

/// x = H·x for each block of `n` values of x, H the orthonormal Walsh-Hadamard matrix of order
/// n (a power of two) in Sylvester's order, as ggml's CPU computes it for a product hinted
/// GGML_HINT_SRC0_IS_HADAMARD (ggml_compute_forward_fwht): each value times 1/sqrt(n) first,
/// then the butterflies (u + v, u - v) of spans 1, 2, 4, ... n/2. H·H = I: the same call
/// rotates back.
pub fn hadamard_blocks(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len() % n == 0);
    let scale = 1.0 / (n as f32).sqrt();
    for block in x.chunks_exact_mut(n) {
        block.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for pair in block.chunks_exact_mut(2 * len) {
                let (lo, hi) = pair.split_at_mut(len);
                for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                    (*u, *v) = (*u + *v, *u - *v);
                }
            }
            len *= 2;
        }
    }
}

/// Rotates one head vector in place with a cache from `fill_cache`.
pub fn rope_apply(x: &mut [f32], cache: &[f32], p: &RopeParams) {
    let half = p.n_dims / 2;
    if p.neox {
        for i in 0..half {
            let (c, s) = (cache[2 * i], cache[2 * i + 1]);
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * c - b * s;
            x[i + half] = a * s + b * c;
        }
    } else {
        for i in 0..half {
            let (c, s) = (cache[2 * i], cache[2 * i + 1]);
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    }
}

/// x = silu(x) * y (SwiGLU) over rows of `row` elements, as ggml computes it on this CPU
/// (`ferrollama_tensor::glu::swiglu`).
pub fn swiglu(x: &mut [f32], y: &[f32], row: usize) {
    ferrollama_tensor::glu::swiglu(x, y, row);
}

/// x = swiglu_oai(x, y) (gpt-oss's experts, ggml_swiglu_oai with alpha 1.702 and limit 7):
/// x clamped above at 7, y clamped to ±7, x · sigmoid(1.702 x) · (y + 1).
pub fn swiglu_oai(x: &mut [f32], y: &[f32], _row: usize) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (a, &b) in x.iter_mut().zip(y) {
        let g = a.min(LIMIT);
        let u = b.clamp(-LIMIT, LIMIT);
        *a = g / (1.0 + (ALPHA * -g).exp()) * (u + 1.0);
    }
}

/// x = relu(x)² (ggml_relu then ggml_sqr: Nemotron-H's squared ReLU).
pub fn relu_sqr_inplace(x: &mut [f32]) {
    for v in x {
        let r = if *v > 0.0 { *v } else { 0.0 };
        *v = r * r;
    }
}

/// x = 1 / (1 + exp(-x)) elementwise (ggml_sigmoid).
pub fn sigmoid_inplace(x: &mut [f32]) {
    for v in x {
        *v = 1.0 / (1.0 + (-*v).exp());
    }
}

/// The tanh approximation of GELU (ggml_gelu_f32).
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, rounded to f16 (ggml's table, GGML_GELU_FP16), kept as f32 so
/// that a lookup needs no conversion.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_f32(gelu_f32(f16::from_bits(b).to_f32())).to_f32()).collect())
}

/// x = gelu(x) (ggml_vec_gelu_f32 with GGML_GELU_FP16: x rounded to f16 and looked up in the
/// f16 GELU table, the exact limits outside [-10, 10]).
pub fn gelu_inplace(x: &mut [f32]) {
    let table = gelu_table();
    for v in x.iter_mut() {
        *v = if *v <= -10.0 {
            0.0
        } else if *v >= 10.0 {
            *v
        } else {
            table[f16::from_f32(*v).to_bits() as usize]
        };
    }
}

/// x = gelu_erf(x) = x/2 · (1 + erf(x/√2)) (ggml_vec_gelu_erf_f32: computed, no f16 table).
pub fn gelu_erf_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        let xi = *v as f64;
        *v = (0.5 * xi * (1.0 + erf(xi * std::f64::consts::FRAC_1_SQRT_2))) as f32;
    }
}

/// erf in f64 through erfc's Chebyshev fit (Numerical Recipes' erfcc: relative error under
/// 1.2e-7, about an f32 rounding, which is what glibc's erff gives ggml).
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223
        + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

/// x = gelu_quick(x) = x * sigmoid(1.702 x) (ggml_vec_gelu_quick_f32 with
/// GGML_GELU_QUICK_FP16: every value rounded to f16 and looked up in the f16 table; CLIP's
/// encoders use it).
pub fn gelu_quick_inplace(x: &mut [f32]) {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let gelu_quick = |v: f32| v * (1.0 / (1.0 + (-1.702f32 * v).exp()));
        (0..=u16::MAX).map(|b| f16::from_f32(gelu_quick(f16::from_bits(b).to_f32())).to_f32()).collect()
    });
    for v in x.iter_mut() {
        *v = table[f16::from_f32(*v).to_bits() as usize];
    }
}

/// LayerNorm of each row of x in place (ggml_norm: mean, then the variance of the centred
/// values, both summed in f64), then times w plus b.
pub fn layer_norm_inplace(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    layer_norm_rows(x, w, Some(b), eps);
}

/// LayerNorm of each row of x in place, times w, plus b where there is one (ggml_norm, then
/// ggml_mul and ggml_add).
pub fn layer_norm_rows(x: &mut [f32], w: &[f32], b: Option<&[f32]>, eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let mean = (row.iter().fold(0f64, |s, &v| s + v as f64) / n as f64) as f32;
        let mut sum2 = 0f64;
        for v in row.iter_mut() {
            *v -= mean;
            sum2 += (*v * *v) as f64;
        }
        let scale = 1.0 / ((sum2 / n as f64) as f32 + eps).sqrt();
        match b {
            Some(b) => row.iter_mut().zip(w).zip(b).for_each(|((v, &g), &c)| *v = *v * scale * g + c),
            None => row.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * scale * g),
        }
    }
}

/// Values a GeGLU pass rounds to f16 at once.
const GEGLU_CHUNK: usize = 256;

/// x = gelu(x) * y (GeGLU) as ggml_vec_geglu_f32 computes it: x rounded to f16 and looked up in
/// the f16 GELU table, with the exact limits outside [-10, 10]. The rounding runs a chunk
/// at a time through the cache's f16 conversion (F16C where the CPU has it: one call per
/// value through `half` was 2 % of Gemma's 8-sequence decode step).
pub fn geglu(x: &mut [f32], y: &[f32], _row: usize) {
    let table = gelu_table();
    let to_f16 = ferrollama_tensor::traits(ferrollama_tensor::GgmlType::F16).and_then(|t| t.from_f32).expect("f16 converts from f32");
    let mut halves = [0u8; 2 * GEGLU_CHUNK];
    for (xs, ys) in x.chunks_mut(GEGLU_CHUNK).zip(y.chunks(GEGLU_CHUNK)) {
        to_f16(xs, &mut halves[..2 * xs.len()]);
        for ((a, &b), h) in xs.iter_mut().zip(ys).zip(halves.chunks_exact(2)) {
            let v = *a;
            *a = if v <= -10.0 {
                0.0
            } else if v >= 10.0 {
                v * b
            } else {
                table[u16::from_le_bytes([h[0], h[1]]) as usize] * b
            };
        }
    }
}

/// x *= k, element-wise.
pub fn scale_inplace(x: &mut [f32], k: f32) {
    for v in x.iter_mut() {
        *v *= k;
    }
}

/// a += b, element-wise.
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Adds a bias vector to each row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_inplace(row, bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_within_an_f32_rounding() {
        // erf's values (Abramowitz & Stegun, table 7.1)
        for (x, want) in [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (2.0, 0.995_322_265_0), (-1.5, -0.966_105_146_5)] {
            assert!((erf(x) - want).abs() < 1.2e-7, "erf({x}) = {} for {want}", erf(x));
        }
        let mut g = [1.0f32, -1.0, 0.0];
        gelu_erf_inplace(&mut g);
        assert!((g[0] - 0.841_344_75).abs() < 1e-7 && (g[1] + 0.158_655_25).abs() < 1e-7 && g[2] == 0.0, "{g:?}");
    }

    fn rope16() -> RopeParams {
        RopeParams { n_dims: 16, neox: true, freq_base: 10000.0, freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0,
                     beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 4096 }
    }

    const IMROPE: fn([usize; 4]) -> Mrope = |sections| Mrope { sections, interleaved: true };

    /// Text positions (p, p, p, 0) under interleaved M-RoPE: the pairs of the time, height and
    /// width sections rotate as NEOX RoPE does; a pair outside them (sector 1 of [1, 0, 1, 0],
    /// whose height section is empty) keeps the angle of position 0.
    #[test]
    fn mrope_of_text_positions_is_neox_rope_in_the_sections() {
        let p = rope16();
        let mut neox = vec![0.0; 16];
        p.fill_cache(7.0, None, &mut neox);
        let mut full = vec![0.0; 16];
        p.fill_cache_mrope([7, 7, 7, 0], &IMROPE([3, 3, 2, 0]), None, &mut full);
        assert_eq!(full, neox);
        let mut gaps = vec![0.0; 16];
        p.fill_cache_mrope([7, 7, 7, 0], &IMROPE([1, 0, 1, 0]), None, &mut gaps);
        for i in 0..8 {
            let want = if i % 2 == 1 { [1.0, 0.0] } else { [neox[2 * i], neox[2 * i + 1]] };
            assert_eq!([gaps[2 * i], gaps[2 * i + 1]], want, "pair {i}");
        }
    }

    /// The axis of each pair as ggml_mrope_cache_init picks it: Qwen2-VL's consecutive
    /// sections, Qwen3-VL's interleaved ones (t h w t h w ..., the extra axis for the sectors
    /// past a section's share: 61 and 62 of [24, 20, 20, 0]), sectors wrapping past their sum.
    #[test]
    fn mrope_axes_follow_the_sections() {
        let mrope = Mrope { sections: [2, 3, 3, 1], interleaved: false };
        let axes: Vec<usize> = (0..12).map(|i| mrope.axis_of(i)).collect();
        assert_eq!(axes, [0, 0, 1, 1, 1, 2, 2, 2, 3, 0, 0, 1]);
        let qwen3vl = IMROPE([24, 20, 20, 0]);
        let axes: Vec<usize> = [0, 1, 2, 3, 58, 59, 60, 61, 62, 63].iter().map(|&i| qwen3vl.axis_of(i)).collect();
        assert_eq!(axes, [0, 1, 2, 0, 1, 2, 0, 3, 3, 0]);
    }

    /// Each pair of an image token turns by its axis' position as `fill_cache` would turn it
    /// at that position (the same chain of products), bit for bit.
    #[test]
    fn mrope_pairs_turn_with_their_axis_position() {
        let p = rope16();
        let pos = [5, 9, 12, 3];
        for mrope in [Mrope { sections: [2, 3, 2, 1], interleaved: false }, IMROPE([3, 2, 2, 1])] {
            let mut got = vec![0.0; 16];
            p.fill_cache_mrope(pos, &mrope, None, &mut got);
            for i in 0..8 {
                let mut one_axis = vec![0.0; 16];
                p.fill_cache(pos[mrope.axis_of(i)] as f32, None, &mut one_axis);
                assert_eq!(got[2 * i..2 * i + 2], one_axis[2 * i..2 * i + 2], "{mrope:?} pair {i}");
            }
        }
    }

    /// The L2 norm of build_gdn_l2_norm: x / sqrt(mean(x²) + eps/n) / sqrt(n), rows apart.
    #[test]
    fn l2_norm_rows_divides_each_row_by_its_norm() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        l2_norm_rows(&mut x, 4, 1e-6);
        let want = [0.6, 0.8, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{x:?}");
        }
        let mut zeros = vec![0.0; 4];
        l2_norm_rows(&mut zeros, 4, 1e-6);
        assert_eq!(zeros, [0.0; 4]);
    }

    /// The chunked GeGLU equals ggml's element formula (round to f16, f16 table, f32
    /// product) bit for bit, across the ±10 limits, f16 ties and a chunk's tail.
    #[test]
    fn geglu_matches_the_element_formula() {
        let gelu_f16 = |v: f32| f16::from_f32(gelu_f32(f16::from_f32(v).to_f32())).to_f32();
        let mut x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.0237).collect();
        x.extend([-10.0, 10.0, -9.999, 9.999, 1.0 + 1.0 / 2048.0, -0.0, 0.0, 1e-6, 30.0, -30.0]);
        let y: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let want: Vec<f32> = x.iter().zip(&y).map(|(&v, &b)| if v <= -10.0 { 0.0 } else if v >= 10.0 { v * b } else { gelu_f16(v) * b }).collect();
        let mut got = x.clone();
        let n = got.len();
        geglu(&mut got, &y, n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "x = {}: {g} vs {w}", x[i]);
        }
    }

    fn plain(n_dims: usize, neox: bool) -> RopeParams {
        RopeParams { n_dims, neox, freq_base: 10000.0, freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0,
            beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 4096 }
    }

    #[test]
    fn rope_by_a_then_b_equals_rope_by_a_plus_b() {
        // The K-shift relies on rotations composing.
        for neox in [false, true] {
            let p = plain(8, neox);
            let x0: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
            let (mut c, mut x1, mut x2) = (vec![0.0; 8], x0.clone(), x0.clone());
            p.fill_cache(3.0, None, &mut c); rope_apply(&mut x1, &c, &p);
            p.fill_cache(4.0, None, &mut c); rope_apply(&mut x1, &c, &p);
            p.fill_cache(7.0, None, &mut c); rope_apply(&mut x2, &c, &p);
            for (a, b) in x1.iter().zip(&x2) { assert!((a - b).abs() < 1e-5, "{a} vs {b}"); }
        }
    }

    #[test]
    fn rms_norm_sums_each_row_in_order_whatever_the_row_count() {
        // Rows of values whose f64 sum depends on the order of the adds; every count of rows
        // around the eight summed together, in and out of place, equals the one-row sum.
        let n = 37;
        let x: Vec<f32> = (0..19 * n).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * if i % 5 == 0 { 1e3 } else { 1e-3 }).collect();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.01).collect();
        let one_row = |r: &[f32]| -> Vec<f32> {
            let mut sum = 0f64;
            for &v in r {
                sum += (v * v) as f64;
            }
            let scale = 1.0 / (((sum / n as f64) as f32) + 1e-6).sqrt();
            r.iter().zip(&w).map(|(&v, &g)| v * scale * g).collect()
        };
        for rows in [1, 7, 8, 9, 16, 19] {
            let want: Vec<f32> = x[..rows * n].chunks(n).flat_map(one_row).collect();
            let mut out = vec![0f32; rows * n];
            rms_norm(&x[..rows * n], &w, 1e-6, &mut out);
            let mut inplace = x[..rows * n].to_vec();
            rms_norm_inplace(&mut inplace, &w, 1e-6);
            for (i, ((a, b), c)) in out.iter().zip(&inplace).zip(&want).enumerate() {
                assert_eq!((a.to_bits(), b.to_bits()), (c.to_bits(), c.to_bits()), "{rows} rows, element {i}");
            }
        }
    }

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = [0.0; 4];
        rms_norm(&x, &[1.0, 1.0, 2.0, 1.0], 0.0, &mut y);
        let r = (30.0f32 / 4.0).sqrt();
        assert!((y[2] - 6.0 / r).abs() < 1e-6);
    }

    /// A LayerNorm without bias is the LayerNorm with a zero bias; each row on its own.
    #[test]
    fn layer_norm_without_bias_is_a_zero_bias() {
        let x: Vec<f32> = (0..8).map(|i| (i * i) as f32 * 0.3 - 1.0).collect();
        let w = [0.5, 1.0, 1.5, 2.0];
        let (mut a, mut b) = (x.clone(), x.clone());
        layer_norm_rows(&mut a, &w, None, 1e-5);
        layer_norm_inplace(&mut b, &w, &[0.0; 4], 1e-5);
        assert_eq!(a, b);
        let mean: f32 = a[4..].iter().zip(&w).map(|(v, g)| v / g).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6);
    }
}
