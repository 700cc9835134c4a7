//! grammar: constrains the candidates to tokens a GBNF grammar allows next.

use std::sync::{Arc, OnceLock};

use crate::candidates::{Candidates, TokenData};
use crate::error::SamplingError;
use crate::grammar::matcher::{DecodedVocab, GrammarCandidate, Matcher, RejectScratch};
use crate::grammar::{self, parse_rules_with_pieces, PartialUtf8};
use crate::json_schema;
use crate::pieces::TokenPieces;
use crate::sampler::Sampler;

/// `llama_sampler_init_grammar(vocab, gbnf, root)`: every candidate the grammar does not
/// allow next gets a -inf logit; end-of-generation tokens are allowed only where the
/// grammar can end; `accept` advances the grammar.
#[derive(Debug)]
pub struct Grammar {
    pieces: Arc<TokenPieces>,
    is_eog: Arc<Vec<bool>>,
    decoded: Arc<OnceLock<DecodedVocab>>,
    matcher: Matcher,
    last_rejected: Option<u32>,
    scratch: RejectScratch,
    cands: Vec<GrammarCandidate>,
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar {
            pieces: Arc::clone(&self.pieces),
            is_eog: Arc::clone(&self.is_eog),
            decoded: Arc::clone(&self.decoded),
            matcher: self.matcher.clone(),
            last_rejected: self.last_rejected,
            scratch: RejectScratch::default(),
            cands: Vec::new(),
        }
    }
}

impl Grammar {
    /// Parses `gbnf` (with `root` as the start rule) for a vocabulary.
    pub fn new(pieces: Arc<TokenPieces>, gbnf: &str, root: &str) -> Result<Self, SamplingError> {
        let parsed = parse_rules_with_pieces(gbnf, Some(&pieces))?;
        let compiled = grammar::Grammar::compile(parsed, root, gbnf.as_bytes())?;
        Ok(Self::from_grammar(pieces, Arc::new(compiled)))
    }

    /// A sampler for an already compiled grammar.
    pub fn from_grammar(pieces: Arc<TokenPieces>, compiled: Arc<grammar::Grammar>) -> Self {
        let is_eog = Arc::new(pieces.eog_flags());
        Grammar {
            pieces,
            is_eog,
            decoded: Arc::new(OnceLock::new()),
            matcher: Matcher::new(compiled),
            last_rejected: None,
            scratch: RejectScratch::default(),
            cands: Vec::new(),
        }
    }

    /// A sampler for the grammar llama.cpp's converter makes of a JSON schema.
    pub fn from_json_schema(pieces: Arc<TokenPieces>, schema: &serde_json::Value) -> Result<Self, SamplingError> {
        let gbnf = json_schema::to_gbnf(schema)?;
        Self::new(pieces, &gbnf, "root")
    }

    /// The grammar state.
    pub fn matcher(&self) -> &Matcher {
        &self.matcher
    }

    /// The last token `accept` refused (the grammar state was left as it was), if any.
    pub fn last_rejected(&self) -> Option<u32> {
        self.last_rejected
    }

    fn eog(&self, token: u32) -> bool {
        self.is_eog.get(token as usize).copied().unwrap_or(false)
    }

    /// Whether the grammar allows `token` next: what llama.cpp's sampler checks by
    /// applying the grammar to a one-candidate array.
    pub fn allows(&mut self, token: u32) -> bool {
        let mut single = Candidates { data: vec![TokenData { id: token, logit: 1.0, p: 0.0 }], selected: None, sorted: false };
        self.apply(&mut single);
        single.data[0].logit != f32::NEG_INFINITY
    }

    /// Advances the grammar by `token` (llama_grammar_accept_impl). An end-of-generation
    /// token is accepted only where the grammar can end, and changes nothing. A token the
    /// grammar does not allow is an error and leaves the state unchanged.
    pub fn try_accept(&mut self, token: u32) -> Result<(), SamplingError> {
        if token as usize >= self.pieces.n_vocab() {
            return Err(SamplingError::TokenOutOfRange { token, n_vocab: self.pieces.n_vocab() });
        }
        if self.eog(token) {
            return if self.matcher.is_complete() { Ok(()) } else { Err(SamplingError::GrammarRejected { token }) };
        }
        if self.matcher.accept_token(token, self.pieces.piece(token)) {
            Ok(())
        } else {
            Err(SamplingError::GrammarRejected { token })
        }
    }

    /// Fills `cands` with the candidates to check, their pieces decoded: from the shared
    /// cache when no UTF-8 sequence is pending, else afresh into `fresh`. Candidates that
    /// can never match get -inf. Returns whether the cache was used.
    fn collect(&self, c: &mut Candidates, allow_eog: bool, fresh: &mut Vec<u32>, cands: &mut Vec<GrammarCandidate>) -> bool {
        let pending: PartialUtf8 = self.matcher.partial_utf8();
        let use_cache = pending.n_remain <= 0;
        let decoded = use_cache.then(|| self.decoded.get_or_init(|| DecodedVocab::new(&self.pieces.pieces)));
        cands.clear();
        for (i, t) in c.data.iter_mut().enumerate() {
            let Some(piece) = self.pieces.pieces.get(t.id as usize) else {
                t.logit = f32::NEG_INFINITY;
                continue;
            };
            if self.eog(t.id) {
                if !allow_eog {
                    t.logit = f32::NEG_INFINITY;
                }
            } else if piece.first().copied().unwrap_or(0) == 0 {
                t.logit = f32::NEG_INFINITY;
            } else if let Some(d) = decoded {
                let id = t.id as usize;
                cands.push(GrammarCandidate { index: i as u32, cp: d.start[id], partial: d.partial[id], id: t.id });
            } else {
                let cp = fresh.len() as u32;
                let partial = grammar::decode_utf8(piece, pending, fresh);
                cands.push(GrammarCandidate { index: i as u32, cp, partial, id: t.id });
            }
        }
        use_cache
    }
}

impl Sampler for Grammar {
    fn name(&self) -> &'static str {
        "grammar"
    }

    fn apply(&mut self, c: &mut Candidates) {
        let allow_eog = self.matcher.is_complete();
        let mut fresh = Vec::new();
        let mut cands = std::mem::take(&mut self.cands);
        let from_cache = self.collect(c, allow_eog, &mut fresh, &mut cands);
        let cps: &[u32] = match (from_cache, self.decoded.get()) {
            (true, Some(d)) => &d.cps,
            _ => &fresh,
        };
        let rejects = self.matcher.reject(&cands, cps, &mut self.scratch);
        for reject in &rejects {
            c.data[reject.index as usize].logit = f32::NEG_INFINITY;
        }
        self.scratch.give(rejects);
        self.cands = cands;
    }

    fn accept(&mut self, token: u32) {
        self.last_rejected = self.try_accept(token).err().map(|_| token);
    }

    fn reset(&mut self) {
        self.matcher.reset();
        self.last_rejected = None;
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(self.clone())
    }

    fn as_grammar_mut(&mut self) -> Option<&mut Grammar> {
        Some(self)
    }
}
