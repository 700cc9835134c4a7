//! A projector's hyper-parameters, read from its `clip.*` keys as clip.cpp's loader does.
//! Every `clip.*` key of the file is either read or refused: a key the engine would ignore
//! (window attention, feature layers, tiling...) would give wrong embeddings with no error.

use std::cell::RefCell;
use std::collections::BTreeSet;

use ferrollama_gguf::GgufFile;

use crate::error::{EngineError, Result};

/// The projector types the engine runs (clip.cpp's `projector_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectorType {
    /// Gemma 3: SigLIP, its output average-pooled n_merge × n_merge, RMS-normed and projected.
    Gemma3,
    /// Idefics3 (SmolVLM): SigLIP per tile, pixel-shuffled n_merge × n_merge and projected.
    Idefics3,
    /// LLaVA 1.5 (and BakLLaVA, Obsidian...): CLIP up to a feature layer, each patch through a
    /// two-layer MLP (clip.cpp's PROJECTOR_TYPE_MLP, graph models/llava.cpp).
    Mlp,
    /// LFM2-VL: SigLIP2 NaFlex at the image's own size (position embeddings resized to its
    /// patch grid), pixel-unshuffled n_merge × n_merge, LayerNorm'd and through a two-layer MLP.
    Lfm2,
    /// Qwen2-VL: a ViT with 2-D rotary positions, its patches merged 2 × 2 by an MLP
    /// (clip.cpp's PROJECTOR_TYPE_QWEN2VL, graph models/qwen2vl.cpp).
    Qwen2Vl,
    /// Qwen2.5-VL: Qwen2-VL's encoder with RMSNorms, a gated SiLU FFN and window attention.
    Qwen25Vl,
    /// Qwen3-VL: learned positions resized to the image, fused QKV and deepstack features
    /// (graph models/qwen3vl.cpp).
    Qwen3Vl,
    /// Gemma 4: a ViT of RMS norms and 2-D RoPE over images of any whole-block size, its output
    /// average-pooled n_merge × n_merge, scaled, RMS-normed and projected (models/gemma4v.cpp).
    Gemma4v,
    /// Pixtral 12B and Mistral Small 3.x: a RoPE ViT on images of any size, Mistral Small's
    /// patch merger, a two-layer MLP, [IMG_BREAK] between rows (graph models/pixtral.cpp).
    Pixtral,
    /// MiniCPM-V (clip.cpp's PROJECTOR_TYPE_MINICPMV, named "resampler"): SigLIP at the
    /// slice's own size (bucketed position embeddings), then a resampler: learned queries
    /// attending over the patches (2-D sin-cos positions on the keys), LayerNorm'd and projected.
    Minicpmv,
}

impl ProjectorType {
    fn parse(name: &str) -> Option<ProjectorType> {
        match name {
            "gemma3" => Some(ProjectorType::Gemma3),
            "idefics3" => Some(ProjectorType::Idefics3),
            "mlp" => Some(ProjectorType::Mlp),
            "lfm2" => Some(ProjectorType::Lfm2),
            "qwen2vl_merger" => Some(ProjectorType::Qwen2Vl),
            "qwen2.5vl_merger" => Some(ProjectorType::Qwen25Vl),
            "qwen3vl_merger" => Some(ProjectorType::Qwen3Vl),
            "gemma4v" => Some(ProjectorType::Gemma4v),
            "pixtral" => Some(ProjectorType::Pixtral),
            "resampler" => Some(ProjectorType::Minicpmv),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ProjectorType::Gemma3 => "gemma3",
            ProjectorType::Idefics3 => "idefics3",
            ProjectorType::Mlp => "mlp",
            ProjectorType::Lfm2 => "lfm2",
            ProjectorType::Qwen2Vl => "qwen2vl_merger",
            ProjectorType::Qwen25Vl => "qwen2.5vl_merger",
            ProjectorType::Qwen3Vl => "qwen3vl_merger",
            ProjectorType::Gemma4v => "gemma4v",
            ProjectorType::Pixtral => "pixtral",
            ProjectorType::Minicpmv => "resampler",
        }
    }

    /// The Qwen VL family: images of any size (whole 2 × 2 blocks of patches), merged 2 × 2.
    pub fn is_qwen_vl(self) -> bool {
        matches!(self, ProjectorType::Qwen2Vl | ProjectorType::Qwen25Vl | ProjectorType::Qwen3Vl)
    }
}

/// The FFN's activation (clip.use_gelu / clip.use_silu; neither: quick GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    Gelu,
    Silu,
    GeluQuick,
    /// The exact GELU (ggml_gelu_erf): Whisper's encoder (clip.cpp's audio projectors).
    GeluErf,
}

#[derive(Debug, Clone)]
pub struct VisionParams {
    pub projector: ProjectorType,
    pub image_size: usize,
    pub patch_size: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub eps: f32,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// The width of the output rows: the text model's n_embd.
    pub n_embd_out: usize,
    /// Patches merged per side (Gemma 3: the average pool's kernel; Idefics3, LFM2: the pixel shuffle's).
    pub n_merge: usize,
    /// The preprocessing's longest edge (clip.vision.preproc_image_size, Idefics3's); 0: none.
    pub image_longest_edge: usize,
    pub ffn_act: FfnAct,
    /// The blocks whose output the head takes: the first `n_layer_used` of n_layer (llava: all
    /// but the last, or clip.vision.feature_layer).
    pub n_layer_used: usize,
    /// LLaVA 1.6's anyres resolutions (width, height): the image is encoded as an overview and
    /// tiles of the best one (preprocessing's business; empty for LLaVA 1.5).
    pub grid_pinpoints: Vec<[usize; 2]>,
    /// Qwen2.5-VL's window attention: every n_wa_pattern-th block attends to the whole image,
    /// the others within windows (0: no windows).
    pub n_wa_pattern: usize,
    /// Qwen3-VL's clip.vision.is_deepstack_layers (empty when the file has none): checked
    /// against the deepstack tensors, which are what clip.cpp goes by.
    pub deepstack_layers: Vec<bool>,
    /// MiniCPM-V's version (clip.minicpmv_version: 2 for 2.5, 3 for 2.6...; 0 for other types):
    /// its slices' tokens, and the query count where the file does not say it.
    pub minicpmv_version: u32,
    /// MiniCPM-V's resampler queries: the rows of each image or slice (0 for other types).
    pub minicpmv_query_num: usize,
}

impl VisionParams {
    pub fn head_dim(&self) -> usize { self.n_embd / self.n_head }

    pub fn from_gguf(file: &GgufFile) -> Result<VisionParams> {
        let keys = Keys { file, read: RefCell::new(BTreeSet::new()) };
        let ty_name = keys.string("clip.projector_type")?;
        if keys.opt_bool("clip.has_audio_encoder")? == Some(true) {
            if ty_name != OMNI {
                return Err(EngineError::Unsupported("this projector file has an audio encoder: load it as an audio projector".into()));
            }
            keys.leave_to_other(is_audio_key);
        }
        if keys.opt_bool("clip.has_vision_encoder")? == Some(false) {
            return Err(file.error("clip.has_vision_encoder is false: no vision encoder in this file").into());
        }
        // Qwen2.5-Omni's file: its vision half is Qwen2.5-VL's (clip.cpp's "legacy" correction)
        let ty_name = if ty_name == OMNI { "qwen2.5vl_merger".to_string() } else { ty_name };
        let projector = ProjectorType::parse(&ty_name)
            .ok_or_else(|| EngineError::Unsupported(format!("projector type '{ty_name}' is not supported (supported: gemma3, idefics3, lfm2, mlp, qwen2vl_merger, qwen2.5vl_merger, qwen3vl_merger, gemma4v, pixtral, resampler)")))?;
        let ffn_act = match (keys.opt_bool("clip.use_gelu")?.unwrap_or(false), keys.opt_bool("clip.use_silu")?.unwrap_or(false)) {
            (true, true) => return Err(file.error("clip.use_gelu and clip.use_silu are both true").into()),
            (true, false) => FfnAct::Gelu,
            (false, true) => FfnAct::Silu,
            (false, false) => FfnAct::GeluQuick,
        };
        let n_layer = keys.size("clip.vision.block_count", 1 << 10)?;
        let p = VisionParams {
            projector,
            image_size: keys.size("clip.vision.image_size", 1 << 14)?,
            patch_size: keys.size("clip.vision.patch_size", 1 << 10)?,
            n_embd: keys.size("clip.vision.embedding_length", 1 << 16)?,
            n_ff: keys.size("clip.vision.feed_forward_length", 1 << 18)?,
            n_layer,
            n_head: keys.size("clip.vision.attention.head_count", 1 << 10)?,
            eps: keys.f32("clip.vision.attention.layer_norm_epsilon")?,
            image_mean: keys.rgb("clip.vision.image_mean")?,
            image_std: keys.rgb("clip.vision.image_std")?,
            n_embd_out: match projector {
                ProjectorType::Gemma3 | ProjectorType::Idefics3 => keys.size("clip.vision.projection_dim", 1 << 18)?,
                // CLIP's own projection width, not the MLP's output (llava), or the text
                // model's (pixtral): mm.2.weight's rows (clip_n_mmproj_embd), set by the head at load
                ProjectorType::Mlp | ProjectorType::Pixtral | ProjectorType::Lfm2 | ProjectorType::Qwen2Vl | ProjectorType::Qwen25Vl | ProjectorType::Qwen3Vl => {
                    keys.opt_size("clip.vision.projection_dim", 1 << 18)?;
                    0
                }
                // clip.cpp requires the key but sizes the output by mm.input_projection's rows
                // (clip_n_mmproj_embd), set by the head at load
                ProjectorType::Gemma4v => {
                    keys.size("clip.vision.projection_dim", 1 << 18)?;
                    0
                }
                // resampler.proj's width (clip_n_mmproj_embd), set by the head at load; MiniCPM-V's
                // converter writes a projection_dim of 0, which clip.cpp reads and never uses
                ProjectorType::Minicpmv => {
                    keys.get("clip.vision.projection_dim");
                    0
                }
            },
            n_merge: match projector {
                // clip.cpp: 4 for every Gemma 3; a test model may say otherwise
                ProjectorType::Gemma3 => keys.opt_size("clip.vision.projector.scale_factor", 64)?.unwrap_or(4),
                // clip.cpp's default is 1, which its pixel shuffle asserts against (> 1)
                ProjectorType::Idefics3 | ProjectorType::Lfm2 => keys.opt_size("clip.vision.projector.scale_factor", 64)?.unwrap_or(1),
                ProjectorType::Mlp | ProjectorType::Minicpmv => 1,
                // Mistral Small's patch merger; the original Pixtral merges nothing. clip.cpp
                // reads no clip.rope.freq_base (a Mistral-format conversion's): its RoPE base is 10000
                ProjectorType::Pixtral => {
                    keys.get("clip.rope.freq_base");
                    keys.opt_size("clip.vision.spatial_merge_size", 64)?.unwrap_or(1)
                }
                // clip.cpp: Gemma 4's pooling_kernel_size, 3 unless the file says otherwise
                ProjectorType::Gemma4v => keys.opt_size("clip.vision.projector.scale_factor", 64)?.unwrap_or(3),
                // clip.cpp's default 2; its graphs merge 2 × 2 whatever the key says
                ProjectorType::Qwen2Vl | ProjectorType::Qwen25Vl | ProjectorType::Qwen3Vl => {
                    keys.opt_size("clip.vision.spatial_merge_size", 64)?.unwrap_or(2)
                }
            },
            image_longest_edge: match projector {
                ProjectorType::Idefics3 => keys.opt_size("clip.vision.preproc_image_size", 1 << 16)?.unwrap_or(0),
                _ => 0,
            },
            ffn_act,
            n_layer_used: match projector {
                ProjectorType::Mlp => llava_feature_layer(&keys, n_layer)?,
                _ => n_layer,
            },
            grid_pinpoints: match projector {
                ProjectorType::Mlp => llava_pinpoints(&keys)?,
                _ => Vec::new(),
            },
            n_wa_pattern: qwen_window_pattern(&keys, projector)?,
            deepstack_layers: match projector {
                ProjectorType::Qwen3Vl => deepstack_layers(&keys, n_layer)?,
                _ => Vec::new(),
            },
            minicpmv_version: 0,
            minicpmv_query_num: 0,
        };
        let p = match projector {
            ProjectorType::Minicpmv => minicpmv_queries(&keys, p)?,
            _ => p,
        };
        p.check(&keys)?;
        keys.check_all_read()?;
        Ok(p)
    }

    fn check(&self, keys: &Keys) -> Result<()> {
        let file = keys.file;
        if self.n_embd % self.n_head != 0 {
            return Err(file.error(format!("vision width {} is not a multiple of its {} heads", self.n_embd, self.n_head)).into());
        }
        // The keys a file may state when they agree with what the engine computes.
        if let Some(kv) = keys.opt_size("clip.vision.attention.head_count_kv", 1 << 10)? {
            if kv != self.n_head {
                return Err(EngineError::Unsupported(format!("a vision encoder with {kv} K/V heads for {} query heads", self.n_head)));
            }
        }
        if let Some(hd) = keys.opt_size("clip.vision.attention.head_dim", 1 << 12)? {
            if hd != self.head_dim() {
                return Err(EngineError::Unsupported(format!("a vision head size of {hd} (width {} / {} heads)", self.n_embd, self.n_head)));
            }
        }
        // Gemma 4's image_size is a placeholder (its images take any whole-block size)
        if self.projector != ProjectorType::Gemma4v && self.image_size % self.patch_size != 0 {
            return Err(file.error(format!("image size {} is not whole patches of {}", self.image_size, self.patch_size)).into());
        }
        let side = self.image_size / self.patch_size;
        if self.projector == ProjectorType::Gemma3 && (self.n_merge == 0 || side % self.n_merge != 0) {
            return Err(file.error(format!("{side} patches per side do not pool by {}", self.n_merge)).into());
        }
        // clip.cpp pads a tile's patches to whole blocks but counts its tokens without the
        // padding: only whole blocks give as many rows as it announces
        if self.projector == ProjectorType::Idefics3 && (self.n_merge < 2 || side % self.n_merge != 0) {
            return Err(file.error(format!(
                "clip.vision.projector.scale_factor {} does not shuffle {side} patches per side (idefics3 merges at least 2 per side, \
                 in whole blocks)", self.n_merge)).into());
        }
        // clip.cpp's pixel unshuffle asserts a factor above 1 (its default is 1)
        if self.projector == ProjectorType::Lfm2 && self.n_merge < 2 {
            return Err(file.error(format!(
                "clip.vision.projector.scale_factor {} does not unshuffle (lfm2 merges at least 2 patches per side)", self.n_merge)).into());
        }
        if self.projector.is_qwen_vl() && self.n_merge != 2 {
            return Err(EngineError::Unsupported(format!(
                "clip.vision.spatial_merge_size {}: the Qwen VL graphs merge 2 x 2 patches", self.n_merge)));
        }
        Ok(())
    }
}

/// Qwen2.5-VL's window attention (clip.vision.n_wa_pattern, required there: the converter
/// writes fullatt_block_indexes[0] + 1). clip.cpp sizes the windows 112 pixels whatever
/// clip.vision.window_size says and reads neither it nor wa_layer_indexes for these types:
/// a file giving other windows is refused rather than run as llama.cpp runs it.
fn qwen_window_pattern(keys: &Keys, projector: ProjectorType) -> Result<usize> {
    const PATTERN: &str = "clip.vision.n_wa_pattern";
    if !projector.is_qwen_vl() {
        return Ok(0);
    }
    if let Some(size) = keys.opt_size("clip.vision.window_size", 1 << 16)? {
        if size != QWEN_WINDOW {
            return Err(EngineError::Unsupported(format!(
                "clip.vision.window_size {size}: llama.cpp's Qwen VL graphs use windows of {QWEN_WINDOW} pixels")));
        }
    }
    if keys.get("clip.vision.wa_layer_indexes").is_some() {
        return Err(EngineError::Unsupported("clip.vision.wa_layer_indexes in a Qwen VL projector (llama.cpp goes by n_wa_pattern)".into()));
    }
    match projector {
        ProjectorType::Qwen25Vl => keys.opt_size(PATTERN, 1 << 10)?.ok_or_else(|| keys.missing(PATTERN)),
        // Qwen2-VL's graph would take windows without their inputs, Qwen3-VL's ignores them
        ProjectorType::Qwen2Vl if keys.get(PATTERN).is_some() => {
            Err(EngineError::Unsupported(format!("{PATTERN} in a qwen2vl_merger projector (windows are Qwen2.5-VL's)")))
        }
        _ => {
            keys.get(PATTERN);
            Ok(0)
        }
    }
}

/// Qwen2.5-VL's window side in pixels (clip.cpp's default attn_window_size).
pub const QWEN_WINDOW: usize = 112;

/// clip.vision.is_deepstack_layers: a flag per block.
fn deepstack_layers(keys: &Keys, n_layer: usize) -> Result<Vec<bool>> {
    const KEY: &str = "clip.vision.is_deepstack_layers";
    let Some(v) = keys.get(KEY) else { return Ok(Vec::new()) };
    let flags: Vec<bool> = v.as_array().and_then(|a| a.to_i64_vec()).ok_or_else(|| keys.bad(KEY, "not an array of bools"))?
        .into_iter().map(|f| f != 0).collect();
    if flags.len() != n_layer {
        return Err(keys.bad(KEY, &format!("has {} flags for {n_layer} blocks", flags.len())));
    }
    Ok(flags)
}

/// MiniCPM-V's version and query count (clip.cpp's load_hparams): the version defaults to 2
/// (MiniCPM-V 2.5), the query count to the version's (96 for 2.5, 64 for the later ones).
/// clip.cpp aborts on a version it does not know; the engine refuses it.
fn minicpmv_queries(keys: &Keys, p: VisionParams) -> Result<VisionParams> {
    const VERSION: &str = "clip.minicpmv_version";
    let version = match keys.get(VERSION) {
        None => 2,
        Some(v) => match v.as_i64() {
            Some(0) => 2,
            Some(n @ (2..=6 | 100045)) => n as u32,
            Some(n) => return Err(EngineError::Unsupported(format!("MiniCPM-V version {n} ({VERSION}): known are 2-6 and 100045"))),
            None => return Err(keys.bad(VERSION, "not an integer")),
        },
    };
    const QUERIES: &str = "clip.minicpmv_query_num";
    // 0, as no key, means the version's count
    let queries = match keys.get(QUERIES).map(|v| v.as_u64()) {
        None | Some(Some(0)) => if version == 2 { 96 } else { 64 },
        Some(Some(n)) if n <= 1 << 14 => n as usize,
        Some(_) => return Err(keys.bad(QUERIES, "must be an integer in 0..=16384")),
    };
    Ok(VisionParams { minicpmv_version: version, minicpmv_query_num: queries, ..p })
}

/// The projector type of Qwen2.5-Omni's file, which holds both encoders: its vision half runs as
/// qwen2.5vl_merger, its audio half as qwen2a (clip.cpp corrects the type by modality).
pub const OMNI: &str = "qwen2.5o";

/// Whether a `clip.*` key belongs to the audio encoder (a file with both encoders).
fn is_audio_key(key: &str) -> bool { key.starts_with("clip.audio.") }

/// Whether a tensor belongs to the audio encoder or its projector (a file with both encoders).
pub fn is_audio_tensor(name: &str) -> bool { name.starts_with("a.") || name.starts_with("mm.a.") }

/// The audio projector types the engine runs (clip.cpp's `projector_type` of a file with
/// clip.has_audio_encoder), all on Whisper's encoder (models/whisper-enc.cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioProjectorType {
    /// Ultravox: the encoder's frames stacked, RMS norm, a SwiGLU MLP.
    Ultravox,
    /// Qwen2-Audio (and Qwen2.5-Omni's audio half): the encoder's positions average-pooled by
    /// two before its post-LN, then one fully connected layer with bias.
    Qwen2A,
    /// Voxtral: pooled as Qwen2-Audio, then frames stacked and a GELU (erf) MLP without biases.
    Voxtral,
}

impl AudioProjectorType {
    pub fn name(self) -> &'static str {
        match self {
            AudioProjectorType::Ultravox => "ultravox",
            AudioProjectorType::Qwen2A => "qwen2a",
            AudioProjectorType::Voxtral => "voxtral",
        }
    }

    /// clip_model::audio_has_stack_frames: the head takes rows of stack_factor frames.
    pub fn stacks_frames(self) -> bool {
        matches!(self, AudioProjectorType::Ultravox | AudioProjectorType::Voxtral)
    }

    /// clip_model::audio_has_avgpool: nn.AvgPool1d(2, stride=2) over the positions before the post-LN.
    pub fn avg_pools(self) -> bool {
        matches!(self, AudioProjectorType::Qwen2A | AudioProjectorType::Voxtral)
    }
}

/// An audio projector's hyper-parameters (clip.cpp's audio hparams): the `clip.audio.*` keys and
/// the preprocessing clip.cpp fixes for a Whisper encoder.
#[derive(Debug, Clone)]
pub struct AudioParams {
    pub projector: AudioProjectorType,
    pub n_mel: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub eps: f32,
    /// The width of the output rows: the text model's n_embd.
    pub n_embd_out: usize,
    /// Encoder frames stacked into one row before the head (clip.audio.projector.stack_factor;
    /// 1 for a head that does not stack).
    pub stack_factor: usize,
    /// clip.cpp's Whisper preprocessing: 16 kHz, FFT and window of 400, hop of 160.
    pub sample_rate: usize,
    pub n_fft: usize,
    pub hop_len: usize,
}

impl AudioParams {
    pub fn head_dim(&self) -> usize { self.n_embd / self.n_head }

    pub fn from_gguf(file: &GgufFile) -> Result<AudioParams> {
        let keys = Keys { file, read: RefCell::new(BTreeSet::new()) };
        if keys.opt_bool("clip.has_audio_encoder")? != Some(true) {
            return Err(file.error("clip.has_audio_encoder is not true: no audio encoder in this file").into());
        }
        let ty_name = match keys.get("clip.audio.projector_type") {
            Some(_) => keys.string("clip.audio.projector_type")?,
            None => keys.string("clip.projector_type")?,
        };
        if keys.opt_bool("clip.has_vision_encoder")? == Some(true) {
            if ty_name != OMNI {
                return Err(EngineError::Unsupported(format!("a projector of type '{ty_name}' with both vision and audio encoders")));
            }
            // the vision half's keys are the vision loader's to read or refuse
            keys.leave_to_other(|k| !is_audio_key(k));
        }
        let projector = match ty_name.as_str() {
            "ultravox" => AudioProjectorType::Ultravox,
            "qwen2a" | OMNI => AudioProjectorType::Qwen2A,
            "voxtral" => AudioProjectorType::Voxtral,
            _ => return Err(EngineError::Unsupported(format!(
                "audio projector type '{ty_name}' is not supported (supported: ultravox, qwen2a, voxtral)"))),
        };
        // clip.cpp requires the stack factor where the head stacks frames; Qwen2-Audio's graph
        // ignores it (read here all the same, as clip.cpp reads it)
        let stack_factor = match projector.stacks_frames() {
            true => keys.size("clip.audio.projector.stack_factor", 1 << 10)?,
            false => { keys.opt_size("clip.audio.projector.stack_factor", 1 << 10)?; 1 }
        };
        let p = AudioParams {
            projector,
            n_mel: keys.size("clip.audio.num_mel_bins", 256)?,
            n_embd: keys.size("clip.audio.embedding_length", 1 << 16)?,
            n_ff: keys.size("clip.audio.feed_forward_length", 1 << 18)?,
            n_layer: keys.size("clip.audio.block_count", 1 << 10)?,
            n_head: keys.size("clip.audio.attention.head_count", 1 << 10)?,
            eps: keys.f32("clip.audio.attention.layer_norm_epsilon")?,
            n_embd_out: keys.size("clip.audio.projection_dim", 1 << 18)?,
            stack_factor,
            sample_rate: 16000,
            n_fft: 400,
            hop_len: 160,
        };
        if p.n_embd % p.n_head != 0 {
            return Err(file.error(format!("audio width {} is not a multiple of its {} heads", p.n_embd, p.n_head)).into());
        }
        if let Some(kv) = keys.opt_size("clip.audio.attention.head_count_kv", 1 << 10)? {
            if kv != p.n_head {
                return Err(EngineError::Unsupported(format!("an audio encoder with {kv} K/V heads for {} query heads", p.n_head)));
            }
        }
        if let Some(hd) = keys.opt_size("clip.audio.attention.head_dim", 1 << 12)? {
            if hd != p.head_dim() {
                return Err(EngineError::Unsupported(format!("an audio head size of {hd} (width {} / {} heads)", p.n_embd, p.n_head)));
            }
        }
        keys.check_all_read()?;
        Ok(p)
    }
}

/// The blocks a llava graph runs (models/llava.cpp): all but the last by default (LLaVA takes
/// CLIP's second-to-last layer), else up to the one clip.vision.feature_layer names (0: the
/// embeddings before any block). Several feature layers (Granite's stacked outputs) are refused.
fn llava_feature_layer(keys: &Keys, n_layer: usize) -> Result<usize> {
    const KEY: &str = "clip.vision.feature_layer";
    let Some(v) = keys.get(KEY) else { return Ok(n_layer - 1) };
    let layers = v.as_array().and_then(|a| a.to_i64_vec()).ok_or_else(|| keys.bad(KEY, "not an array of integers"))?;
    match layers.as_slice() {
        [] => Ok(n_layer - 1),
        [l] if (0..=n_layer as i64).contains(l) => Ok(*l as usize),
        [l] => Err(keys.bad(KEY, &format!("layer {l} is not in 0..={n_layer}"))),
        many => Err(EngineError::Unsupported(format!(
            "{KEY} lists {} layers: stacked feature layers (Granite vision) are not supported", many.len()))),
    }
}

/// LLaVA 1.6's image_grid_pinpoints, flattened (width, height) pairs. libmtmd encodes the
/// overview and each tile on its own and concatenates them: mm_patch_merge_type ('spatial_unpad')
/// and the legacy converter's crop/aspect/split keys change nothing it computes (clip.cpp reads
/// the first for an API mtmd does not call, the others not at all), nor does image_newline.
fn llava_pinpoints(keys: &Keys) -> Result<Vec<[usize; 2]>> {
    const KEY: &str = "clip.vision.image_grid_pinpoints";
    for descriptive in ["clip.vision.mm_patch_merge_type", "clip.vision.image_crop_resolution", "clip.vision.image_aspect_ratio",
                        "clip.vision.image_split_resolution", "clip.vision.mm_projector_type"] {
        keys.get(descriptive);
    }
    let Some(v) = keys.get(KEY) else { return Ok(Vec::new()) };
    let xs = v.as_array().and_then(|a| a.to_i64_vec()).ok_or_else(|| keys.bad(KEY, "not an array of integers"))?;
    if xs.len() % 2 != 0 || xs.iter().any(|&x| !(1..=1 << 14).contains(&x)) {
        return Err(keys.bad(KEY, "needs (width, height) pairs of sizes in 1..=16384"));
    }
    Ok(xs.chunks_exact(2).map(|wh| [wh[0] as usize, wh[1] as usize]).collect())
}

/// The file's `clip.*` keys, remembering which were read.
struct Keys<'a> {
    file: &'a GgufFile,
    read: RefCell<BTreeSet<String>>,
}

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&ferrollama_gguf::Value> {
        self.read.borrow_mut().insert(key.to_string());
        self.file.get(key)
    }

    fn missing(&self, key: &str) -> EngineError { self.file.error(format!("missing metadata key {key}")).into() }

    fn bad(&self, key: &str, what: &str) -> EngineError { self.file.error(format!("metadata key {key}: {what}")).into() }

    fn string(&self, key: &str) -> Result<String> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        v.as_str().map(str::to_string).ok_or_else(|| self.bad(key, "not a string"))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.bad(key, "not a bool"))).transpose()
    }

    /// A positive count no larger than `max` (a file's number sizes allocations).
    fn opt_size(&self, key: &str, max: usize) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_u64() {
            Some(n) if n >= 1 && n as usize <= max => Ok(Some(n as usize)),
            _ => Err(self.bad(key, &format!("must be an integer in 1..={max}"))),
        }
    }

    fn size(&self, key: &str, max: usize) -> Result<usize> {
        self.opt_size(key, max)?.ok_or_else(|| self.missing(key))
    }

    fn f32(&self, key: &str) -> Result<f32> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 => Ok(x as f32),
            _ => Err(self.bad(key, "must be a positive number")),
        }
    }

    fn rgb(&self, key: &str) -> Result<[f32; 3]> {
        let v = self.get(key).ok_or_else(|| self.missing(key))?;
        let xs = v.as_array().and_then(|a| a.to_f32_vec()).ok_or_else(|| self.bad(key, "not an array of numbers"))?;
        match xs.as_slice() {
            [r, g, b, ..] if xs.len() == 3 => Ok([*r, *g, *b]),
            _ => Err(self.bad(key, &format!("needs 3 values (one per channel), has {}", xs.len()))),
        }
    }

    /// Marks the keys `other` picks as another loader's (a file's other encoder).
    fn leave_to_other(&self, other: impl Fn(&str) -> bool) {
        let mut read = self.read.borrow_mut();
        read.extend(self.file.metadata.iter().map(|(k, _)| k.as_str()).filter(|k| other(k)).map(str::to_string));
    }

    /// Refuses `clip.*` keys the engine did not read: each one changes what clip.cpp computes
    /// for some projector, and this engine would ignore it.
    fn check_all_read(&self) -> Result<()> {
        // Descriptive keys that change nothing.
        for k in ["clip.has_text_encoder", "clip.has_llava_projector", "clip.has_minicpmv_projector", "clip.has_glm_projector",
                  "clip.has_qwen2vl_merger"] {
            self.get(k);
        }
        let read = self.read.borrow();
        let unread: Vec<&str> = self.file.metadata.iter().map(|(k, _)| k.as_str()).filter(|k| k.starts_with("clip.") && !read.contains(*k)).collect();
        match unread.as_slice() {
            [] => Ok(()),
            keys => Err(EngineError::Unsupported(format!(
                "the projector's metadata key{} {} {} not supported by the engine's projectors",
                if keys.len() > 1 { "s" } else { "" }, keys.join(", "), if keys.len() > 1 { "are" } else { "is" }))),
        }
    }
}
