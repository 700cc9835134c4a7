//! The user's batch (llama_batch): tokens with positions, sequence ids and output flags.

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq_ids: Vec<Vec<i32>>,
    pub logits: Vec<bool>,
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

    pub fn add(&mut self, token: u32, pos: i32, seq_ids: &[i32], logits: bool) -> Result<()> {
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
    }

    pub fn len(&self) -> usize { self.tokens.len() }
    pub fn is_empty(&self) -> bool { self.tokens.is_empty() }
    pub fn n_tokens_max(&self) -> usize { self.n_tokens_max }
}
