//! Audio projectors: Whisper's encoder as clip.cpp's models/whisper-enc.cpp builds it, and the
//! heads after it. A chunk of n_mel × 3000 log-mel frames (the spectrogram is Python's,
//! ferrollama.generation.audio, as mtmd-audio.cpp computes it) goes through two 1-D convolutions
//! of kernel 3 (the second of stride 2, halving the frames) with the exact GELU, learned
//! positions, pre-LN blocks of full attention (the ViT's blocks, vit.rs), for Qwen2-Audio and
//! Voxtral an average pool of two positions (clip.cpp's build_vit), the post-LN. Then the head:
//! - Ultravox stacks `stack_factor` frames into a row, RMS-norms it, runs a SwiGLU MLP (the
//!   second half through SiLU) with an RMS norm in the middle;
//! - Qwen2-Audio (and Qwen2.5-Omni's audio half) one fully connected layer with bias;
//! - Voxtral stacks `stack_factor` frames and runs an MLP with GELU (erf), without biases.
//!
//! Numerics follow ggml's CPU backend as vit.rs does: ggml_conv_1d_ph makes its im2col in F16
//! against the kernel in F16, products of F16 weights round their activations to F16, the
//! attention's K and V are rounded to F16 (flash attention's tiled path); GELU (erf) is computed.

use std::path::Path;
use std::sync::Arc;

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{QMatrix, Threads};

use super::params::{AudioParams, AudioProjectorType, FfnAct};
use super::product;
use super::vit::{self, f16_round, BlockShape, VitLayer};
use crate::error::{EngineError, Result};
use crate::ops::{add_bias, add_inplace, gelu_erf_inplace, layer_norm_rows, rms_norm_inplace, swiglu};
use crate::weights::Loader;

/// The convolutions' kernel size (Whisper's; clip.cpp reads it from the tensors' shape).
const KERNEL: usize = 3;
/// ggml_rms_norm's epsilon in the Ultravox head.
const ULTRAVOX_EPS: f32 = 1e-6;

struct Conv {
    /// n_embd rows of n_in × KERNEL (input channel, then tap: im2col's order), F16.
    kernel: QMatrix,
    bias: Vec<f32>,
    stride: usize,
}

struct WhisperWeights {
    conv1: Conv,
    conv2: Conv,
    /// One row of n_embd per position.
    pos: Vec<f32>,
    n_pos: usize,
    layers: Vec<VitLayer>,
    post_ln: Option<(Vec<f32>, Option<Vec<f32>>)>,
}

struct UltravoxHead {
    norm_pre: Vec<f32>,
    mlp1: QMatrix,
    norm_mid: Vec<f32>,
    mlp2: QMatrix,
}

/// What follows the encoder, by projector type.
enum Head {
    Ultravox(UltravoxHead),
    /// mm.a.fc and its bias.
    Qwen2A { fc: QMatrix, bias: Vec<f32> },
    /// mm.a.mlp.1 (stacked frames to the hidden width), GELU (erf), mm.a.mlp.2.
    Voxtral { mlp1: QMatrix, mlp2: QMatrix },
}

/// A loaded audio projector: its hyper-parameters and weights.
pub struct AudioProjector {
    pub params: AudioParams,
    encoder: WhisperWeights,
    head: Head,
    file: Arc<GgufFile>,
    _repack: crate::weights::RepackHandle,
}

impl AudioProjector {
    pub fn load(path: impl AsRef<Path>, use_mmap: bool) -> Result<AudioProjector> {
        let file = Arc::new(GgufFile::open(path, use_mmap)?);
        let arch = file.get_str("general.architecture").unwrap_or("");
        if arch != "clip" {
            return Err(file.error(format!(
                "general.architecture is '{arch}': a projector (mmproj) file's is 'clip'")).into());
        }
        let params = AudioParams::from_gguf(&file)?;
        let ld = Loader::new(file.clone());
        let encoder = load_encoder(&ld, &params)?;
        let head = match params.projector {
            AudioProjectorType::Ultravox => Head::Ultravox(load_ultravox(&ld, &params)?),
            AudioProjectorType::Qwen2A => Head::Qwen2A {
                fc: ld.matrix("mm.a.fc.weight", params.n_embd, params.n_embd_out)?,
                bias: ld.vector("mm.a.fc.bias", params.n_embd_out)?,
            },
            AudioProjectorType::Voxtral => load_voxtral(&ld, &params)?,
        };
        if file.get_str("clip.projector_type") == Some(super::params::OMNI) {
            ld.leave_to_other(|name| !super::params::is_audio_tensor(name));
        }
        ld.check_all_used(&format!("clip ({})", params.projector.name()))?;
        let repack = ld.repacking().start();
        Ok(AudioProjector { params, encoder, head, file, _repack: repack })
    }

    /// The rows a chunk of `n_frames` mel frames gives, as clip.cpp counts them
    /// (clip_n_output_tokens): the frames aligned up to the stack factor and stacked (heads that
    /// stack), halved (the second convolution), halved again (the average pool, if any). The
    /// graph stacks after the convolution and the pool, so where the stack factor does not
    /// divide the pooled positions the two differ (see `encode`).
    pub fn n_output_tokens(&self, n_frames: usize) -> usize {
        let stack = self.params.stack_factor;
        let n = n_frames.div_ceil(stack) * stack / stack / 2;
        if self.params.projector.avg_pools() { n / 2 } else { n }
    }

    /// A chunk's embeddings: `mel` holds n_mel rows of `n_frames` values (the spectrogram's
    /// layout); the result has `n_output_tokens(n_frames)` rows of `params.n_embd_out`.
    pub fn encode(&self, mel: &[f32], n_frames: usize, threads: &Threads) -> Result<Vec<f32>> {
        let p = &self.params;
        if n_frames == 0 || n_frames.checked_mul(p.n_mel) != Some(mel.len()) {
            return Err(EngineError::InvalidArgument(format!(
                "a spectrogram of {n_frames} frames of {} mel bins needs {} values, got {}", p.n_mel, n_frames * p.n_mel, mel.len())));
        }
        let n_pos = n_frames.div_ceil(2);
        if n_pos > self.encoder.n_pos {
            return Err(EngineError::InvalidArgument(format!(
                "{n_frames} mel frames make {n_pos} positions, over the encoder's {}", self.encoder.n_pos)));
        }
        let hidden = encode_frames(&self.encoder, p, mel, n_frames, threads);
        let out = match &self.head {
            Head::Ultravox(h) => ultravox(h, p, hidden, threads),
            Head::Qwen2A { fc, bias } => {
                let mut out = product(fc, &hidden, hidden.len() / p.n_embd, threads);
                out.chunks_exact_mut(bias.len()).for_each(|row| add_bias(row, bias));
                out
            }
            Head::Voxtral { mlp1, mlp2 } => voxtral(mlp1, mlp2, p, hidden, threads),
        };
        let expected = self.n_output_tokens(n_frames);
        if out.len() != expected * p.n_embd_out {
            // clip.cpp aborts here ("Invalid number of output tokens"): the stacked rows
            // (padded up) are not its count of tokens (frames aligned, stacked, halved)
            return Err(EngineError::InvalidArgument(format!(
                "{n_frames} mel frames give {} stacked rows where clip.cpp counts {expected} tokens (stack factor {})",
                out.len() / p.n_embd_out, p.stack_factor)));
        }
        Ok(out)
    }

    /// The projector file's path.
    pub fn path(&self) -> &Path { self.file.path() }
}

/// Whether a projector file holds an audio encoder (clip.has_audio_encoder): which of
/// `Projector` and `AudioProjector` loads it.
pub fn has_audio_encoder(path: impl AsRef<Path>) -> Result<bool> {
    Ok(GgufFile::open(path, true)?.get_bool("clip.has_audio_encoder").unwrap_or(false))
}

/// Whether a projector file holds a vision encoder beside its audio one (Qwen2.5-Omni's, which
/// both `Projector` and `AudioProjector` load): clip.has_vision_encoder, false without it as in clip.cpp.
pub fn has_vision_encoder(path: impl AsRef<Path>) -> Result<bool> {
    Ok(GgufFile::open(path, true)?.get_bool("clip.has_vision_encoder").unwrap_or(false))
}

fn load_encoder(ld: &Loader, p: &AudioParams) -> Result<WhisperWeights> {
    let d = p.n_embd;
    let conv = |i: usize, n_in: usize, stride: usize| -> Result<Conv> {
        let name = format!("a.conv1d.{i}.weight");
        let stored = ld.row_blocks(&name, &[KERNEL, n_in, d], n_in * KERNEL, &[d])?.pop().expect("one block");
        let bias = ld.opt_vector_2d(&format!("a.conv1d.{i}.bias"), 1, d)?
            .ok_or_else(|| ld.error(format!("missing tensor 'a.conv1d.{i}.bias'")))?;
        Ok(Conv { kernel: vit::patch_kernel(stored)?, bias, stride })
    };
    let n_pos = match ld.shape("a.position_embd.weight").as_deref() {
        Some([len, n, ..]) if *len == d => *n,
        Some(shape) => return Err(ld.error(format!("tensor 'a.position_embd.weight' has shape {shape:?}, expected [{d}, n_pos]"))),
        None => return Err(ld.error("missing tensor 'a.position_embd.weight'")),
    };
    let pos = ld.opt_vector_2d("a.position_embd.weight", d, n_pos)?.expect("present");
    let layers = (0..p.n_layer).map(|il| vit::load_layer_at(ld, "a", d, p.n_ff, FfnAct::GeluErf, true, il)).collect::<Result<_>>()?;
    let post_ln = match ld.has("a.post_ln.weight") {
        true => Some(vit::norm(ld, "a.post_ln", d)?),
        false => None,
    };
    Ok(WhisperWeights { conv1: conv(1, p.n_mel, 1)?, conv2: conv(2, d, 2)?, pos, n_pos, layers, post_ln })
}

fn load_voxtral(ld: &Loader, p: &AudioParams) -> Result<Head> {
    let n_stacked = p.n_embd * p.stack_factor;
    let n_hidden = ld.shape("mm.a.mlp.1.weight").and_then(|s| s.get(1).copied()).unwrap_or(0);
    Ok(Head::Voxtral {
        mlp1: ld.matrix("mm.a.mlp.1.weight", n_stacked, n_hidden)?,
        mlp2: ld.matrix("mm.a.mlp.2.weight", n_hidden, p.n_embd_out)?,
    })
}

fn load_ultravox(ld: &Loader, p: &AudioParams) -> Result<UltravoxHead> {
    let n_stacked = p.n_embd * p.stack_factor;
    let mlp1 = ld.matrix("mm.a.mlp.1.weight", n_stacked, ld.shape("mm.a.mlp.1.weight").and_then(|s| s.get(1).copied()).unwrap_or(0))?;
    if mlp1.rows % 2 != 0 {
        return Err(ld.error(format!("tensor 'mm.a.mlp.1.weight' has {} rows: SwiGLU needs an even number", mlp1.rows)));
    }
    let n_hidden = mlp1.rows / 2;
    Ok(UltravoxHead {
        norm_pre: ld.vector("mm.a.norm_pre.weight", n_stacked)?,
        mlp1,
        norm_mid: ld.vector("mm.a.norm_mid.weight", n_hidden)?,
        mlp2: ld.matrix("mm.a.mlp.2.weight", n_hidden, p.n_embd_out)?,
    })
}

/// The encoder's output: one row of n_embd per position (n_frames / 2, rounded up), or per pair
/// of positions where the projector average-pools them (an odd last one dropped, as ggml_pool_1d).
fn encode_frames(w: &WhisperWeights, p: &AudioParams, mel: &[f32], n_frames: usize, threads: &Threads) -> Vec<f32> {
    // the mel is channel-major (n_mel rows of frames); the convolutions' outputs token-major
    let at_mel = |t: usize, c: usize| mel[c * n_frames + t];
    let x = convolve(&w.conv1, p.n_mel, n_frames, at_mel, threads);
    let d = p.n_embd;
    let at_hidden = |t: usize, c: usize| x[t * d + c];
    let mut x = convolve(&w.conv2, d, n_frames, at_hidden, threads);
    let n = x.len() / d;
    add_inplace(&mut x, &w.pos[..n * d]);
    let shape = BlockShape { n_embd: d, n_head: p.n_head, n_ff: p.n_ff, eps: p.eps, ffn_act: FfnAct::GeluErf, rms: false };
    for l in &w.layers {
        vit::block(l, &shape, &mut x, n, None, threads);
    }
    if p.projector.avg_pools() {
        x = average_pairs(&x, d);
    }
    if let Some((g, b)) = &w.post_ln {
        layer_norm_rows(&mut x, g, b.as_deref(), p.eps);
    }
    x
}

/// ggml_pool_1d (average, kernel and stride 2) over the positions of each channel: row t of the
/// result is (row 2t + row 2t+1) / 2, in f32 as ggml sums (0 + a + b) then divides.
fn average_pairs(x: &[f32], d: usize) -> Vec<f32> {
    let rows: Vec<&[f32]> = x.chunks_exact(d).collect();
    rows.chunks_exact(2).flat_map(|pair| pair[0].iter().zip(pair[1]).map(|(a, b)| (a + b) / 2.0)).collect()
}

/// ggml_conv_1d_ph (padding KERNEL / 2), its bias, GELU (erf): `input(t, c)` reads frame t of
/// channel c of an input of n_len frames; the output has a row of n_embd per output frame.
fn convolve(conv: &Conv, n_in: usize, n_len: usize, input: impl Fn(usize, usize) -> f32, threads: &Threads) -> Vec<f32> {
    let pad = KERNEL / 2;
    let n_out = (n_len + 2 * pad - KERNEL) / conv.stride + 1;
    let mut cols = Vec::with_capacity(n_out * n_in * KERNEL);
    for t in 0..n_out {
        for c in 0..n_in {
            cols.extend((0..KERNEL).map(|k| {
                let at = (t * conv.stride + k).checked_sub(pad).filter(|&i| i < n_len);
                at.map_or(0.0, |i| f16_round(input(i, c)))
            }));
        }
    }
    let mut out = product(&conv.kernel, &cols, n_out, threads);
    vit::on_rows(&mut out, conv.kernel.rows, threads, |_, rows| {
        for row in rows.chunks_exact_mut(conv.bias.len()) {
            add_bias(row, &conv.bias);
        }
        gelu_erf_inplace(rows);
    });
    out
}

/// build_stack: the rows laid end to end, cut into rows of `stride` values (stack_factor frames
/// of n_embd), the last one padded with zeros. Returns the stacked values and their number of rows.
fn stack_frames(mut x: Vec<f32>, stride: usize) -> (Vec<f32>, usize) {
    x.resize(x.len().div_ceil(stride) * stride, 0.0);
    let n = x.len() / stride;
    (x, n)
}

/// Voxtral's head: stacked frames, mm.a.mlp.1, GELU (erf), mm.a.mlp.2 (build_ffn without biases).
fn voxtral(mlp1: &QMatrix, mlp2: &QMatrix, p: &AudioParams, x: Vec<f32>, threads: &Threads) -> Vec<f32> {
    let (x, n) = stack_frames(x, p.n_embd * p.stack_factor);
    let mut hidden = product(mlp1, &x, n, threads);
    vit::on_rows(&mut hidden, mlp1.rows, threads, |_, rows| gelu_erf_inplace(rows));
    product(mlp2, &hidden, n, threads)
}

/// Ultravox's head: rows of stack_factor frames (the last padded with zeros), RMS norm,
/// mm.a.mlp.1, SwiGLU (silu(second half) × first half), RMS norm, mm.a.mlp.2.
fn ultravox(h: &UltravoxHead, p: &AudioParams, x: Vec<f32>, threads: &Threads) -> Vec<f32> {
    let (mut x, n) = stack_frames(x, p.n_embd * p.stack_factor);
    rms_norm_inplace(&mut x, &h.norm_pre, ULTRAVOX_EPS);
    let up = product(&h.mlp1, &x, n, threads);
    let half = h.mlp1.rows / 2;
    let mut gate: Vec<f32> = up.chunks_exact(2 * half).flat_map(|r| r[half..].iter().copied()).collect();
    let value: Vec<f32> = up.chunks_exact(2 * half).flat_map(|r| r[..half].iter().copied()).collect();
    swiglu(&mut gate, &value, half);
    rms_norm_inplace(&mut gate, &h.norm_mid, ULTRAVOX_EPS);
    product(&h.mlp2, &gate, n, threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml_pool_1d over positions: each channel's pairs averaged, an odd last position dropped.
    #[test]
    fn average_pairs_pools_positions_per_channel() {
        let rows = [1.0, 10.0, 3.0, 20.0, 100.0, 1000.0];
        assert_eq!(average_pairs(&rows, 2), vec![2.0, 15.0]);
        assert_eq!(average_pairs(&rows[..4], 2), vec![2.0, 15.0]);
    }

    /// build_stack: 3 frames of 2 values stacked by 2 make 2 rows, the second padded with zeros.
    #[test]
    fn stack_frames_pads_the_last_row() {
        let (x, n) = stack_frames(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 4);
        assert_eq!((x, n), (vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0], 2));
    }
}
