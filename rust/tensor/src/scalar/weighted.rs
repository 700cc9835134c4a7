//! Quantizers under an importance matrix: ggml's quantize_row_*_impl with `quant_weights`
//! (what llama-quantize writes with --imatrix) for the k-quants, the legacy types, IQ4 and the
//! i-quants: IQ2 (`iq2quantize`), IQ3 (`iq3quantize`) and IQ1 (`iq1quantize`).
//! Each takes one row and the row's importance weights (one per column: the imatrix's mean
//! squared activations); the float operations are in ggml's order, so the bytes are ggml's.

use super::{iq1quantize, iq2quantize, iq3quantize};
use super::kquantize::{kx_levels, make_qx_quants, pack_q4k, pack_q5k, pack_scales_k4, q2k_levels_and_pack,
                       q3k_levels_and_pack, q6k_finish, quantize_iq4_impl};
use super::kquants::{IQ4_XS_BYTES, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use super::legacy::{IQ4_NL_BYTES, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, QK};
use crate::util::{nearest_int, wr_f16};
use crate::GgmlType;

const GROUP_MAX_EPS: f32 = 1e-15;

/// Quantizes one row under importance weights `qw` (as many as the row has values); None for
/// a type that takes no importance weights here.
pub fn quantize_row_weighted(ty: GgmlType, x: &[f32], qw: &[f32], dst: &mut [u8]) -> Option<()> {
    debug_assert_eq!(x.len(), qw.len());
    match ty {
        GgmlType::Q2_K => per_super_block(x, qw, dst, Q2_K_BYTES, q2_k_block),
        GgmlType::Q3_K => per_super_block(x, qw, dst, Q3_K_BYTES, q3_k_block),
        GgmlType::Q4_K => per_super_block(x, qw, dst, Q4_K_BYTES, |x, qw, y| kx_block(x, qw, y, 15)),
        GgmlType::Q5_K => per_super_block(x, qw, dst, Q5_K_BYTES, |x, qw, y| kx_block(x, qw, y, 31)),
        GgmlType::Q6_K => per_super_block(x, qw, dst, Q6_K_BYTES, q6_k_block),
        GgmlType::Q4_0 => legacy_row(x, qw, dst, Q4_0_BYTES, q4_0_block),
        GgmlType::Q4_1 => legacy_row(x, qw, dst, Q4_1_BYTES, |xb, w, b| q41_block(xb, w, b, 15)),
        GgmlType::Q5_0 => legacy_row(x, qw, dst, Q5_0_BYTES, q5_0_block),
        GgmlType::Q5_1 => legacy_row(x, qw, dst, Q5_1_BYTES, |xb, w, b| q41_block(xb, w, b, 31)),
        GgmlType::IQ4_NL => iq4_row(x, qw, dst, QK, IQ4_NL_BYTES, 2),
        GgmlType::IQ4_XS => iq4_row(x, qw, dst, QK_K, IQ4_XS_BYTES, 8),
        GgmlType::IQ2_XXS => iq2quantize::quantize_iq2_xxs(x, qw, dst),
        GgmlType::IQ2_XS => iq2quantize::quantize_iq2_xs(x, qw, dst),
        GgmlType::IQ2_S => iq2quantize::quantize_iq2_s_weighted(x, Some(qw), dst),
        GgmlType::IQ3_XXS => iq3quantize::quantize_iq3_xxs_weighted(x, Some(qw), dst),
        GgmlType::IQ3_S => iq3quantize::quantize_iq3_s_weighted(x, Some(qw), dst),
        GgmlType::IQ1_S => iq1quantize::quantize_iq1_s_weighted(x, qw, dst),
        GgmlType::IQ1_M => iq1quantize::quantize_iq1_m_weighted(x, Some(qw), dst),
        // ggml's quantize_q1_0 and quantize_q2_0 take the weights and leave them unused.
        GgmlType::Q1_0 => super::q1q2::quantize_q1_0(x, dst),
        GgmlType::Q2_0 => super::q1q2::quantize_q2_0(x, dst),
        _ => return None,
    }
    Some(())
}

fn per_super_block(x: &[f32], qw: &[f32], dst: &mut [u8], bytes: usize, block: impl Fn(&[f32], &[f32], &mut [u8])) {
    for ((xb, wb), y) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(dst.chunks_exact_mut(bytes)) {
        block(xb, wb, y);
    }
}

/// ggml's make_qkx3_quants: scale and (negated) min of an asymmetric group under `weights`,
/// searched over nstep+1 candidate scales. Returns (scale, -min).
fn make_qkx3_quants(nmax: i32, x: &[f32], weights: &[f32], l_out: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
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
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_mad += weights[i] * (diff * diff);
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
            let mut mad = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                mad += weights[i] * (diff * diff);
            }
            if mad < best_mad {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's make_qp_quants: a positive scale for the non-negative `x` (the group scales or mins
/// of a super-block) under weights `qw`, levels 0..=nmax in `l_out` (stored as ggml's uint8_t).
pub(super) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        sumlx += qw[i] * x[i] * l as f32;
        suml2 += qw[i] * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let (w, li) = (qw[i], l_out[i] as f32);
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
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
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

pub(super) fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for v in x {
        s += v * v;
    }
    s
}

/// The group's weights: qw · sqrt(σ² + x²).
fn group_weights(x: &[f32], qw: &[f32], sigma2: f32, out: &mut [f32]) -> f32 {
    let mut sum = 0.0f32;
    for ((o, v), w) in out.iter_mut().zip(x).zip(qw) {
        *o = w * (sigma2 + v * v).sqrt();
    }
    for o in out.iter() {
        sum += o;
    }
    sum
}

/// quantize_row_q2_K_impl for one super-block.
fn q2_k_block(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut weight = [0.0f32; 16];
    for j in 0..16 {
        let g = 16 * j..16 * j + 16;
        sw[j] = group_weights(&x[g.clone()], &qw[g.clone()], sigma2, &mut weight);
        (scales[j], mins[j]) = make_qkx3_quants(3, &x[g.clone()], &weight, &mut l[g], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    wr_f16(y, 80, dm);
    wr_f16(y, 82, mm);
    for j in 0..16 {
        y[j] = ls[j] | (lm[j] << 4);
    }
    q2k_levels_and_pack(x, y, &mut l);
}

/// quantize_row_q3_K_impl for one super-block.
fn q3_k_block(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut weight = [0.0f32; 16];
    for j in 0..16 {
        let g = 16 * j..16 * j + 16;
        sw[j] = group_weights(&x[g.clone()], &qw[g.clone()], sigma2, &mut weight);
        scales[j] = make_qx_quants(4, &x[g.clone()], &mut l[g], Some(&weight));
    }
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
    let packed = &mut y[96..108];
    packed.fill(0);
    for (j, &lv) in ls.iter().enumerate() {
        let lv = lv as i32;
        if j < 8 {
            packed[j] = (lv & 0xf) as u8;
        } else {
            packed[j - 8] |= ((lv & 0xf) << 4) as u8;
        }
        packed[j % 4 + 8] |= ((lv >> 4) << (2 * (j / 4))) as u8;
    }
    wr_f16(y, 108, d_block);
    q3k_levels_and_pack(x, y, &mut l);
}

/// quantize_row_q4_K_impl / quantize_row_q5_K_impl (nmax 15 / 31) for one super-block.
fn kx_block(x: &[f32], qw: &[f32], y: &mut [u8], nmax: i32) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut weight = [0.0f32; 32];
    for j in 0..8 {
        let g = 32 * j..32 * j + 32;
        sw[j] = group_weights(&x[g.clone()], &qw[g.clone()], sigma2, &mut weight);
        (scales[j], mins[j]) = make_qkx3_quants(nmax, &x[g.clone()], &weight, &mut l[g], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if nmax == 31 {
        // Q5_K's impl clamps the codes to 63 (Q4_K's does not).
        ls.iter_mut().chain(lm.iter_mut()).for_each(|v| *v = (*v).min(63));
    }
    y[4..16].fill(0);
    pack_scales_k4(&ls, &lm, &mut y[4..16]);
    wr_f16(y, 0, d_block);
    wr_f16(y, 2, m_block);
    kx_levels(x, y, nmax, &mut l);
    if nmax == 15 { pack_q4k(&l, y) } else { pack_q5k(&l, y) }
}

/// quantize_row_q6_K_impl for one super-block: the groups weighted by the imatrix alone.
fn q6_k_block(x: &[f32], qw: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for (ib, slot) in scales.iter_mut().enumerate() {
        let g = 16 * ib..16 * ib + 16;
        let scale = make_qx_quants(32, &x[g.clone()], &mut l[g.clone()], Some(&qw[g]));
        *slot = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    q6k_finish(x, y, &scales, max_scale, max_abs_scale, &mut l);
}

/// The legacy types' impls: σ² over the whole row, then block by block.
fn legacy_row(x: &[f32], qw: &[f32], dst: &mut [u8], bytes: usize, block: impl Fn(&[f32], &[f32], &mut [u8])) {
    let sigma2 = sum_squares(x) / x.len() as f32;
    let mut weight = [0.0f32; QK];
    for ((xb, wb), b) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)).zip(dst.chunks_exact_mut(bytes)) {
        group_weights(xb, wb, sigma2, &mut weight);
        block(xb, &weight, b);
    }
}

fn q4_0_block(xb: &[f32], weight: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK];
    let d = make_qx_quants(8, xb, &mut l, Some(weight));
    wr_f16(b, 0, d);
    for j in 0..16 {
        b[2 + j] = (l[j] | (l[j + 16] << 4)) as u8;
    }
}

fn q5_0_block(xb: &[f32], weight: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK];
    let d = make_qx_quants(16, xb, &mut l, Some(weight));
    wr_f16(b, 0, d);
    let qh = pack_q5_levels(|j| l[j] as u8, &mut b[6..22]);
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// Q4_1 (nmax 15) and Q5_1 (nmax 31): make_qkx3_quants' scale and min.
fn q41_block(xb: &[f32], weight: &[f32], b: &mut [u8], nmax: i32) {
    let mut l = [0u8; QK];
    let (d, neg_min) = make_qkx3_quants(nmax, xb, weight, &mut l, -0.9, 0.05, 36);
    wr_f16(b, 0, d);
    wr_f16(b, 2, -neg_min);
    if nmax == 15 {
        for j in 0..16 {
            b[4 + j] = l[j] | (l[j + 16] << 4);
        }
    } else {
        let qh = pack_q5_levels(|j| l[j], &mut b[8..24]);
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

fn pack_q5_levels(level: impl Fn(usize) -> u8, qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for (j, q) in qs[..16].iter_mut().enumerate() {
        let (xi0, xi1) = (level(j), level(j + 16));
        *q = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
        qh |= (((xi0 & 0x10) >> 4) as u32) << j;
        qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
    }
    qh
}

/// quantize_iq4_nl / quantize_iq4_xs with importance weights: each super-block of `sbs`
/// values (32 or 256) with its slice of the weights; `head` bytes before the nibbles.
fn iq4_row(x: &[f32], qw: &[f32], dst: &mut [u8], sbs: usize, bytes: usize, head: usize) {
    for ((xb, wb), y) in x.chunks_exact(sbs).zip(qw.chunks_exact(sbs)).zip(dst.chunks_exact_mut(bytes)) {
        let mut scales_h = 0u16;
        let mut scales_l = [0u8; 4];
        let q4 = &mut y[head..];
        q4.fill(0);
        let dh = quantize_iq4_impl(xb, q4, &mut scales_h, &mut scales_l, 7, Some(wb));
        y[0..2].copy_from_slice(&dh.to_le_bytes());
        if sbs == QK_K {
            y[2..4].copy_from_slice(&scales_h.to_le_bytes());
            y[4..8].copy_from_slice(&scales_l);
        }
    }
}
