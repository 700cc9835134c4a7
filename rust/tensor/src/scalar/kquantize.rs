//! Weight quantizers of the k-quants and the IQ4 types: ggml's deterministic reference
//! quantizers (quantize_row_*_ref, and quantize_iq4_* without an importance matrix, which
//! is what `llama-quantize` writes without --imatrix). Float operations are kept in ggml's
//! order so the bytes come out identical.

use super::kquants::{scale_min_k4, IQ4_XS_BYTES, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use super::legacy::{best_index_int8, IQ4_NL_BYTES, KVALUES_IQ4NL, QK};
use crate::util::{f32_to_f16, nearest_int, rd_f16, wr_f16};

const GROUP_MAX_EPS: f32 = 1e-15;

fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// ggml's make_qx_quants with rmse_type 1: weights `qw`, or x² without them.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let weight = |i: usize| qw.map_or(x[i] * x[i], |q| q[i]);
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(i);
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's make_q3_quants with do_rmse (weights x²), for Q3_K.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out[..n].iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// ggml's make_qkx2_quants: scale and (negated) min of an asymmetric group, searched over
/// nstep+1 candidate scales. Returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(nmax: i32, x: &[f32], weights: &[f32], l_out: &mut [u8], rmin: f32, rdelta: f32, nstep: i32, use_mad: bool) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit values: byte l of each 32-byte run holds elements l, l+32, l+64, l+96.
fn pack_2bit(l: &[u8], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

// ---------------------------------------------------------------- Q2_K

pub fn quantize_q2_k(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2_K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: Vec<f32> = xs.iter().map(|v| v.abs()).collect();
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                y[j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_f16(y, 80, max_scale / Q4SCALE);
        } else {
            y[..16].fill(0);
            wr_f16(y, 80, 0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                y[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            wr_f16(y, 82, max_min / Q4SCALE);
        } else {
            wr_f16(y, 82, 0.0);
        }
        q2k_levels_and_pack(x, y, &mut l);
    }
}

/// Q2_K's final step once its scales and super-scales are written: each value's level under
/// its group's decoded scale and min, packed 2 bits each.
pub(super) fn q2k_levels_and_pack(x: &[f32], y: &mut [u8], l: &mut [u8; QK_K]) {
    let (d_all, dmin_all) = (rd_f16(y, 80), rd_f16(y, 82));
    for j in 0..16 {
        let d = d_all * (y[j] & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (y[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(l, &mut y[16..80]);
}

// ---------------------------------------------------------------- Q3_K

pub fn quantize_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3_K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let packed = &mut y[96..108];
        packed.fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml stores nearest_int in an int8_t before clamping.
                let lv = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    packed[j] = (lv & 0x0f) as u8;
                } else {
                    packed[j - 8] |= ((lv & 0x0f) << 4) as u8;
                }
                packed[j % 4 + 8] |= ((lv >> 4) << (2 * (j / 4))) as u8;
            }
            wr_f16(y, 108, 1.0 / iscale);
        } else {
            wr_f16(y, 108, 0.0);
        }
        q3k_levels_and_pack(x, y, &mut l);
    }
}

/// Q3_K's final step once its 6-bit scales and super-scale are written: each value's level
/// under its group's decoded scale, the high bits into hmask and the low 2 bits packed.
pub(super) fn q3k_levels_and_pack(x: &[f32], y: &mut [u8], l: &mut [i8; QK_K]) {
    {
        let d_all = rd_f16(y, 108);
        for j in 0..16 {
            let packed = &y[96..108];
            let low = if j < 8 { packed[j] & 0x0f } else { packed[j - 8] >> 4 };
            let sc = (low | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
            let d = d_all * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        let (hmask, rest) = y.split_at_mut(32);
        hmask.fill(0);
        let mut lu = [0u8; QK_K];
        let (mut m, mut hm) = (0usize, 1u8);
        for j in 0..QK_K {
            let mut v = l[j] as u8;
            if v > 3 {
                hmask[m] |= hm;
                v -= 4;
            }
            lu[j] = v;
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        pack_2bit(&lu, &mut rest[0..64]);
    }
}

// ---------------------------------------------------------------- Q4_K / Q5_K

/// Packs eight 6-bit scales and mins into the 12 scale bytes of Q4_K/Q5_K.
pub(super) fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8], s: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared part of the Q4_K and Q5_K reference quantizers: per-32 scales and mins
/// (make_qkx2_quants), their 6-bit codes, the f16 super-scales, then the final levels.
fn quantize_kx_scales(x: &[f32], y: &mut [u8], nmax: i32, rmin: f32, nstep: i32, l: &mut [u8; QK_K]) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: Vec<f32> = xs.iter().map(|v| av_x + v.abs()).collect();
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // ggml assigns nearest_int to a uint8_t before taking the min with 63.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scales_k4(&ls, &lm, &mut y[4..16]);
    wr_f16(y, 0, max_scale / 63.0);
    wr_f16(y, 2, max_min / 63.0);
    kx_levels(x, y, nmax, l);
}

/// Q4_K/Q5_K's levels once the scales, mins and super-scales are written.
pub(super) fn kx_levels(x: &[f32], y: &[u8], nmax: i32, l: &mut [u8; QK_K]) {
    let (d_all, dmin_all) = (rd_f16(y, 0), rd_f16(y, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &y[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub fn quantize_q4_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)) {
        let mut l = [0u8; QK_K];
        quantize_kx_scales(x, y, 15, -1.0, 20, &mut l);
        pack_q4k(&l, y);
    }
}

/// Q4_K's nibbles: byte k of each 32-byte run holds elements k and k+32 of a 64-run.
pub(super) fn pack_q4k(l: &[u8; QK_K], y: &mut [u8]) {
    let q = &mut y[16..144];
    for j in 0..4 {
        for k in 0..32 {
            q[32 * j + k] = l[64 * j + k] | (l[64 * j + k + 32] << 4);
        }
    }
}

pub fn quantize_q5_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)) {
        let mut l = [0u8; QK_K];
        quantize_kx_scales(x, y, 31, -0.5, 15, &mut l);
        pack_q5k(&l, y);
    }
}

/// Q5_K's low nibbles and high bits.
pub(super) fn pack_q5k(l: &[u8; QK_K], y: &mut [u8]) {
    {
        let (head, ql) = y.split_at_mut(48);
        let qh = &mut head[16..48];
        qh.fill(0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for n in (0..QK_K).step_by(64) {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[n / 2 + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

// ---------------------------------------------------------------- Q6_K

pub fn quantize_q6_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], None);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        q6k_finish(x, y, &scales, max_scale, max_abs_scale, &mut l);
    }
}

/// Q6_K's final step from its 16 group scales: the 8-bit scales, the super-scale, each
/// value's level, packed (an all-zero block when every scale is ~0).
pub(super) fn q6k_finish(x: &[f32], y: &mut [u8], scales: &[f32; 16], max_scale: f32, max_abs_scale: f32, l: &mut [i8; QK_K]) {
    {
        if max_abs_scale < GROUP_MAX_EPS {
            y.fill(0);
            return;
        }
        let iscale = -128.0 / max_scale;
        wr_f16(y, 208, 1.0 / iscale);
        for ib in 0..16 {
            y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let d_all = rd_f16(y, 208);
        for j in 0..16 {
            let d = d_all * y[192 + j] as i8 as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let (ql, rest) = y.split_at_mut(128);
        let qh = &mut rest[..64];
        for (half, j) in (0..QK_K).step_by(128).enumerate() {
            for k in 0..32 {
                let q = |o: usize| l[j + k + o] as u8;
                ql[64 * half + k] = (q(0) & 0x0f) | ((q(64) & 0x0f) << 4);
                ql[64 * half + k + 32] = (q(32) & 0x0f) | ((q(96) & 0x0f) << 4);
                qh[32 * half + k] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
    }
}

// ---------------------------------------------------------------- IQ4_NL / IQ4_XS

/// ggml's quantize_row_iq4_nl_impl for one super-block of `x.len()` elements in blocks of
/// 32: weights qw·sqrt(σ² + x²) with importance weights `qw`, x² without. Writes d, the packed nibbles and, for IQ4_XS
/// (more than one block), the 6-bit block scales. Returns the f16 bits of d.
pub(super) fn quantize_iq4_impl(x: &[f32], q4: &mut [u8], scales_h: &mut u16, scales_l: &mut [u8], ntry: i32,
                                qw: Option<&[f32]>) -> u16 {
    let values = &KVALUES_IQ4NL;
    let mut sigma2 = 0.0f32;
    for v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / x.len() as f32;
    let nblocks = x.len() / 32;
    let mut l = vec![0u8; x.len()];
    let mut scales = vec![0.0f32; nblocks];
    let dh;
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        let weight: Vec<f32> = match qw {
            Some(q) => xb.iter().zip(&q[32 * ib..32 * ib + 32]).map(|(v, w)| w * (sigma2 + v * v).sqrt()).collect(),
            None => xb.iter().map(|v| v * v).collect(),
        };
        let (amax, max) = signed_absmax(xb);
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            lb.fill(0);
            continue;
        }
        let mut d = if ntry > 0 { -max / values[0] as f32 } else { max / values[0] as f32 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..32 {
            let li = best_index_int8(values, id * xb[j]);
            lb[j] = li as u8;
            let q = values[li] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j])] as f32;
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    if nblocks > 1 {
        *scales_h = 0;
        let d = -max_scale / 32.0;
        dh = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nblocks {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]) as u8;
            }
            let lv = (li + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = lv & 0x0f;
            } else {
                scales_l[ib / 2] |= (lv & 0x0f) << 4;
            }
            *scales_h |= ((lv >> 4) as u16) << (2 * (ib % 8));
        }
    } else {
        dh = f32_to_f16(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for j in 0..x.len() {
                l[j] = best_index_int8(values, id * x[j]) as u8;
            }
        }
    }
    for i in 0..x.len() / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
    dh
}

/// `llama-quantize`'s IQ4_NL (quantize_iq4_nl, 7 trial scales each side).
pub fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(IQ4_NL_BYTES)) {
        let (mut unused_h, mut unused_l) = (0u16, [0u8; 1]);
        let dh = quantize_iq4_impl(x, &mut y[2..18], &mut unused_h, &mut unused_l, 7, None);
        y[0..2].copy_from_slice(&dh.to_le_bytes());
    }
}

/// quantize_row_iq4_nl_ref: each block's scale from its largest value alone, without the
/// search over nearby scales (ntry -1) that quantize_iq4_nl makes. ggml's from_float of IQ4_NL
/// (what a KV cache of that type stores) is this one.
pub fn quantize_iq4_nl_row(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(IQ4_NL_BYTES)) {
        let (mut unused_h, mut unused_l) = (0u16, [0u8; 1]);
        let dh = quantize_iq4_impl(x, &mut y[2..18], &mut unused_h, &mut unused_l, -1, None);
        y[0..2].copy_from_slice(&dh.to_le_bytes());
    }
}

/// quantize_iq4_xs without importance weights (what quantize_row_iq4_xs_ref does).
pub fn quantize_iq4_xs(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(IQ4_XS_BYTES)) {
        let mut scales_h = 0u16;
        let mut scales_l = [0u8; 4];
        let dh = quantize_iq4_impl(x, &mut y[8..136], &mut scales_h, &mut scales_l, 7, None);
        y[0..2].copy_from_slice(&dh.to_le_bytes());
        y[2..4].copy_from_slice(&scales_h.to_le_bytes());
        y[4..8].copy_from_slice(&scales_l);
    }
}
