//! Sliding-window attention rules and the cache sizes llama.cpp derives from them.

use crate::Pos;

/// Which sliding-window rule a cache applies (llama.cpp's `llama_swa_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaType {
    /// No window: every earlier cell of the sequence is visible.
    None,
    /// A token at `p1` does not see a cell at `p0` when `p1 - p0 >= n_swa` (Gemma, Mistral).
    Standard,
    /// Tokens see only cells of their own chunk `[floor(p1/n_swa)*n_swa, ...)` (Llama 4).
    Chunked,
    /// Hidden when `|p1 - p0| > n_swa/2` (bidirectional models).
    Symmetric,
}

/// The sliding window of a cache: its rule and its width in positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwaParams {
    /// Window width in positions.
    pub n_swa: u32,
    /// The rule.
    pub kind: SwaType,
}

impl SwaParams {
    /// No sliding window.
    pub const NONE: SwaParams = SwaParams {
        n_swa: 0,
        kind: SwaType::None,
    };

    /// The standard window of `n_swa` positions.
    pub fn standard(n_swa: u32) -> SwaParams {
        SwaParams {
            n_swa,
            kind: SwaType::Standard,
        }
    }

    /// Whether a window is in force.
    pub fn is_active(&self) -> bool {
        self.kind != SwaType::None
    }

    /// Whether a cell at position `p0` is hidden from a token at position `p1`
    /// (llama.cpp's `llama_hparams::is_masked_swa`). A zero-width chunked window
    /// hides nothing rather than dividing by zero.
    pub fn is_masked(&self, p0: Pos, p1: Pos) -> bool {
        let (p0, p1) = (i64::from(p0), i64::from(p1));
        let n_swa = i64::from(self.n_swa);
        match self.kind {
            SwaType::None => false,
            SwaType::Standard => p1 - p0 >= n_swa,
            SwaType::Chunked => n_swa > 0 && p0 < (p1 / n_swa) * n_swa,
            SwaType::Symmetric => {
                let half = n_swa / 2;
                let diff = p1 - p0;
                diff < -half || diff > half
            }
        }
    }
}

impl SwaParams {
    /// The chunked window of `n_swa` positions (Llama 4's chunked attention).
    pub fn chunked(n_swa: u32) -> SwaParams {
        SwaParams {
            n_swa,
            kind: SwaType::Chunked,
        }
    }

    /// The first position before `p1` a token at `p1` still sees (`p1 + 1` minus the window
    /// behind it): `p1 - n_swa + 1` for a standard window, the start of `p1`'s chunk for a
    /// chunked one, `p1 - n_swa / 2` for a symmetric one; 0 without a window. Never below 0.
    pub fn first_visible(&self, p1: Pos) -> Pos {
        let (p1, n_swa) = (i64::from(p1), i64::from(self.n_swa));
        let first = match self.kind {
            SwaType::None => 0,
            SwaType::Standard => p1 - n_swa + 1,
            SwaType::Chunked if n_swa > 0 => (p1 / n_swa) * n_swa,
            SwaType::Chunked => 0,
            SwaType::Symmetric => p1 - n_swa / 2,
        };
        first.clamp(0, p1.max(0)) as Pos
    }
}

/// llama.cpp's padding of the context (and so of a unified cache) to a multiple of 256 cells
/// (`cparams.n_ctx = GGML_PAD(n_ctx, 256)` in llama_context's constructor). Saturates at the
/// largest multiple of 256 that fits in u32.
pub fn padded_ctx_size(n_ctx: u32) -> u32 {
    pad_to(n_ctx, 256)
}

/// Size of the sliding-window cache of an interleaved (base + SWA) cache, as
/// `llama_kv_cache_iswa` computes it: `GGML_PAD(min(size_base, n_swa * (unified ? n_seq_max : 1)
/// + n_ubatch), 256)`, or `size_base` when `swa_full`.
pub fn swa_cache_size(
    size_base: u32,
    n_swa: u32,
    n_seq_max: u32,
    unified: bool,
    n_ubatch: u32,
    swa_full: bool,
) -> u32 {
    if swa_full {
        return size_base;
    }
    let seqs = if unified { u64::from(n_seq_max) } else { 1 };
    let want = u64::from(n_swa) * seqs + u64::from(n_ubatch);
    let capped = want.min(u64::from(size_base)) as u32;
    pad_to(capped, 256)
}

/// `GGML_PAD(x, n)`: x rounded up to a multiple of n (saturating instead of overflowing).
pub(crate) fn pad_to(x: u32, n: u32) -> u32 {
    let n = n.max(1);
    let padded = u64::from(x).div_ceil(u64::from(n)) * u64::from(n);
    if padded > u64::from(u32::MAX) {
        u32::MAX / n * n
    } else {
        padded as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_window_hides_at_distance_n_swa() {
        let w = SwaParams::standard(4);
        assert!(!w.is_masked(10, 13));
        assert!(w.is_masked(10, 14));
        assert!(!w.is_masked(10, 10));
        assert!(!SwaParams::NONE.is_masked(0, 1_000_000));
    }

    #[test]
    fn chunked_window_hides_previous_chunks() {
        let w = SwaParams {
            n_swa: 4,
            kind: SwaType::Chunked,
        };
        assert!(w.is_masked(3, 4), "4 starts a new chunk");
        assert!(!w.is_masked(4, 7));
        assert!(w.is_masked(7, 8));
        let zero = SwaParams {
            n_swa: 0,
            kind: SwaType::Chunked,
        };
        assert!(!zero.is_masked(0, 5));
    }

    #[test]
    fn first_visible_is_the_first_position_the_window_keeps() {
        for w in [SwaParams::standard(4), SwaParams::chunked(4)] {
            for p1 in 0..20 {
                let first = w.first_visible(p1);
                assert!(!w.is_masked(first, p1), "{w:?} {p1}");
                assert!(first == 0 || w.is_masked(first - 1, p1), "{w:?} {p1}");
            }
        }
        assert_eq!(SwaParams::chunked(4).first_visible(9), 8);
        assert_eq!(SwaParams::standard(4).first_visible(9), 6);
        assert_eq!(SwaParams::NONE.first_visible(9), 0);
    }

    #[test]
    fn symmetric_window_hides_both_sides() {
        let w = SwaParams {
            n_swa: 4,
            kind: SwaType::Symmetric,
        };
        assert!(!w.is_masked(10, 12));
        assert!(w.is_masked(10, 13));
        assert!(!w.is_masked(12, 10));
        assert!(w.is_masked(13, 10));
    }

    #[test]
    fn sizes_follow_llama_cpp() {
        assert_eq!(padded_ctx_size(16), 256);
        assert_eq!(padded_ctx_size(256), 256);
        assert_eq!(padded_ctx_size(257), 512);
        assert_eq!(padded_ctx_size(u32::MAX), u32::MAX / 256 * 256);
        // gemma-3 270m: n_swa 512; n_ctx 1024 and n_ubatch 128 -> min(1024, 640) padded = 768
        assert_eq!(swa_cache_size(1024, 512, 1, true, 128, false), 768);
        assert_eq!(swa_cache_size(256, 512, 1, true, 32, false), 256);
        assert_eq!(swa_cache_size(4096, 512, 4, true, 512, false), 2560);
        assert_eq!(swa_cache_size(4096, 512, 4, false, 512, false), 1024);
        assert_eq!(swa_cache_size(4096, 512, 1, true, 512, true), 4096);
    }
}
