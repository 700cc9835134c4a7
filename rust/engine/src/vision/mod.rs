//! The projector file (`mmproj`, GGUF architecture `clip`): a vision encoder and the
//! projection of its output into a text model's embedding space, as llama.cpp's
//! `tools/mtmd` runs it. The file is a model of its own, mapped like one; an image comes in
//! preprocessed (resized and normalized in Python, as mtmd's preprocessing does) and leaves
//! as rows of the text model's width, which a batch of embeddings feeds to a context.
//!
//! One file per projector type composes the shared ViT (`vit.rs`) with its head; the Qwen VL
//! encoders (`qwen2vl.rs`, `qwen3vl.rs`: rotary positions, windows, 2 × 2 merges) are their own,
//! built from vit.rs's pieces.

pub mod gemma3;
pub mod gemma4v;
pub mod idefics3;
pub mod lfm2;
pub mod llava;
pub mod minicpmv;
pub mod params;
pub mod qwen2vl;
pub mod qwen3vl;
pub mod pixtral;
pub mod vit;
pub mod whisper;

use std::path::Path;
use std::sync::Arc;

use ferrollama_gguf::GgufFile;
use ferrollama_tensor::{gemm, matmul, GgmlType, MatmulScratch, QMatrix, Threads, WeightBytes};

use crate::error::{EngineError, Result};
use crate::weights::Loader;

pub use params::{AudioParams, AudioProjectorType, ProjectorType, VisionParams};
pub use whisper::AudioProjector;

/// A loaded projector: its hyper-parameters and weights.
pub struct Projector {
    pub params: VisionParams,
    /// The shared ViT; None for the projector types with their own encoder (Qwen VL, Gemma 4: the head's).
    vit: Option<vit::VitWeights>,
    head: Head,
    /// Kept for the error messages' file name and the mapping's lifetime.
    file: Arc<GgufFile>,
    _repack: crate::weights::RepackHandle,
}

/// The part after the ViT, per projector type.
enum Head {
    Gemma3(gemma3::Gemma3Head),
    Idefics3(idefics3::Idefics3Head),
    Llava(llava::LlavaHead),
    Lfm2(lfm2::Lfm2Head),
    /// The whole Qwen VL encoder (qwen2vl, qwen2.5vl, qwen3vl).
    QwenVl(qwen2vl::QwenVlWeights),
    /// Gemma 4's whole encoder (its ViT is not the shared one).
    Gemma4v(gemma4v::Gemma4vEncoder),
    Pixtral(pixtral::PixtralHead),
    Minicpmv(minicpmv::MinicpmvHead),
}

impl Projector {
    pub fn load(path: impl AsRef<Path>, use_mmap: bool) -> Result<Projector> {
        let file = Arc::new(GgufFile::open(path, use_mmap)?);
        let arch = file.get_str("general.architecture").unwrap_or("");
        if arch != "clip" {
            return Err(file.error(format!(
                "general.architecture is '{arch}': a projector (mmproj) file's is 'clip'")).into());
        }
        let mut params = VisionParams::from_gguf(&file)?;
        let ld = Loader::new(file.clone());
        let vit = match params.projector.is_qwen_vl() || params.projector == ProjectorType::Gemma4v {
            true => None,
            false => Some(vit::VitWeights::load(&ld, &params)?),
        };
        let head = match params.projector {
            ProjectorType::Gemma3 => Head::Gemma3(gemma3::Gemma3Head::load(&ld, &params)?),
            ProjectorType::Idefics3 => Head::Idefics3(idefics3::Idefics3Head::load(&ld, &params)?),
            ProjectorType::Mlp => {
                let h = llava::LlavaHead::load(&ld, &params)?;
                params.n_embd_out = h.n_embd_out();
                Head::Llava(h)
            }
            ProjectorType::Lfm2 => {
                let h = lfm2::Lfm2Head::load(&ld, &params)?;
                params.n_embd_out = h.n_embd_out();
                Head::Lfm2(h)
            }
            ProjectorType::Qwen2Vl | ProjectorType::Qwen25Vl | ProjectorType::Qwen3Vl => {
                let w = qwen2vl::QwenVlWeights::load(&ld, &params)?;
                params.n_embd_out = w.n_embd_out();
                Head::QwenVl(w)
            }
            ProjectorType::Gemma4v => {
                let e = gemma4v::Gemma4vEncoder::load(&ld, &params)?;
                params.n_embd_out = e.n_embd_out();
                Head::Gemma4v(e)
            }
            ProjectorType::Pixtral => {
                let h = pixtral::PixtralHead::load(&ld, &params)?;
                params.n_embd_out = h.n_embd_out();
                Head::Pixtral(h)
            }
            ProjectorType::Minicpmv => {
                let h = minicpmv::MinicpmvHead::load(&ld, &params)?;
                params.n_embd_out = h.n_embd_out();
                Head::Minicpmv(h)
            }
        };
        if file.get_str("clip.projector_type") == Some(params::OMNI) {
            ld.leave_to_other(params::is_audio_tensor);
        }
        ld.check_all_used(&format!("clip ({})", params.projector.name()))?;
        let repack = ld.repacking().start();
        Ok(Projector { params, vit, head, file, _repack: repack })
    }

    /// The number of embedding rows an image of nx × ny pixels (preprocessed) gives.
    pub fn n_output_tokens(&self, nx: usize, ny: usize) -> usize {
        match &self.head {
            // both make one row of each n_merge × n_merge block of patches
            Head::Gemma3(_) | Head::Idefics3(_) | Head::Gemma4v(_) => gemma3::n_tokens(&self.params, nx, ny),
            Head::Llava(_) => llava::n_tokens(&self.params, nx, ny),
            Head::Lfm2(_) => lfm2::n_tokens(&self.params, nx, ny),
            Head::QwenVl(_) => qwen2vl::n_tokens(&self.params, nx, ny),
            Head::Pixtral(_) => pixtral::n_tokens(&self.params, nx, ny),
            Head::Minicpmv(_) => minicpmv::n_tokens(&self.params),
        }
    }

    /// An image's embeddings: `pixels` is the preprocessed image, ny rows of nx pixels of
    /// three normalized channels (clip_image_f32's layout); the result has
    /// `n_output_tokens(nx, ny)` rows of `params.n_embd_out`.
    pub fn encode(&self, pixels: &[f32], nx: usize, ny: usize, threads: &Threads) -> Result<Vec<f32>> {
        self.check_image(pixels, nx, ny)?;
        let (head, p) = (&self.head, &self.params);
        match head {
            Head::QwenVl(w) => return Ok(qwen2vl::encode(w, p, pixels, nx, ny, threads)),
            Head::Gemma4v(e) => return Ok(gemma4v::encode(e, p, pixels, nx, ny, threads)),
            _ => {}
        }
        let vit = self.vit.as_ref().expect("the shared ViT of a projector without its own encoder");
        let (px, py) = (nx / p.patch_size, ny / p.patch_size);
        let hidden = match head {
            Head::Lfm2(_) => {
                let pos = lfm2::positions(vit.positions(), p.n_embd, px, py);
                vit::forward_with(vit, p, pixels, nx, ny, Some(&pos), None, threads)
            }
            Head::Pixtral(_) => pixtral::vit_forward(vit, p, pixels, nx, ny, threads),
            Head::Minicpmv(_) => {
                let pos = minicpmv::vit_positions(vit.positions(), p.n_embd, px, py);
                vit::forward_with(vit, p, pixels, nx, ny, Some(&pos), None, threads)
            }
            _ => vit::forward(vit, p, pixels, nx, ny, threads),
        };
        Ok(match head {
            Head::Gemma3(h) => gemma3::project(h, p, hidden, px, threads),
            Head::Idefics3(h) => idefics3::project(h, p, hidden, px, threads),
            Head::Llava(h) => llava::project(h, p, hidden, self.n_output_tokens(nx, ny), threads),
            Head::Lfm2(h) => lfm2::project(h, p, hidden, px, py, threads),
            Head::Pixtral(h) => pixtral::project(h, p, hidden, nx, ny, threads),
            Head::Minicpmv(h) => minicpmv::project(h, p, hidden, px, py, threads),
            Head::QwenVl(_) | Head::Gemma4v(_) => unreachable!("encoded above"),
        })
    }

    fn check_image(&self, pixels: &[f32], nx: usize, ny: usize) -> Result<()> {
        let p = &self.params;
        if nx.checked_mul(ny).and_then(|n| n.checked_mul(3)) != Some(pixels.len()) {
            return Err(EngineError::InvalidArgument(format!(
                "an image of {nx}x{ny} pixels needs {} values (3 per pixel), got {}", nx * ny * 3, pixels.len())));
        }
        if p.projector.is_qwen_vl() {
            return self.check_qwen_image(nx, ny);
        }
        // Idefics3 encodes each tile (and the overview) of image_size on its own; LFM2 and
        // MiniCPM-V any size (their positions resized, bucketed)
        let fixed = matches!(p.projector, ProjectorType::Gemma3 | ProjectorType::Idefics3 | ProjectorType::Mlp);
        if fixed && (nx != p.image_size || ny != p.image_size) {
            return Err(EngineError::InvalidArgument(format!(
                "the {} projector takes {s}x{s} images (preprocess first), not {nx}x{ny}", p.projector.name(), s = p.image_size)));
        }
        if p.projector == ProjectorType::Pixtral {
            pixtral::check_size(p, nx, ny)?;
        }
        if nx % p.patch_size != 0 || ny % p.patch_size != 0 {
            return Err(EngineError::InvalidArgument(format!(
                "an image of {nx}x{ny} pixels is not whole patches of {}", p.patch_size)));
        }
        if let Head::Gemma4v(e) = &self.head {
            // pooled in whole blocks (clip.cpp counts n_patches / n_merge², its pool rounds
            // each side down), each patch's column and row within the position tables
            let (block, max) = (p.patch_size * p.n_merge, e.max_patches_per_side());
            if nx == 0 || ny == 0 || nx % block != 0 || ny % block != 0 || nx / p.patch_size > max || ny / p.patch_size > max {
                return Err(EngineError::InvalidArgument(format!(
                    "the gemma4v projector takes images of whole {block}-pixel blocks (preprocess first) of at most {} pixels \
                     a side, not {nx}x{ny}", max * p.patch_size)));
            }
        }
        Ok(())
    }

    /// The projector file's path.
    pub fn path(&self) -> &Path { self.file.path() }
}

/// A matrix of `rows` × `cols` float `values` stored in the float type `ty` (F32, F16 or
/// BF16: the types ggml converts and transposes), used in place (not repacked).
pub(crate) fn float_matrix(ty: GgmlType, rows: usize, cols: usize, values: &[f32]) -> Result<QMatrix> {
    let bytes: Vec<u8> = match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        GgmlType::BF16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        other => return Err(EngineError::Unsupported(format!("a {other} matrix where the projector needs F32, F16 or BF16"))),
    };
    QMatrix::with_layout(ty, rows, cols, WeightBytes::Owned(Arc::new(bytes)), false)
        .map_err(|e| EngineError::InvalidArgument(format!("a {rows}x{cols} {ty} matrix: {e:?}")))
}

/// w · x for n tokens (rows of w.cols), as ggml_mul_mat computes a batch this long:
/// llamafile's tinyBLAS for F16 and F32 weights whose rows are whole 16-element steps
/// (`gemm`, also the faster kernel), ggml's row dot products otherwise (`matmul`).
pub(crate) fn product(w: &QMatrix, x: &[f32], n: usize, threads: &Threads) -> Vec<f32> {
    let mut out = vec![0.0; n * w.rows];
    match w.ty {
        GgmlType::F16 | GgmlType::F32 if w.cols % 16 == 0 => gemm(w, x, n, &mut out, threads),
        _ => matmul(w, x, n, &mut out, &mut MatmulScratch::default(), threads),
    }
    out
}

/// A matrix's values as f32, row after row.
pub(crate) fn dequantized(m: &QMatrix) -> Vec<f32> {
    let mut values = vec![0.0f32; m.rows * m.cols];
    for (r, row) in values.chunks_exact_mut(m.cols).enumerate() {
        m.dequantize_row(r, row);
    }
    values
}
