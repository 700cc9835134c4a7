//! The user's batch (llama_batch): tokens (or embedding rows, as mtmd feeds an image) with
//! positions, sequence ids and output flags.

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq_ids: Vec<Vec<i32>>,
    pub logits: Vec<bool>,
    /// Input embeddings instead of tokens: one row of `n_embd` per entry (empty for a batch of
    /// tokens, whose `tokens` then hold the ids; for a batch of embeddings they are all 0).
    pub embd: Vec<f32>,
    pub n_embd: usize,
    /// Each entry's four M-RoPE positions (time, height, width, extra), for a batch of
    /// embeddings given them (mtmd's 2-D positions of an image's tokens; a model with M-RoPE
    /// only); `pos` holds the time positions. Empty: a text token's (pos, pos, pos, 0).
    pub pos_mrope: Vec<[i32; 4]>,
    n_tokens_max: usize,
    n_seq_max: usize,
}

impl Batch {
    pub fn new(n_tokens_max: usize, n_seq_max: usize) -> Result<Batch> {
        if n_tokens_max == 0 || n_seq_max == 0 {
            return Err(EngineError::InvalidArgument("a batch needs n_tokens_max >= 1 and n_seq_max >= 1".into()));
        }
        Ok(Batch { n_tokens_max, n_seq_max, ..Default::default() })
    }

    /// A batch of consecutive positions of one sequence; `logits` is "last", "all" or "none".
    pub fn from_tokens(tokens: &[u32], pos0: i32, seq_id: i32, logits: &str) -> Result<Batch> {
        let mut b = Batch::new(tokens.len().max(1), 1)?;
        let n = tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            let want = match logits {
                "last" => i + 1 == n,
                "all" => true,
                "none" => false,
                other => return Err(EngineError::InvalidArgument(format!("logits must be 'last', 'all' or 'none', not '{other}'"))),
            };
            let pos = pos0.checked_add(i as i32).ok_or_else(|| EngineError::InvalidArgument("position overflows".into()))?;
            b.add(t, pos, &[seq_id], want)?;
        }
        Ok(b)
    }

    /// A batch of embedding rows (`embd`: n rows of `n_embd`) at consecutive positions of one
    /// sequence; `logits` as in `from_tokens`.
    pub fn from_embeddings(embd: Vec<f32>, n_embd: usize, pos0: i32, seq_id: i32, logits: &str) -> Result<Batch> {
        if n_embd == 0 || embd.is_empty() || embd.len() % n_embd != 0 {
            return Err(EngineError::InvalidArgument(format!(
                "embeddings must be whole rows of n_embd = {n_embd} values, got {}", embd.len())));
        }
        let mut b = Batch::from_tokens(&vec![0; embd.len() / n_embd], pos0, seq_id, logits)?;
        b.embd = embd;
        b.n_embd = n_embd;
        Ok(b)
    }

    /// A batch of embedding rows (`embd`: n rows of `n_embd`) of one sequence at the M-RoPE
    /// positions `positions` (one (time, height, width, extra) per row, as llama.cpp's batch
    /// of embeddings for such a model carries them); `logits` as in `from_tokens`. Positions
    /// need not be consecutive: all of an image's tokens share their time position.
    pub fn from_embeddings_mrope(embd: Vec<f32>, n_embd: usize, positions: &[[i32; 4]], seq_id: i32, logits: &str) -> Result<Batch> {
        let mut b = Batch::from_embeddings(embd, n_embd, 0, seq_id, logits)?;
        if positions.len() != b.len() {
            return Err(EngineError::InvalidArgument(format!(
                "{} M-RoPE positions for {} embedding rows: one (time, height, width, extra) per row", positions.len(), b.len())));
        }
        if let Some(p) = positions.iter().find(|p| p.iter().any(|&v| v < 0)) {
            return Err(EngineError::InvalidArgument(format!("M-RoPE positions {p:?} are negative")));
        }
        b.pos = positions.iter().map(|p| p[0]).collect();
        b.pos_mrope = positions.to_vec();
        Ok(b)
    }

    /// Whether the batch carries embeddings instead of token ids.
    pub fn has_embeddings(&self) -> bool { !self.embd.is_empty() }

    /// The embedding row of entry `i` (a batch of embeddings only).
    pub fn embd_row(&self, i: usize) -> &[f32] { &self.embd[i * self.n_embd..(i + 1) * self.n_embd] }

    pub fn add(&mut self, token: u32, pos: i32, seq_ids: &[i32], logits: bool) -> Result<()> {
        if self.has_embeddings() {
            return Err(EngineError::InvalidArgument("a batch of embeddings takes no tokens".into()));
        }
        if self.tokens.len() >= self.n_tokens_max {
            return Err(EngineError::InvalidArgument(format!("the batch is full ({} tokens)", self.n_tokens_max)));
        }
        if seq_ids.is_empty() || seq_ids.len() > self.n_seq_max {
            return Err(EngineError::InvalidArgument(format!(
                "a token needs between 1 and {} sequence ids, got {}", self.n_seq_max, seq_ids.len()
            )));
        }
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq_ids.push(seq_ids.to_vec());
        self.logits.push(logits);
        Ok(())
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.seq_ids.clear();
        self.logits.clear();
        self.embd.clear();
        self.pos_mrope.clear();
    }

    pub fn len(&self) -> usize { self.tokens.len() }
    pub fn is_empty(&self) -> bool { self.tokens.is_empty() }
    pub fn n_tokens_max(&self) -> usize { self.n_tokens_max }
}
