//! Loading a vocabulary from GGUF metadata, step by step as `llama_vocab::impl::load`.

use ferrollama_gguf::{Array, GgufFile, Strings, Value};

use crate::attr::TokenAttr;
use crate::texts::{TextTable, Texts};
use crate::pretok::{self, PreKind};
use crate::{bpe, detok, partition, plamo2, rwkv, stdlib, ugm};
use crate::{Model, Options, SpecialTokens, Token, TokenData, Vocab, VocabError, VocabType};

fn invalid(msg: impl Into<String>) -> VocabError { VocabError::Invalid(msg.into()) }

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// A special-id slot of [`SpecialTokens`].
#[derive(Debug, Clone, Copy)]
enum Slot { Bos, Eos, Eot, Eom, Unk, Sep, Pad, Mask, FimPre, FimSuf, FimMid, FimPad, FimRep, FimSep }

fn slot(s: &mut SpecialTokens, which: Slot) -> &mut Option<Token> {
    match which {
        Slot::Bos => &mut s.bos, Slot::Eos => &mut s.eos, Slot::Eot => &mut s.eot,
        Slot::Eom => &mut s.eom, Slot::Unk => &mut s.unk, Slot::Sep => &mut s.sep,
        Slot::Pad => &mut s.pad, Slot::Mask => &mut s.mask, Slot::FimPre => &mut s.fim_pre,
        Slot::FimSuf => &mut s.fim_suf, Slot::FimMid => &mut s.fim_mid, Slot::FimPad => &mut s.fim_pad,
        Slot::FimRep => &mut s.fim_rep, Slot::FimSep => &mut s.fim_sep,
    }
}

/// The special-id keys llama.cpp reads, in its order; the deprecated prefix/suffix/middle
/// keys write the FIM slots again.
const SPECIAL_KEYS: &[(&str, Slot)] = &[
    ("tokenizer.ggml.bos_token_id", Slot::Bos),
    ("tokenizer.ggml.eos_token_id", Slot::Eos),
    ("tokenizer.ggml.eot_token_id", Slot::Eot),
    ("tokenizer.ggml.eom_token_id", Slot::Eom),
    ("tokenizer.ggml.unknown_token_id", Slot::Unk),
    ("tokenizer.ggml.seperator_token_id", Slot::Sep),
    ("tokenizer.ggml.padding_token_id", Slot::Pad),
    ("tokenizer.ggml.mask_token_id", Slot::Mask),
    ("tokenizer.ggml.fim_pre_token_id", Slot::FimPre),
    ("tokenizer.ggml.fim_suf_token_id", Slot::FimSuf),
    ("tokenizer.ggml.fim_mid_token_id", Slot::FimMid),
    ("tokenizer.ggml.fim_pad_token_id", Slot::FimPad),
    ("tokenizer.ggml.fim_rep_token_id", Slot::FimRep),
    ("tokenizer.ggml.fim_sep_token_id", Slot::FimSep),
    ("tokenizer.ggml.prefix_token_id", Slot::FimPre),
    ("tokenizer.ggml.suffix_token_id", Slot::FimSuf),
    ("tokenizer.ggml.middle_token_id", Slot::FimMid),
];

fn get_bool(f: &GgufFile, key: &str) -> Result<Option<bool>, VocabError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(invalid(format!("{key} has type {}, expected BOOL", v.type_name()))),
    }
}

fn get_string(f: &GgufFile, key: &str) -> Result<Option<String>, VocabError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Str(s)) => Ok(Some(String::from_utf8_lossy(s).into_owned())),
        Some(v) => Err(invalid(format!("{key} has type {}, expected STRING", v.type_name()))),
    }
}

fn get_u32(f: &GgufFile, key: &str) -> Result<Option<u32>, VocabError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64().and_then(|x| u32::try_from(x).ok()) {
            Some(x) if !matches!(v, Value::Bool(_)) => Ok(Some(x)),
            _ => Err(invalid(format!("{key} is not a 32-bit unsigned integer"))),
        },
    }
}

fn get_array<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a Array>, VocabError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(invalid(format!("invalid gguf type for {key}: {}", v.type_name()))),
    }
}

/// What the `tokenizer.ggml.model` switch decides.
struct ModelChoice {
    vocab_type: VocabType,
    special: SpecialTokens,
    needs_merges: bool,
}

fn choose_model(model: &str, pre: &str) -> Result<ModelChoice, VocabError> {
    let ids = |bos, eos, unk, sep, pad, mask| SpecialTokens { bos, eos, unk, sep, pad, mask, nl: Some(13), ..Default::default() };
    Ok(match model {
        "llama" => ModelChoice { vocab_type: VocabType::Spm, special: ids(Some(1), Some(2), Some(0), None, None, None), needs_merges: false },
        "bert" => ModelChoice { vocab_type: VocabType::Wpm, special: ids(Some(101), None, Some(100), Some(102), Some(0), Some(103)), needs_merges: false },
        "gpt2" | "hybriddna" | "whitespace" => ModelChoice {
            vocab_type: VocabType::Bpe,
            special: ids(Some(11), Some(11), None, None, None, None),
            needs_merges: pre != "kimi-k2",
        },
        "gemma4" => ModelChoice { vocab_type: VocabType::Bpe, special: ids(None, None, None, None, None, None), needs_merges: true },
        "t5" => ModelChoice { vocab_type: VocabType::Ugm, special: ids(None, Some(1), Some(2), None, Some(0), None), needs_merges: false },
        "rwkv" => ModelChoice { vocab_type: VocabType::Rwkv, special: ids(None, None, None, None, None, None), needs_merges: false },
        "no_vocab" | "none" => return Err(VocabError::Unsupported(format!("tokenizer model '{model}' (model without vocabulary)"))),
        "plamo2" => ModelChoice { vocab_type: VocabType::Plamo2, special: ids(Some(1), Some(2), Some(0), None, Some(3), None), needs_merges: false },
        "test" => return Err(VocabError::Unsupported("tokenizer model 'test' (llama.cpp's test-only tokenizer)".into())),
        other => return Err(VocabError::Unsupported(format!("unknown tokenizer model '{other}'"))),
    })
}

/// Default options per algorithm, before the GGUF keys override them.
fn default_options(vocab_type: VocabType, pre: Option<&pretok::PreEntry>) -> Options {
    let mut o = Options { escape_whitespaces: true, lowercase: true, strip_accents: true, ..Default::default() };
    match vocab_type {
        VocabType::Bpe => {
            let e = pre.copied().unwrap_or_else(|| *pretok::lookup("default").expect("default pre-tokenizer"));
            o.add_space_prefix = false;
            o.escape_whitespaces = e.escape_whitespaces;
            o.clean_spaces = e.clean_spaces;
            o.ignore_merges = e.ignore_merges;
            o.add_bos = e.add_bos;
            o.add_sep = e.add_sep;
            if e.no_lowercase {
                o.lowercase = false;
            }
        }
        VocabType::Spm => {
            o.add_space_prefix = true;
            o.add_bos = true;
        }
        VocabType::Wpm => {
            o.clean_spaces = true;
            o.add_bos = true;
            o.add_sep = true;
        }
        VocabType::Ugm => o.add_eos = true,
        VocabType::Rwkv | VocabType::Plamo2 => {}
    }
    o
}

/// The tokens' scores and attributes, and their texts (empty ones named "[EMPTY_<id>]") with
/// their index ([`index_texts`]).
fn read_tokens(f: &GgufFile, byte_level: bool) -> Result<(Vec<TokenData>, IndexedTexts), VocabError> {
    let list = get_array(f, KEY_TOKENS)?.ok_or_else(|| invalid("cannot find tokenizer vocab in model file"))?;
    let texts = list.as_strs().ok_or_else(|| invalid(format!("invalid gguf type for {KEY_TOKENS}")))?;
    let n = texts.len();
    if n >= i32::MAX as usize {
        return Err(invalid("too many tokens"));
    }
    let scores = match get_array(f, KEY_SCORES)? {
        None => None,
        Some(a @ (Array::F32(_) | Array::I32(_))) => {
            if a.len() < n {
                return Err(invalid(format!("Index out of array bounds for scores ({} < {n})", a.len())));
            }
            a.to_f32_vec()
        }
        Some(_) => return Err(invalid(format!("invalid gguf type for {KEY_SCORES}"))),
    };
    let types = match get_array(f, KEY_TYPES)? {
        None => None,
        Some(Array::I32(t)) if t.len() >= n => Some(t),
        Some(Array::I32(t)) => return Err(invalid(format!("Index out of array bounds for toktypes ({} < {n})", t.len()))),
        Some(_) => return Err(invalid(format!("invalid gguf type for {KEY_TYPES}"))),
    };
    let tokens = (0..n)
        .map(|i| TokenData {
            score: scores.as_ref().map_or(0.0, |s| s[i]),
            attr: types.map_or(TokenAttr::NORMAL, |t| TokenAttr::from_token_type(t[i] as i64)),
        })
        .collect();
    Ok((tokens, index_texts(texts, byte_level)?))
}

/// Token texts, each findable by its text.
struct IndexedTexts {
    texts: TextTable,
    /// Byte-level BPE: the texts decoded, indexed where they decode (the BPE keys); `texts`
    /// then indexes only those that do not. None: `texts` indexes every text.
    decoded: Option<TextTable>,
}

/// The token texts by id and by text (llama.cpp's `id_to_token[].text` and `token_to_id`).
/// A byte-level BPE vocabulary has its texts indexed decoded (its BPE keys, needed anyway),
/// and only those that do not decode as they are: one index holds each token, not two.
fn index_texts(texts: &Strings, byte_level: bool) -> Result<IndexedTexts, VocabError> {
    let total_len = texts.total_len();
    let empty_text = |id: usize| format!("[EMPTY_{id}]");
    let mut all = Texts::with_capacity(texts.len(), total_len);
    for (id, text) in texts.iter().enumerate() {
        if text.is_empty() {
            all.push(empty_text(id).as_bytes())?;
        } else {
            all.push(text)?;
        }
    }
    let duplicate = |(first, second): (u32, u32)| {
        let text = match &texts[first as usize] {
            t if t.is_empty() => empty_text(first as usize),
            t => String::from_utf8_lossy(t).into_owned(),
        };
        invalid(format!("duplicate token in vocabulary: '{text}' has ids {first} and {second}"))
    };
    if !byte_level {
        let texts = TextTable::build(all, |_| true).map_err(duplicate)?;
        return Ok(IndexedTexts { texts, decoded: None });
    }
    let (decoded, decodes) = bpe::decode_texts(&all)?;
    let texts = TextTable::build(all, |id| !decodes[id as usize]);
    let decoded = TextTable::build(decoded, |id| decodes[id as usize]);
    match (texts, decoded) {
        (Ok(texts), Ok(decoded)) => Ok(IndexedTexts { texts, decoded: Some(decoded) }),
        // the first repeat in id order, as one index of all texts would find it
        (Err(a), Err(b)) => Err(duplicate(if a.1 < b.1 { a } else { b })),
        (Err(repeat), _) | (_, Err(repeat)) => Err(duplicate(repeat)),
    }
}

/// hybriddna: k-mer texts carry a marker (U+E000) in the lookup table that the token texts
/// lose, so the k-mers detokenize to bare DNA. The token texts with the markers dropped, if
/// the vocabulary has k-mers (after "<oov>").
fn strip_dna_markers(v: &Vocab) -> Result<Option<Texts>, VocabError> {
    const MARKER: &[u8] = "\u{E000}".as_bytes();
    let Some(oov) = v.text_to_token(b"<oov>") else { return Ok(None) };
    let texts = v.texts.texts();
    let mut stripped = Texts::with_capacity(texts.len(), texts.total_len());
    for (id, text) in texts.iter().enumerate() {
        let is_kmer = id > oov as usize && text.len() > MARKER.len() && text.ends_with(MARKER);
        stripped.push(if is_kmer { &text[..text.len() - MARKER.len()] } else { text })?;
    }
    Ok(Some(stripped))
}

/// Time spent in each named step of [`load`], in order.
pub type Phases = Vec<(&'static str, std::time::Duration)>;

/// Records how long each step of the load takes (a few `Instant::now` calls per load).
struct PhaseClock<'a> {
    phases: Option<&'a mut Phases>,
    last: std::time::Instant,
}

impl PhaseClock<'_> {
    /// Ends the current step under `name`.
    fn done(&mut self, name: &'static str) {
        if let Some(phases) = self.phases.as_deref_mut() {
            let now = std::time::Instant::now();
            phases.push((name, now - self.last));
            self.last = now;
        }
    }
}

/// Loads a vocabulary.
pub fn load(f: &GgufFile) -> Result<Vocab, VocabError> { load_timed(f, None) }

/// [`load`], recording the time of each step into `phases` when given.
pub fn load_timed(f: &GgufFile, phases: Option<&mut Phases>) -> Result<Vocab, VocabError> {
    let mut clock = PhaseClock { phases, last: std::time::Instant::now() };
    let model_name = get_string(f, KEY_MODEL)?.ok_or_else(|| invalid(format!("key not found in model: {KEY_MODEL}")))?;
    let mut pre_name = get_string(f, KEY_PRE)?.unwrap_or_default();
    let choice = choose_model(&model_name, &pre_name)?;
    if model_name == "gemma4" {
        pre_name = "gemma4".into();
    }
    let pre_entry = match choice.vocab_type {
        VocabType::Bpe => Some(pretok::lookup(&pre_name).ok_or_else(|| VocabError::Unsupported(format!("unknown pre-tokenizer type: '{pre_name}'")))?),
        _ => None,
    };
    if pre_name.is_empty() {
        pre_name = "default".into();
    }
    let mut special = choice.special;
    if pre_entry.is_some_and(|e| e.no_bos) {
        special.bos = None;
    }
    let mut opts = default_options(choice.vocab_type, pre_entry);
    if let Some(v) = get_bool(f, "tokenizer.ggml.add_space_prefix")? {
        opts.add_space_prefix = v;
    }
    if let Some(v) = get_bool(f, "tokenizer.ggml.remove_extra_whitespaces")? {
        opts.remove_extra_whitespaces = v;
    }

    let no_merges = Strings::default();
    let merges = if choice.vocab_type == VocabType::Bpe { read_merges(f, choice.needs_merges)? } else { None }.unwrap_or(&no_merges);
    clock.done("options and merges");
    let kind = pre_entry.map_or(PreKind::Default, |e| e.kind);
    let byte_level = choice.vocab_type == VocabType::Bpe && pretok::byte_encode(kind);
    let (tokens, IndexedTexts { texts, decoded }) = read_tokens(f, byte_level)?;
    clock.done("tokens");

    // (hybriddna's changed texts are made once the model finds tokens by text: only the BPE
    // models below get the texts, which they take unchanged)
    let model = match choice.vocab_type {
        VocabType::Spm => Model::Spm,
        VocabType::Wpm => Model::Wpm,
        VocabType::Bpe => {
            let keys = decoded.unwrap_or_else(|| texts.clone());
            Model::Bpe(Box::new(bpe::Bpe::new(&model_name, kind, &texts, keys, merges)?))
        }
        VocabType::Ugm => Model::Ugm(Box::new(ugm::Ugm::new(f, &tokens, texts.texts())?)),
        VocabType::Rwkv => Model::Rwkv(rwkv::Rwkv::new(texts.texts())),
        VocabType::Plamo2 => Model::Plamo2(Box::new(plamo2::Plamo2::new(&tokens, texts.texts(), &texts)?)),
    };
    clock.done("model tables");

    let mut vocab = Vocab {
        model_name,
        pre_name,
        vocab_type: choice.vocab_type,
        tokens,
        texts,
        changed_texts: None,
        special,
        opts,
        max_token_len: 0,
        eog: Vec::new(),
        special_cache: Vec::new(),
        special_index: Default::default(),
        suppress: Vec::new(),
        model,
    };
    if vocab.model_name == "hybriddna" {
        vocab.changed_texts = strip_dna_markers(&vocab)?;
    }
    vocab.max_token_len = vocab.token_texts().longest();
    vocab.special.nl = newline_token(&vocab)?;
    read_special_ids(f, &mut vocab)?;
    read_flags(f, &mut vocab)?;
    vocab.suppress = read_suppress(f, vocab.tokens.len())?;
    clock.done("special ids");
    detect_by_text(&mut vocab)?;
    clock.done("detect by text");
    vocab.special_cache = special_cache(&vocab);
    clock.done("special cache");
    detok::check_pieces(&vocab)?;
    clock.done("pieces");
    set_model_attrs(f, &mut vocab)?;
    partition::prepare(&mut vocab);
    clock.done("special index");
    Ok(vocab)
}

/// The merges ("first second", in rank order); None when the file has none and the model
/// does not require them.
fn read_merges(f: &GgufFile, required: bool) -> Result<Option<&Strings>, VocabError> {
    let Some(array) = get_array(f, KEY_MERGES)? else {
        return if required { Err(invalid("cannot find tokenizer merges in model file")) } else { Ok(None) };
    };
    array.as_strs().map(Some).ok_or_else(|| invalid(format!("invalid gguf type for {KEY_MERGES}")))
}

/// The newline token: SPM's byte token for '\n' (else PAD), WPM's PAD, the others'
/// tokenization of "\n" (done before the special ids are read, with the defaults).
fn newline_token(v: &Vocab) -> Result<Option<Token>, VocabError> {
    Ok(match v.vocab_type {
        VocabType::Spm => spm::byte_to_token(v, b'\n').or(v.special.pad),
        VocabType::Wpm => v.special.pad,
        VocabType::Rwkv => match v.tokenize(b"\n", false, false)?.first() {
            Some(&t) => Some(t),
            None => return Err(invalid("model vocab missing newline token")),
        },
        _ => match v.tokenize(b"\n", false, false)?.first() {
            Some(&t) => Some(t),
            None => v.special.pad,
        },
    })
}

use crate::spm;

fn read_special_ids(f: &GgufFile, v: &mut Vocab) -> Result<(), VocabError> {
    let n = v.tokens.len();
    for &(key, which) in SPECIAL_KEYS {
        let current = slot(&mut v.special, which);
        if current.is_some_and(|id| id as usize >= n) {
            *current = None; // a default out of the vocabulary's range is disabled
        }
        if let Some(id) = get_u32(f, key)? {
            if (id as usize) < n {
                *slot(&mut v.special, which) = Some(id);
            }
        }
    }
    Ok(())
}

fn read_flags(f: &GgufFile, v: &mut Vocab) -> Result<(), VocabError> {
    if let Some(b) = get_bool(f, "tokenizer.ggml.add_bos_token")? {
        v.opts.add_bos = b;
    }
    if let Some(b) = get_bool(f, "tokenizer.ggml.add_eos_token")? {
        v.opts.add_eos = b;
    }
    if let Some(b) = get_bool(f, "tokenizer.ggml.add_sep_token")? {
        v.opts.add_sep = b;
    }
    if matches!(&v.model, Model::Bpe(b) if b.kind == PreKind::Gemma4) {
        v.opts.add_bos = true;
    }
    if let Some(b) = get_bool(f, "tokenizer.ggml.normalizer.lowercase")? {
        v.opts.lowercase = b;
    }
    v.opts.strip_accents = v.opts.lowercase;
    if let Some(b) = get_bool(f, "tokenizer.ggml.normalizer.strip_accents")? {
        v.opts.strip_accents = b;
    }
    Ok(())
}

fn read_suppress(f: &GgufFile, n: usize) -> Result<Vec<Token>, VocabError> {
    match get_array(f, "tokenizer.ggml.suppress_tokens")? {
        None => Ok(Vec::new()),
        Some(Array::I32(ids)) => Ok(ids.iter().filter(|&&id| id >= 0 && (id as usize) < n).map(|&id| id as Token).collect()),
        Some(_) => Err(invalid("invalid gguf type for tokenizer.ggml.suppress_tokens")),
    }
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

fn is_one_of(text: &[u8], list: &[&str]) -> bool { list.iter().any(|t| t.as_bytes() == text) }

/// The ids of the tokens whose text is one of `list`.
fn ids_with_text(v: &Vocab, list: &[&str]) -> Vec<Token> {
    match &v.changed_texts {
        // the index has the texts as they were before the change: look at every token
        Some(texts) => texts.iter().enumerate().filter(|(_, t)| is_one_of(t, list)).map(|(id, _)| id as Token).collect(),
        None => list.iter().filter_map(|t| v.text_to_token(t.as_bytes())).collect(),
    }
}

/// Which of `candidates` llama.cpp meets first when it scans `token_to_id`, in libstdc++'s
/// hash order.
fn first_in_map_order(v: &Vocab, candidates: &[Token]) -> Option<Token> {
    let texts = v.token_texts();
    // detect_by_text checked the vocabulary's size against the orders known
    stdlib::first_in_map_order(texts.len(), |id| texts.get(id), candidates)
}

/// The loader's text-based detection: EOT/EOM/FIM ids, unused tokens, the EOG set and the
/// attribute overrides that come with them. A slot takes the first token with one of its
/// texts in `token_to_id`'s iteration order.
fn detect_by_text(v: &mut Vocab) -> Result<(), VocabError> {
    if v.tokens.len() > stdlib::MAX_MAP_KEYS {
        return Err(invalid("vocabulary too large"));
    }
    let control = TokenAttr::CONTROL;
    let slots = [
        (Slot::Eot, EOT_TEXTS), (Slot::Eom, EOM_TEXTS), (Slot::FimPre, FIM_PRE_TEXTS),
        (Slot::FimSuf, FIM_SUF_TEXTS), (Slot::FimMid, FIM_MID_TEXTS), (Slot::FimPad, FIM_PAD_TEXTS),
        (Slot::FimRep, FIM_REP_TEXTS), (Slot::FimSep, FIM_SEP_TEXTS),
    ];
    for (which, texts) in slots {
        if slot(&mut v.special, which).is_some() {
            continue;
        }
        if let Some(id) = first_in_map_order(v, &ids_with_text(v, texts)) {
            *slot(&mut v.special, which) = Some(id);
            let t = &mut v.tokens[id as usize];
            t.attr = t.attr.with(control);
        }
    }
    // control tokens whose text says "unused"
    for id in 0..v.tokens.len() {
        let attr = v.tokens[id].attr;
        if attr.intersects(control) && !attr.intersects(TokenAttr::UNUSED) && contains(v.text(id as Token), b"unused") {
            v.tokens[id].attr = attr.with(TokenAttr::UNUSED);
        }
    }
    let mut eog: Vec<Token> = [v.special.fim_pad, v.special.fim_rep, v.special.fim_sep].into_iter().flatten().collect();
    for id in ids_with_text(v, EOG_TEXTS) {
        eog.push(id);
        let t = &mut v.tokens[id as usize];
        t.attr = t.attr.with(control);
    }
    for id in ids_with_text(v, ALWAYS_RENDERED) {
        v.tokens[id as usize].attr = TokenAttr::USER_DEFINED;
    }
    eog.extend([v.special.eos, v.special.eot, v.special.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    drop_false_eogs(v, &mut eog);
    v.eog = eog;
    Ok(())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool { hay.windows(needle.len()).any(|w| w == needle) }

/// o200k_harmony / solar-open: "<|end|>" is not EOG when "<|return|>"+"<|call|>" (or
/// "<|calls|>"+"<|flush|>") are; gemma4 / plamo: "</s>" is a normal token.
fn drop_false_eogs(v: &mut Vocab, eog: &mut Vec<Token>) {
    let text_of = |id: Token| v.text(id);
    let has = |eog: &[Token], texts: &[&str]| eog.iter().any(|&id| is_one_of(text_of(id), texts));
    let end_id = eog.iter().copied().rfind(|&id| text_of(id) == b"<|end|>");
    let harmony = has(eog, &["<|return|>"]) && has(eog, &["<|call|>", "<|calls|>"]);
    let solar = has(eog, &["<|call|>", "<|calls|>"]) && has(eog, &["<|flush|>"]);
    if let Some(end) = end_id.filter(|_| harmony || solar) {
        eog.retain(|&id| id != end);
        v.tokens[end as usize].attr = TokenAttr::USER_DEFINED;
    }
    let text_of = |id: Token| v.text(id);
    let normal_s = eog.iter().any(|&id| is_one_of(text_of(id), &["<|tool_response>", "<|plamo:eos|>"]));
    let s_id = eog.iter().copied().rfind(|&id| text_of(id) == b"</s>");
    if let Some(s) = s_id.filter(|_| normal_s) {
        eog.retain(|&id| id != s);
        v.tokens[s as usize].attr = TokenAttr::NORMAL;
    }
}

/// Control, user-defined and unknown tokens, longest first, in libstdc++ `std::sort` order.
fn special_cache(v: &Vocab) -> Vec<Token> {
    let special = TokenAttr::CONTROL.with(TokenAttr::USER_DEFINED).with(TokenAttr::UNKNOWN);
    let mut ids: Vec<Token> = (0..v.tokens.len() as Token).filter(|&i| v.tokens[i as usize].attr.intersects(special)).collect();
    stdlib::std_sort(&mut ids, &|&a: &Token, &b: &Token| v.text(a).len() > v.text(b).len());
    ids
}

/// Per-model attribute fixes keyed on the model name, pre-tokenizer or architecture.
fn set_model_attrs(f: &GgufFile, v: &mut Vocab) -> Result<(), VocabError> {
    let name = get_string(f, "general.name")?.unwrap_or_default().to_ascii_lowercase();
    let pre = get_string(f, KEY_PRE)?.unwrap_or_default();
    let arch = get_string(f, "general.architecture")?.unwrap_or_default();
    let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    let set = |v: &mut Vocab, text: &str, attr: TokenAttr, on: bool| -> Result<(), VocabError> {
        let id = v.text_to_token(text.as_bytes()).ok_or_else(|| invalid(format!("token '{text}' not in vocabulary")))?;
        let t = &mut v.tokens[id as usize];
        t.attr = if on { t.attr.with(attr) } else { t.attr.without(attr) };
        Ok(())
    };
    if any(&pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"]) || any(&arch, &["nomic-bert-moe", "jina-bert-v3"]) {
        if v.text_to_token(b"<mask>").is_some() {
            set(v, "<mask>", TokenAttr::LSTRIP, true)?;
        }
    } else if any(&name, &["phi-3", "phi3"]) {
        for i in 0..v.special_cache.len() {
            let id = v.special_cache[i] as usize;
            v.tokens[id].attr = v.tokens[id].attr.with(TokenAttr::RSTRIP);
        }
        set(v, "</s>", TokenAttr::RSTRIP, true)?;
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            set(v, text, TokenAttr::RSTRIP, false)?;
        }
    } else if any(&name, &["modern-bert"]) && v.text_to_token(b"[MASK]").is_some() {
        set(v, "[MASK]", TokenAttr::LSTRIP, true)?;
    }
    Ok(())
}
