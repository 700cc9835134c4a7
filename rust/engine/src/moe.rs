//! The mixture-of-experts feed-forward block (llama.cpp's build_moe_ffn): a router picks
//! `n_expert_used` experts per token; the tokens of a micro-batch are grouped by expert, so
//! that each expert's matrices are read once per micro-batch (ggml's mul_mat_id) through the
//! same products as dense matrices; each token's expert outputs are weighted and summed in
//! the order of its choices, as ggml adds them. A shared expert (a dense FFN every token goes
//! through, optionally behind a per-token sigmoid gate) is added to that sum.

use ferrollama_tensor::{matmul, Threads};

use crate::actstats::{ActivationStats, Matrix};
use crate::arch::blocks::{lora_mm, note, rows_on_threads, FfnAct};
use crate::graph::Workspace;
use crate::hparams::{HParams, MoeGating};
use crate::lora::{add_terms, LayerLora, LoraScratch, Proj};
use crate::model::{Experts, SharedExpert};
use crate::ops::{add_inplace, scale_inplace, sigmoid_inplace};

/// The buffers of the block, sized for a micro-batch of n_ubatch tokens.
#[derive(Default)]
pub struct MoeScratch {
    /// The router's logits (then probabilities): n tokens × n_expert.
    logits: Vec<f32>,
    /// One token's probabilities plus the selection bias, which choose its experts.
    biased: Vec<f32>,
    /// One token's score of each expert group, and the groups it keeps (expert groups only).
    group_scores: Vec<f32>,
    groups_kept: Vec<u32>,
    /// Each token's chosen experts and their weights, in order of choice: n × n_expert_used.
    chosen: Vec<u32>,
    weights: Vec<f32>,
    /// The (token, choice) pairs routed to the expert being computed.
    routed: Vec<(u32, u32)>,
    /// Their inputs, gate and up activations, and down outputs.
    x: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// Each (token, choice)'s weighted expert output: n × n_expert_used × n_embd.
    outs: Vec<f32>,
    /// The shared expert's gate and up activations (n × n_ff_shexp) and output (n × n_embd).
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    shared_out: Vec<f32>,
    /// Gemma 4's router input (n × n_embd; sized on first use, empty for the other models).
    router_x: Vec<f32>,
}

impl MoeScratch {
    pub fn new(hp: &HParams, n_ubatch: usize) -> MoeScratch {
        let (d, ne, k, ff) = (hp.n_embd, hp.n_expert, hp.n_expert_used, hp.n_ff_exp);
        if ne == 0 {
            return MoeScratch::default();
        }
        MoeScratch {
            logits: vec![0.0; n_ubatch * ne],
            chosen: vec![0; n_ubatch * k],
            weights: vec![0.0; n_ubatch * k],
            routed: Vec::with_capacity(n_ubatch * k),
            x: vec![0.0; n_ubatch * d],
            gate: vec![0.0; n_ubatch * ff],
            up: vec![0.0; n_ubatch * ff],
            down: vec![0.0; n_ubatch * d],
            outs: vec![0.0; n_ubatch * k * d],
            biased: vec![0.0; ne],
            group_scores: vec![0.0; hp.n_expert_groups],
            groups_kept: vec![0; hp.n_group_used],
            shared_gate: vec![0.0; n_ubatch * hp.n_ff_shexp],
            shared_up: vec![0.0; n_ubatch * hp.n_ff_shexp],
            shared_out: if hp.n_ff_shexp > 0 { vec![0.0; n_ubatch * d] } else { Vec::new() },
            router_x: Vec::new(),
        }
    }
}

/// ws.o = the experts' FFN of ws.h for n tokens (plus the shared expert's, where the layer
/// has one). `act`: the experts' activation, gated or of the up projection alone, as the
/// experts have a gate or not; the shared expert has the same.
pub fn moe_ffn(hp: &HParams, ex: &Experts, ws: &mut Workspace, n: usize, act: FfnAct, lora: LayerLora, threads: &Threads) {
    let (d, ne, k) = (hp.n_embd, hp.n_expert, hp.n_expert_used);
    if let Some(sh) = &ex.shared {
        shared_expert(sh, ws, n, d, act, threads);
    }
    let s = &mut ws.moe;
    let router_in: &[f32] = match &ex.router_in_scale {
        Some(scale) => {
            let x = crate::recurrent::sized(&mut s.router_x, n * d);
            router_input(&ws.x[..n * d], scale, hp.rms_eps, x);
            x
        }
        None => &ws.h[..n * d],
    };
    crate::arch::blocks::lora_mm(&ex.router, None, lora.terms(Proj::Router), router_in, n, &mut s.logits[..n * ne], &mut ws.mm, &mut ws.lora, threads);
    note(&mut ws.stats, Matrix::FfnGateInp, router_in, n);
    for t in 0..n {
        let logits = &mut s.logits[t * ne..(t + 1) * ne];
        if let Some(b) = &ex.router_b {
            add_inplace(logits, b);
        }
        let choice = Choice { chosen: &mut s.chosen[t * k..(t + 1) * k], weights: &mut s.weights[t * k..(t + 1) * k] };
        let groups = Groups { n: hp.n_expert_groups, scores: &mut s.group_scores, kept: &mut s.groups_kept };
        route(hp.moe_gating, logits, ex.probs_b.as_deref(), &mut s.biased, groups, choice);
        if hp.expert_weights_scale != 0.0 && hp.expert_weights_scale != 1.0 {
            s.weights[t * k..(t + 1) * k].iter_mut().for_each(|w| *w *= hp.expert_weights_scale);
        }
    }
    let weigh_input = hp.moe_gating == MoeGating::SigmoidOfTopLogits;
    for e in 0..ne {
        let ctx = ExpertCtx { mm: &mut ws.mm, lora_scratch: &mut ws.lora, lora, threads };
        run_expert(ex, e, &ws.h, &mut ws.moe, ctx, ExpertShape { d, k, n, weigh_input }, act);
        if let Some(stats) = ws.stats.as_deref_mut() {
            note_expert(stats, &ws.moe, e, ne, k, d, ex.up[e].rows, ex.gate.is_some());
        }
    }
    let s = &ws.moe;
    for t in 0..n {
        let o = &mut ws.o[t * d..(t + 1) * d];
        o.copy_from_slice(&s.outs[t * k * d..(t * k + 1) * d]);
        for c in 1..k {
            add_inplace(o, &s.outs[(t * k + c) * d..(t * k + c + 1) * d]);
        }
    }
    if ex.shared.is_some() {
        add_inplace(&mut ws.o[..n * d], &s.shared_out[..n * d]);
    }
}

/// Gemma 4's router input (llama_model_gemma4's graph): each row of the residual stream `x`
/// RMS-normalized without weights, times 1/sqrt(n_embd), times `scale`, one product at a time
/// as ggml rounds them.
fn router_input(x: &[f32], scale: &[f32], eps: f32, out: &mut [f32]) {
    let d = scale.len();
    out.copy_from_slice(x);
    crate::ops::rms_norm_plain_inplace(out, d, eps);
    let inv_sqrt_d = 1.0 / (d as f32).sqrt();
    for row in out.chunks_exact_mut(d) {
        for (v, &g) in row.iter_mut().zip(scale) {
            *v = (*v * inv_sqrt_d) * g;
        }
    }
}

/// ws.moe.shared_out = the shared expert's FFN of ws.h (llama.cpp's build_ffn of the
/// `_shexp` matrices, each product's second scale after it), times sigmoid(gate_inp · x)
/// per token where it has that gate. (Adapters of the shared expert are refused when loaded.)
fn shared_expert(sh: &SharedExpert, ws: &mut Workspace, n: usize, d: usize, act: FfnAct, threads: &Threads) {
    let s = &mut ws.moe;
    let ff = sh.up.rows;
    let (up, gate) = (&mut s.shared_up[..n * ff], &mut s.shared_gate[..n * ff]);
    lora_mm(&sh.up, sh.up_s, &[], &ws.h, n, up, &mut ws.mm, &mut ws.lora, threads);
    let hidden: &[f32] = match (act, &sh.gate) {
        (FfnAct::Gated(act), Some(g)) => {
            lora_mm(g, sh.gate_s, &[], &ws.h, n, gate, &mut ws.mm, &mut ws.lora, threads);
            rows_on_threads(act, gate, up, ff, threads);
            gate
        }
        (FfnAct::Ungated(act), None) => {
            act(up);
            up
        }
        _ => unreachable!("an architecture loads a shared expert's gate exactly when its activation is gated"),
    };
    let out = &mut s.shared_out[..n * d];
    lora_mm(&sh.down, sh.down_s, &[], hidden, n, out, &mut ws.mm, &mut ws.lora, threads);
    if let Some(stats) = ws.stats.as_deref_mut() {
        let x = &ws.h[..n * d];
        if sh.gate.is_some() {
            stats.record(Matrix::FfnGateShexp, x, n);
        }
        stats.record(Matrix::FfnUpShexp, x, n);
        stats.record(Matrix::FfnDownShexp, &hidden[..n * ff], n);
        if sh.gate_inp.is_some() {
            stats.record(Matrix::FfnGateInpShexp, x, n);
        }
    }
    if let Some(g) = &sh.gate_inp {
        for (row, x) in out.chunks_exact_mut(d).zip(ws.h.chunks_exact(d)) {
            let mut z = [x.iter().zip(g).map(|(a, b)| a * b).sum::<f32>()];
            sigmoid_inplace(&mut z);
            scale_inplace(row, z[0]);
        }
    }
}

/// Expert e over the tokens that chose it: gathers their inputs, runs the gated FFN on them
/// at once, and writes each weighted output to its (token, choice) slot.
/// What each expert's products share: the product scratch and the adapters' terms.
struct ExpertCtx<'a> {
    mm: &'a mut ferrollama_tensor::MatmulScratch,
    lora_scratch: &'a mut LoraScratch,
    lora: LayerLora<'a>,
    threads: &'a Threads,
}

impl ExpertCtx<'_> {
    /// out = W_e·x for m tokens, times expert e's second scale where the experts have them,
    /// plus the adapters' terms of expert e (build_lora_mm_id).
    #[allow(clippy::too_many_arguments)]
    fn product(&mut self, w: &ferrollama_tensor::QMatrix, scales: Option<&[f32]>, proj: Proj, e: usize, x: &[f32], m: usize, out: &mut [f32]) {
        matmul(w, x, m, out, self.mm, self.threads);
        if let Some(s) = scales {
            crate::ops::scale_inplace(&mut out[..m * w.rows], s[e]);
        }
        let terms = self.lora.terms(proj);
        if !terms.is_empty() {
            add_terms(terms, e, x, m, out, self.lora_scratch, self.mm, self.threads);
        }
    }
}

/// The sizes of an expert's step: n_embd, experts per token, tokens; and where the routing
/// weight goes: into the expert's input (`weigh_input`: Llama 4) or onto its output.
#[derive(Clone, Copy)]
struct ExpertShape {
    d: usize,
    k: usize,
    n: usize,
    weigh_input: bool,
}

fn run_expert(ex: &Experts, e: usize, h: &[f32], s: &mut MoeScratch, mut cx: ExpertCtx, shape: ExpertShape, act: FfnAct) {
    let ExpertShape { d, k, n, weigh_input } = shape;
    s.routed.clear();
    for (slot, &c) in s.chosen[..n * k].iter().enumerate() {
        if c as usize == e {
            s.routed.push(((slot / k) as u32, (slot % k) as u32));
        }
    }
    let m = s.routed.len();
    if m == 0 {
        return;
    }
    for (i, &(t, c)) in s.routed.iter().enumerate() {
        let (x, token) = (&mut s.x[i * d..(i + 1) * d], &h[t as usize * d..(t as usize + 1) * d]);
        if weigh_input {
            let w = s.weights[t as usize * k + c as usize];
            x.iter_mut().zip(token).for_each(|(x, &v)| *x = v * w);
        } else {
            x.copy_from_slice(token);
        }
    }
    let ff = ex.up[e].rows;
    let hidden = match (act, &ex.gate) {
        (FfnAct::Gated(act), Some(gate)) => {
            cx.product(&gate[e], ex.gate_s.as_deref(), Proj::GateExps, e, &s.x, m, &mut s.gate[..m * ff]);
            cx.product(&ex.up[e], ex.up_s.as_deref(), Proj::UpExps, e, &s.x, m, &mut s.up[..m * ff]);
            add_expert_bias(&mut s.gate[..m * ff], ex.gate_b.as_deref(), e, ff);
            add_expert_bias(&mut s.up[..m * ff], ex.up_b.as_deref(), e, ff);
            rows_on_threads(act, &mut s.gate[..m * ff], &s.up[..m * ff], ff, cx.threads);
            &s.gate
        }
        (FfnAct::Ungated(act), None) => {
            cx.product(&ex.up[e], ex.up_s.as_deref(), Proj::UpExps, e, &s.x, m, &mut s.up[..m * ff]);
            add_expert_bias(&mut s.up[..m * ff], ex.up_b.as_deref(), e, ff);
            act(&mut s.up[..m * ff]);
            &s.up
        }
        _ => unreachable!("an architecture loads the experts' gates exactly when their activation is gated"),
    };
    cx.product(&ex.down[e], ex.down_s.as_deref(), Proj::DownExps, e, hidden, m, &mut s.down[..m * d]);
    add_expert_bias(&mut s.down[..m * d], ex.down_b.as_deref(), e, d);
    for (i, &(t, c)) in s.routed.iter().enumerate() {
        let slot = t as usize * k + c as usize;
        let w = if weigh_input { 1.0 } else { s.weights[slot] };
        for (o, &v) in s.outs[slot * d..(slot + 1) * d].iter_mut().zip(&s.down[i * d..(i + 1) * d]) {
            *o = v * w;
        }
    }
}

/// Adds expert e's inputs to the activation statistics: its gate and up matrices see the
/// tokens' states, its down matrix their activations; summed choice by choice, token by token
/// within a choice (llama-imatrix's order over mul_mat_id's ids).
#[allow(clippy::too_many_arguments)]
fn note_expert(stats: &mut ActivationStats, s: &MoeScratch, e: usize, ne: usize, k: usize, d: usize, ff: usize, gated: bool) {
    let by_choice = || (0..k as u32).flat_map(|c| s.routed.iter().enumerate().filter(move |(_, r)| r.1 == c).map(|(i, _)| i));
    let inputs: &[Matrix] = if gated { &[Matrix::FfnGateExps, Matrix::FfnUpExps] } else { &[Matrix::FfnUpExps] };
    for &m in inputs {
        stats.record_expert(m, e, ne, d, by_choice().map(|i| &s.x[i * d..(i + 1) * d]));
    }
    let hidden = if gated { &s.gate } else { &s.up };
    stats.record_expert(Matrix::FfnDownExps, e, ne, ff, by_choice().map(|i| &hidden[i * ff..(i + 1) * ff]));
}

/// Adds expert e's row of a per-expert bias (n_expert rows of `len`) to each row of `x`.
fn add_expert_bias(x: &mut [f32], bias: Option<&[f32]>, e: usize, len: usize) {
    if let Some(b) = bias {
        crate::ops::add_bias(x, &b[e * len..(e + 1) * len]);
    }
}

/// A token's experts, in order of decreasing score, and their weights.
struct Choice<'a> {
    chosen: &'a mut [u32],
    weights: &'a mut [f32],
}

/// A token's choice of experts from its router logits (overwritten by the probabilities):
/// the top k of the probabilities, plus `selection_bias` where the experts have one (through
/// `biased`, one token's scratch), weighted by the unbiased probabilities.
fn route(gating: MoeGating, logits: &mut [f32], selection_bias: Option<&[f32]>, biased: &mut [f32], groups: Groups,
         out: Choice) {
    if gating == MoeGating::SigmoidOfTopLogits {
        // chosen by the logits themselves (no selection bias), weighted by their sigmoid
        top_k(logits, out.chosen);
        sigmoid_inplace(logits);
        for (w, &c) in out.weights.iter_mut().zip(out.chosen.iter()) {
            *w = logits[c as usize];
        }
        return;
    }
    match gating {
        MoeGating::Softmax { .. } => softmax(logits),
        MoeGating::Sigmoid { .. } => sigmoid_inplace(logits),
        MoeGating::SoftmaxOfChosen | MoeGating::SigmoidOfTopLogits => {}
    }
    let ne = logits.len();
    match selection_bias {
        Some(b) => {
            for ((s, &p), &bias) in biased.iter_mut().zip(logits.iter()).zip(b) {
                *s = p + bias;
            }
        }
        None if groups.n > 1 => biased[..ne].copy_from_slice(logits),
        None => {}
    }
    let grouped = groups.n > 1;
    if grouped {
        keep_best_groups(&mut biased[..ne], groups);
    }
    if selection_bias.is_some() || grouped {
        top_k(&biased[..ne], out.chosen);
    } else {
        top_k(logits, out.chosen);
    }
    let weights = out.weights;
    for (w, &c) in weights.iter_mut().zip(out.chosen.iter()) {
        *w = logits[c as usize];
    }
    match gating {
        MoeGating::Softmax { norm: true } | MoeGating::Sigmoid { norm: true } => {
            // ggml_sum_rows, clamped at f16's smallest normal, then a division.
            let sum = weights.iter().sum::<f32>().max(6.103_515_6e-5);
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        MoeGating::Softmax { norm: false } | MoeGating::Sigmoid { norm: false } => {}
        MoeGating::SoftmaxOfChosen => softmax(weights),
        MoeGating::SigmoidOfTopLogits => unreachable!("returned above"),
    }
}

/// A token's expert groups (build_moe_ffn with n_expert_groups > 1): `n` groups of
/// consecutive experts, the scores of each group, the groups kept.
struct Groups<'a> {
    n: usize,
    scores: &'a mut [f32],
    kept: &'a mut [u32],
}

/// Sets the selection scores of every expert outside the `g.kept.len()` groups with the best
/// sums of their two best scores to -inf (DeepSeek-V3's group-limited routing, as ggml
/// computes it: top-2 per group, their sum, the top groups, the others filled with -inf).
fn keep_best_groups(scores: &mut [f32], g: Groups) {
    let per_group = scores.len() / g.n;
    let mut best2 = [0u32; 2];
    for (gi, group) in scores.chunks_exact(per_group).enumerate() {
        top_k(group, &mut best2);
        g.scores[gi] = group[best2[0] as usize] + group[best2[1] as usize];
    }
    top_k(g.scores, g.kept);
    for (gi, group) in scores.chunks_exact_mut(per_group).enumerate() {
        if !g.kept.contains(&(gi as u32)) {
            group.fill(f32::NEG_INFINITY);
        }
    }
}

/// ggml_soft_max of one row: exp(x - max), summed in f64, scaled by 1 / sum.
fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The indices of the `out.len()` largest scores, largest first (ggml_argsort_top_k; equal
/// scores keep index order).
fn top_k(scores: &[f32], out: &mut [u32]) {
    let k = out.len();
    let mut filled = 0;
    for (i, &s) in scores.iter().enumerate() {
        // Insertion into the sorted prefix: k is small (8 of 128 at most in the models in use).
        let mut at = filled;
        while at > 0 && scores[out[at - 1] as usize] < s {
            at -= 1;
        }
        if at >= k {
            continue;
        }
        let end = filled.min(k - 1);
        out.copy_within(at..end, at + 1);
        out[at] = i as u32;
        filled = (filled + 1).min(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_by_score_and_keeps_index_order_on_ties() {
        let mut out = [0u32; 3];
        top_k(&[0.1, 0.5, 0.3, 0.5, 0.9, -1.0], &mut out);
        assert_eq!(out, [4, 1, 3]);
        let mut one = [0u32; 1];
        top_k(&[2.0, 3.0, 1.0], &mut one);
        assert_eq!(one, [1]);
    }

    #[test]
    fn softmax_routing_renormalizes_the_chosen_weights() {
        let mut logits = [1.0f32, 2.0, 3.0, 0.0];
        let (mut chosen, mut w, mut biased) = ([0u32; 2], [0f32; 2], [0f32; 4]);
        route(MoeGating::Softmax { norm: true }, &mut logits, None, &mut biased, no_groups(), Choice { chosen: &mut chosen, weights: &mut w });
        assert_eq!(chosen, [2, 1]);
        let e = (1.0f64).exp();
        assert!(((w[0] as f64) - e / (e + 1.0)).abs() < 1e-6 && ((w[0] + w[1]) - 1.0).abs() < 1e-6);
        let mut logits = [1.0f32, 2.0, 3.0, 0.0];
        route(MoeGating::SoftmaxOfChosen, &mut logits, None, &mut biased, no_groups(), Choice { chosen: &mut chosen, weights: &mut w });
        assert_eq!(chosen, [2, 1]);
        assert!(((w[0] as f64) - e / (e + 1.0)).abs() < 1e-6);
    }

    fn no_groups() -> Groups<'static> {
        Groups { n: 0, scores: &mut [], kept: &mut [] }
    }

    #[test]
    fn group_routing_chooses_only_among_the_groups_with_the_best_two_scores() {
        // Groups {0, 1}, {2, 3}, {4, 5}: sums of their two best 1.1, 1.0, 0.95; the one best
        // expert (5, of the last group) is not chosen, as its group is not kept.
        let mut logits = [0.5f32, 0.6, 0.5, 0.5, 0.05, 0.9];
        let (mut chosen, mut w, mut biased) = ([0u32; 2], [0f32; 2], [0f32; 6]);
        let (mut scores, mut kept) = ([0f32; 3], [0u32; 2]);
        let groups = Groups { n: 3, scores: &mut scores, kept: &mut kept };
        route(MoeGating::Sigmoid { norm: false }, &mut logits, None, &mut biased, groups, Choice { chosen: &mut chosen, weights: &mut w });
        assert_eq!(kept, [0, 1]);
        assert_eq!(chosen, [1, 0]);
    }

    #[test]
    fn llama4_routing_chooses_by_the_logits_and_weighs_by_their_sigmoid() {
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        // 30 and 31 have the same sigmoid in f32: the logits still tell them apart
        let mut logits = [1.0f32, 30.0, 31.0, 0.0];
        let (mut chosen, mut w, mut biased) = ([0u32; 1], [0f32; 1], [0f32; 4]);
        route(MoeGating::SigmoidOfTopLogits, &mut logits, None, &mut biased, no_groups(), Choice { chosen: &mut chosen, weights: &mut w });
        assert_eq!(chosen, [2]);
        assert_eq!(w, [sig(31.0)]);
    }

    #[test]
    fn sigmoid_routing_chooses_by_the_biased_probabilities_and_weighs_by_the_unbiased() {
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let mut logits = [1.0f32, 2.0, 3.0, 0.0];
        let (mut chosen, mut w, mut biased) = ([0u32; 2], [0f32; 2], [0f32; 4]);
        let bias = [0.0f32, 0.0, 0.0, 5.0];
        route(MoeGating::Sigmoid { norm: false }, &mut logits, Some(&bias), &mut biased, no_groups(), Choice { chosen: &mut chosen, weights: &mut w });
        assert_eq!(chosen, [3, 2]);
        assert_eq!(w, [sig(0.0), sig(3.0)]);
        let mut logits = [1.0f32, 2.0, 3.0, 0.0];
        route(MoeGating::Sigmoid { norm: true }, &mut logits, Some(&bias), &mut biased, no_groups(), Choice { chosen: &mut chosen, weights: &mut w });
        let sum = sig(0.0) + sig(3.0);
        assert_eq!(w, [sig(0.0) / sum, sig(3.0) / sum]);
    }
}
