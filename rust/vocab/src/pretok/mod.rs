//! BPE pre-tokenization: every `tokenizer.ggml.pre` value llama.cpp knows, the regex list
//! of each (llm_tokenizer_bpe's constructor), and `unicode_regex_split`.

mod custom;
pub mod ecma;

use crate::unicode::{self, CptFlags};
use custom::CustomSplit;
use ecma::{Regex, Scratch};

/// llama.cpp's `llama_vocab_pre_type`, the pre-tokenizer family a name maps to.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreKind {
    Default, Llama3, DeepseekLlm, DeepseekCoder, Falcon, Mpt, Starcoder, Gpt2, Refact,
    CommandR, Stablelm2, Qwen2, Qwen35, Olmo, Dbrx, Smaug, Poro, Chatglm4, Viking, Jais,
    Jais2, Tekken, Smollm, Codeshell, Bloom, Gpt3Finnish, Exaone, ExaoneMoe, Chameleon,
    Minerva, Deepseek3Llm, Gpt4o, GraniteEmbMulti, TinyAya, Superbpe, Trillion,
    GraniteDocling, Bailingmoe, SeedCoder, Hunyuan, HunyuanDense, HyV4, JoyaiLlm, KimiK2,
    Ufakzeka, Grok2, Afmoe, Laguna, MinimaxM2, SolarOpen, Mellum2, Spark25, Youtu, Gemma4,
    SarvamMoe, Minicpm5, Whitespace,
}

/// What a `tokenizer.ggml.pre` value selects, with the vocabulary flags llama.cpp's loader
/// sets alongside (relative to the BPE defaults: clean_spaces on, everything else off).
#[derive(Debug, Clone, Copy)]
pub struct PreEntry {
    /// The `tokenizer.ggml.pre` value.
    pub name: &'static str,
    /// The family, which fixes the regex list.
    pub kind: PreKind,
    /// `clean_up_tokenization_spaces` when detokenizing.
    pub clean_spaces: bool,
    /// A whole pre-token that is a vocabulary entry is emitted without merging.
    pub ignore_merges: bool,
    /// Add BOS by default.
    pub add_bos: bool,
    /// Add SEP by default.
    pub add_sep: bool,
    /// Spaces become U+2581 before BPE (SPM-style BPE).
    pub escape_whitespaces: bool,
    /// The BOS id default is cleared (ChatGLM).
    pub no_bos: bool,
    /// The BERT-normalizer `lowercase` option is turned off.
    pub no_lowercase: bool,
}

const fn entry(name: &'static str, kind: PreKind) -> PreEntry {
    PreEntry {
        name, kind, clean_spaces: true, ignore_merges: false, add_bos: false, add_sep: false,
        escape_whitespaces: false, no_bos: false, no_lowercase: false,
    }
}

/// `clean_spaces = false`.
const fn raw(name: &'static str, kind: PreKind) -> PreEntry {
    PreEntry { clean_spaces: false, ..entry(name, kind) }
}

const fn llama3(name: &'static str) -> PreEntry {
    PreEntry { ignore_merges: true, add_bos: true, ..entry(name, PreKind::Llama3) }
}

use PreKind as K;

/// Every `tokenizer.ggml.pre` value of llama.cpp's vocabulary loader, one entry per value
/// (llama_vocab::impl::load at 0c1e570). A missing value means "default".
pub static PRE_TABLE: &[PreEntry] = &[
    entry("default", K::Default),
    PreEntry { ignore_merges: true, ..entry("minicpm5", K::Minicpm5) },
    llama3("llama3"), llama3("llama-v3"), llama3("llama-bpe"), llama3("falcon3"),
    llama3("falcon-h1"), llama3("pixtral"), llama3("midm-2.0"), llama3("lfm2"),
    llama3("jina-v5-nano"),
    raw("deepseek-llm", K::DeepseekLlm),
    raw("deepseek-coder", K::DeepseekCoder),
    raw("deepseek-v3", K::Deepseek3Llm),
    raw("spark2_5", K::Spark25),
    PreEntry { ignore_merges: true, ..raw("youtu", K::Youtu) },
    entry("falcon", K::Falcon),
    entry("mpt", K::Mpt),
    entry("starcoder", K::Starcoder),
    entry("gpt-2", K::Gpt2), entry("phi-2", K::Gpt2), entry("jina-es", K::Gpt2),
    entry("jina-de", K::Gpt2), entry("gigachat", K::Gpt2), entry("jina-v2-es", K::Gpt2),
    entry("jina-v2-de", K::Gpt2), entry("a.x-4.0", K::Gpt2), entry("mellum", K::Gpt2),
    entry("modern-bert", K::Gpt2),
    entry("jais-2", K::Jais2),
    PreEntry { escape_whitespaces: true, ..entry("gemma4", K::Gemma4) },
    PreEntry { escape_whitespaces: true, ..entry("granite-embed-multi-311m", K::Gemma4) },
    PreEntry { escape_whitespaces: true, ..raw("sarvam-moe", K::SarvamMoe) },
    PreEntry { add_sep: true, ..entry("jina-v1-en", K::Gpt2) },
    PreEntry { add_sep: true, ..entry("jina-v2-code", K::Gpt2) },
    PreEntry { add_sep: true, ..entry("roberta-bpe", K::Gpt2) },
    PreEntry { no_lowercase: true, ..entry("whitespace", K::Whitespace) },
    entry("refact", K::Refact),
    raw("command-r", K::CommandR),
    raw("qwen2", K::Qwen2), raw("deepseek-r1-qwen", K::Qwen2), raw("kormo", K::Qwen2),
    raw("f2llmv2", K::Qwen2),
    raw("qwen35", K::Qwen35),
    entry("stablelm2", K::Stablelm2),
    entry("olmo", K::Olmo),
    entry("dbrx", K::Dbrx),
    entry("smaug-bpe", K::Smaug),
    raw("poro-chat", K::Poro),
    PreEntry { no_bos: true, ..entry("chatglm-bpe", K::Chatglm4) },
    PreEntry { no_bos: true, ignore_merges: true, ..entry("glm4", K::Chatglm4) },
    PreEntry { no_bos: true, ignore_merges: true, ..entry("glm5", K::Chatglm4) },
    raw("viking", K::Viking),
    entry("jais", K::Jais),
    PreEntry { ignore_merges: true, add_bos: true, ..raw("tekken", K::Tekken) },
    raw("smollm", K::Smollm),
    entry("codeshell", K::Codeshell),
    entry("bloom", K::Bloom),
    entry("gpt3-finnish", K::Gpt3Finnish),
    entry("exaone", K::Exaone),
    entry("exaone4", K::Gpt2),
    entry("exaone-moe", K::ExaoneMoe),
    PreEntry { add_bos: true, ..raw("chameleon", K::Chameleon) },
    entry("minerva-7b", K::Minerva),
    entry("megrez", K::Qwen2),
    raw("gpt-4o", K::Gpt4o), raw("llama4", K::Gpt4o), raw("kanana2", K::Gpt4o),
    raw("talkie", K::Gpt4o),
    PreEntry { ignore_merges: true, ..raw("granite-embed-multi-97m", K::GraniteEmbMulti) },
    raw("tiny_aya", K::TinyAya), raw("cohere2moe", K::TinyAya),
    raw("superbpe", K::Superbpe),
    raw("trillion", K::Trillion),
    raw("granite-docling", K::GraniteDocling),
    raw("bailingmoe", K::Bailingmoe), raw("bailingmoe2", K::Bailingmoe),
    raw("llada-moe", K::Bailingmoe),
    raw("seed-coder", K::SeedCoder),
    raw("hunyuan", K::Hunyuan),
    raw("hunyuan-dense", K::HunyuanDense),
    raw("hy_v4", K::HyV4),
    raw("joyai-llm", K::JoyaiLlm),
    raw("kimi-k2", K::KimiK2),
    raw("ufakzeka", K::Ufakzeka),
    raw("grok-2", K::Grok2),
    raw("afmoe", K::Afmoe),
    raw("laguna", K::Laguna),
    raw("minimax-m2", K::MinimaxM2),
    raw("solar-open", K::SolarOpen),
    entry("mellum2", K::Mellum2),
];

/// Looks a `tokenizer.ggml.pre` value up in [`PRE_TABLE`]; an empty value is "default".
pub fn lookup(name: &str) -> Option<&'static PreEntry> {
    let name = if name.is_empty() { "default" } else { name };
    PRE_TABLE.iter().find(|e| e.name == name)
}

// The regexes, spelled exactly as in llama.cpp (they are matched by string against the
// custom splitters, so a single changed character would change behaviour).
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const JAIS2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_LLM_PUNCT: &str = "\\s?[!-/:-~！-／：-～‘-‟　-。]+";
const CJK_HANGUL: &str = "[一-龥ࠀ-一가-퟿]+";
const CJK_KANA: &str = "[一-龥぀-ゟ゠-ヿ]+";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const SPARK25_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+";
const YOUTU_CJK: &str = "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+";
const YOUTU_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const FALCON_PUNCT: &str = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
const DIGIT_TRIPLES: &str = "[0-9][0-9][0-9]";
const DIGIT: &str = "\\p{N}";
const DIGITS: &str = "\\p{N}+";
const DIGITS_1_3: &str = "\\p{N}{1,3}";
const PORO: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GRANITE_EMB_MULTI: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const TINY_AYA_DIGITS: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";
const TINY_AYA_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const KIMI_K2: &str = "\\p{Han}+";
const SUPERBPE_GROUPS: &str = "(?=(\\d{3})+(?!\\d))";
const BAILINGMOE: &str = "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const SEED_CODER: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const UFAKZEKA: &str = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const AFMOE_DIGITS: &str = "\\p{AFMoE_digits}";
const AFMOE_CJK: &str = "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+";
const AFMOE_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINE_RUNS: &str = "[^\\n]+|[\\n]+";
const EXAONE_MOE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const MINICPM5_MAIN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NON_SPACE_RUNS: &str = "\\S+";
const DEFAULT_PUNCT: &str = "[\\p{P}\\$\\+<=>\\^~\\|]+";

/// The regex list of a pre-tokenizer family (the switch in llm_tokenizer_bpe's constructor).
pub fn regexes(kind: PreKind) -> &'static [&'static str] {
    match kind {
        K::Llama3 | K::Dbrx | K::Smaug | K::Chatglm4 => &[LLAMA3],
        K::Jais2 => &[JAIS2],
        K::DeepseekLlm => &["[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCT, "\\s+$", CJK_HANGUL, DIGITS],
        K::Deepseek3Llm | K::HunyuanDense | K::JoyaiLlm | K::HyV4 => &[DIGITS_1_3, CJK_KANA, DEEPSEEK3_MAIN],
        K::Spark25 => &[DIGITS_1_3, CJK_KANA, SPARK25_MAIN, DIGIT],
        K::Youtu => &[YOUTU_CJK, YOUTU_MAIN],
        K::DeepseekCoder => &["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_HANGUL, DIGIT],
        K::Falcon => &[FALCON_PUNCT, GPT2, DIGIT_TRIPLES],
        K::Starcoder | K::Refact | K::CommandR | K::Smollm | K::Codeshell | K::Exaone
        | K::Minerva | K::Mellum2 => &[DIGIT, GPT2],
        K::Gpt2 | K::Mpt | K::Olmo | K::Jais | K::Trillion | K::GraniteDocling => &[GPT2],
        K::Stablelm2 | K::Qwen2 | K::Hunyuan | K::SolarOpen => &[QWEN2],
        K::Qwen35 => &[QWEN35],
        K::Poro | K::Bloom | K::Gpt3Finnish => &[PORO],
        K::Viking => &[PORO, DIGIT],
        K::Tekken => &[TEKKEN],
        K::Chameleon => &[
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            DIGIT,
            "[\\p{P}!-/:-@\\[-`{-~]",
            GPT2,
        ],
        K::Gpt4o | K::MinimaxM2 => &[GPT4O],
        K::GraniteEmbMulti => &[GRANITE_EMB_MULTI],
        K::TinyAya => &[TINY_AYA_DIGITS, TINY_AYA_MAIN],
        K::KimiK2 => &[KIMI_K2],
        K::Superbpe => &[DIGITS, SUPERBPE_GROUPS],
        K::Bailingmoe => &[BAILINGMOE],
        K::SeedCoder => &[SEED_CODER],
        K::Ufakzeka => &[UFAKZEKA],
        K::Grok2 => &[QWEN2],
        K::Afmoe => &[AFMOE_DIGITS, AFMOE_CJK, AFMOE_MAIN],
        K::Laguna => &[NEWLINE_RUNS, QWEN2],
        K::ExaoneMoe => &[EXAONE_MOE],
        K::Gemma4 | K::SarvamMoe => &[NEWLINE_RUNS],
        K::Minicpm5 => &[DIGITS_1_3, MINICPM5_MAIN],
        K::Whitespace => &[NON_SPACE_RUNS],
        K::Default => &[DEFAULT_PUNCT, GPT2, DIGITS, DIGIT_TRIPLES],
    }
}

/// Whether pre-tokens are byte-level (GPT-2) encoded; SPM-style BPE families use raw UTF-8.
pub fn byte_encode(kind: PreKind) -> bool {
    !matches!(kind, K::Gemma4 | K::SarvamMoe | K::Whitespace)
}

/// `unicode_regex_split_custom`: the hand-written splitter registered for a regex, if any.
fn custom_for(regex: &str) -> Option<CustomSplit> {
    const LLAMA3_CI: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    match regex {
        GPT2 => Some(CustomSplit::Gpt2),
        LLAMA3_CI | LLAMA3 => Some(CustomSplit::Llama3),
        QWEN2 => Some(CustomSplit::Qwen2),
        QWEN35 => Some(CustomSplit::Qwen35),
        KIMI_K2 => Some(CustomSplit::KimiK2),
        AFMOE_DIGITS | TINY_AYA_DIGITS => Some(CustomSplit::AfmoeDigits),
        NEWLINE_RUNS => Some(CustomSplit::Newlines),
        _ => None,
    }
}

/// Unicode categories llama.cpp recognises in regexes, with their collapsed byte and the
/// ASCII members spelled as a class body (k_ucat_enum / k_ucat_cpt / k_ucat_map).
const CATEGORIES: &[(&str, u8, &str)] = &[
    ("\\p{N}", 0xD1, "0-9"),
    ("\\p{L}", 0xD2, "A-Za-z"),
    ("\\p{Ll}", 0xD2, "A-Za-z"),
    ("\\p{Lm}", 0xD2, "A-Za-z"),
    ("\\p{Lo}", 0xD2, "A-Za-z"),
    ("\\p{Lt}", 0xD2, "A-Za-z"),
    ("\\p{Lu}", 0xD2, "A-Za-z"),
    ("\\p{M}", 0xD4, ""),
    ("\\p{P}", 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    ("\\p{S}", 0xD5, "\\$\\+<->^`\\|\\~"),
];

fn uses_categories(regex: &str) -> bool {
    CATEGORIES.iter().any(|(name, _, _)| regex.contains(name))
}

/// The collapsed byte of a code point (>= 128): whitespace -> 0x0B, a category -> its byte,
/// anything else -> 0xD0.
fn collapsed_unit(cpt: u32, flags: CptFlags) -> u32 {
    if cpt < 128 {
        return cpt;
    }
    if flags.is_whitespace() {
        return 0x0B;
    }
    let cat = flags.category();
    let byte = match cat {
        c if c == unicode::flag::NUMBER => 0xD1,
        c if c == unicode::flag::LETTER => 0xD2,
        c if c == unicode::flag::PUNCTUATION => 0xD3,
        c if c == unicode::flag::ACCENT_MARK => 0xD4,
        c if c == unicode::flag::SYMBOL => 0xD5,
        _ => 0xD0,
    };
    byte as u32
}

/// Rewrites `\p{..}` into classes over collapsed bytes, tracking brackets the way
/// llama.cpp does (a bracket preceded by a backslash does not count).
fn collapse_regex(regex: &str) -> Result<Vec<u32>, String> {
    if !regex.is_ascii() {
        return Err("regex includes both unicode categories and non-ASCII characters".into());
    }
    let bytes = regex.as_bytes();
    let mut out: Vec<u32> = Vec::with_capacity(bytes.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'[' && (i == 0 || bytes[i - 1] != b'\\') {
            out.push(c as u32);
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && bytes[i - 1] != b'\\' {
            out.push(c as u32);
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && i + 3 < bytes.len() && bytes[i + 1] == b'p' && bytes[i + 2] == b'{' {
            let close = bytes[i + 3..].iter().position(|&b| b == b'}').map(|p| p + i + 3);
            if let Some(close) = close.filter(|&c| c <= i + 10) {
                let name = &regex[i..=close];
                if let Some(&(_, byte, members)) = CATEGORIES.iter().find(|(n, _, _)| *n == name) {
                    if !inside {
                        out.push('[' as u32);
                    }
                    out.push(byte as u32);
                    out.extend(members.bytes().map(|b| b as u32));
                    if !inside {
                        out.push(']' as u32);
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(c as u32);
        i += 1;
    }
    Ok(out)
}

/// One step of the split: a custom splitter, or a regex over collapsed or wide text.
#[derive(Debug, Clone)]
enum Step {
    Custom(CustomSplit),
    Collapsed(Regex),
    Wide(Regex),
}

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub struct PreTokenizer {
    steps: Vec<Step>,
    need_collapse: bool,
    byte_encode: bool,
}

/// A regex llama.cpp's pre-tokenizer could not compile.
#[derive(Debug, Clone)]
pub struct CompileError {
    /// The regex, as written in llama.cpp.
    pub regex: &'static str,
    /// Why it failed.
    pub reason: String,
}

/// The pre-tokens of a text: byte ranges into `bytes` (each pre-token already byte-level
/// encoded or not, depending on the pre-tokenizer: see [`PreTokenizer::byte_encode`]).
#[derive(Debug, Default)]
pub struct Words {
    /// Concatenated UTF-8 of the pre-tokens (not byte-level encoded).
    pub bytes: Vec<u8>,
    /// End offset of each pre-token in `bytes`.
    pub ends: Vec<usize>,
}

impl Words {
    /// Iterates over the pre-tokens.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let word = &self.bytes[start..end];
            start = end;
            word
        })
    }
}

/// A code point beyond U+10FFFF in the text: llama.cpp's `unicode_cpt_to_utf8` throws.
#[derive(Debug, Clone, Copy)]
pub struct BadCodepoint(pub u32);

impl PreTokenizer {
    /// Compiles the regex list of a family.
    pub fn new(kind: PreKind) -> Result<PreTokenizer, CompileError> {
        let list = regexes(kind);
        let mut steps = Vec::with_capacity(list.len());
        for &regex in list {
            let fail = |reason: String| CompileError { regex, reason };
            let step = if let Some(custom) = custom_for(regex) {
                Step::Custom(custom)
            } else if uses_categories(regex) {
                let units = collapse_regex(regex).map_err(fail)?;
                Step::Collapsed(Regex::new(&units).map_err(|e| fail(e.0))?)
            } else {
                Step::Wide(Regex::from_str_units(regex).map_err(|e| fail(e.0))?)
            };
            steps.push(step);
        }
        let need_collapse = list.iter().any(|r| uses_categories(r));
        Ok(PreTokenizer { steps, need_collapse, byte_encode: byte_encode(kind) })
    }

    /// Whether BPE runs on byte-level encoded pre-tokens.
    pub fn byte_encode(&self) -> bool { self.byte_encode }

    /// `unicode_regex_split`, without the final byte-level encoding (done by the BPE stage).
    pub fn split(&self, text: &[u8]) -> Result<Words, BadCodepoint> {
        let cpts = unicode::cpts_from_utf8(text);
        let flags: Vec<CptFlags> = cpts.iter().map(|&c| unicode::flags(c)).collect();
        let collapsed: Vec<u32> = if self.need_collapse {
            cpts.iter().zip(&flags).map(|(&c, &f)| collapsed_unit(c, f)).collect()
        } else {
            Vec::new()
        };
        let mut wide: Option<Vec<u32>> = None;
        let mut offsets = vec![cpts.len()];
        let mut scratch = Scratch::default();
        for step in &self.steps {
            offsets = match step {
                Step::Custom(kind) => custom::split(*kind, &cpts, &flags, &offsets),
                Step::Collapsed(re) => ecma::split_chunks(re, &collapsed, &offsets, &mut scratch),
                Step::Wide(re) => {
                    // std::wregex's \s misses non-ASCII whitespace: llama.cpp maps it to 0x0B
                    let units = wide.get_or_insert_with(|| {
                        cpts.iter().zip(&flags).map(|(&c, f)| if c > 0x7F && f.is_whitespace() { 0x0B } else { c }).collect()
                    });
                    ecma::split_chunks(re, units, &offsets, &mut scratch)
                }
            };
        }
        let mut words = Words { bytes: Vec::with_capacity(text.len()), ends: Vec::with_capacity(offsets.len()) };
        let mut start = 0;
        for len in offsets {
            for &cpt in &cpts[start..start + len] {
                unicode::push_utf8(cpt, &mut words.bytes).map_err(|e| BadCodepoint(e.0))?;
            }
            words.ends.push(words.bytes.len());
            start += len;
        }
        Ok(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let entry = lookup(pre).unwrap();
        let p = PreTokenizer::new(entry.kind).unwrap();
        p.split(text.as_bytes()).unwrap().iter().map(|w| String::from_utf8(w.to_vec()).unwrap()).collect()
    }

    #[test]
    fn every_pre_value_maps_to_a_compilable_regex_list() {
        let mut names = std::collections::HashSet::new();
        for e in PRE_TABLE {
            assert!(names.insert(e.name), "duplicate entry {}", e.name);
            assert!(!regexes(e.kind).is_empty(), "{} has no regex", e.name);
            if let Err(err) = PreTokenizer::new(e.kind) {
                panic!("{}: regex {:?} does not compile: {}", e.name, err.regex, err.reason);
            }
        }
        assert_eq!(PRE_TABLE.len(), 91);
        assert!(lookup("").is_some_and(|e| e.kind == PreKind::Default));
        assert!(lookup("no-such-pre").is_none());
    }

    #[test]
    fn collapse_matches_llama_cpp() {
        let c = collapse_regex("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+").unwrap();
        let s: String = c.iter().map(|&u| char::from_u32(u).unwrap()).collect();
        assert_eq!(s, "[^\\r\\n\u{D2}A-Za-z\u{D1}0-9]?[\u{D2}A-Za-z]+");
        assert!(collapse_regex("é\\p{L}").is_err());
    }

    #[test]
    fn gpt2_and_qwen2_splits() {
        assert_eq!(split("gpt-2", "Hello world's  x"), vec!["Hello", " world", "'s", " ", " x"]);
        assert_eq!(split("qwen2", "abc 123\n\n  x"), vec!["abc", " ", "1", "2", "3", "\n\n", " ", " x"]);
        assert_eq!(split("llama-bpe", "12345 ok"), vec!["123", "45", " ok"]);
    }

    #[test]
    fn regex_families() {
        assert_eq!(split("starcoder", "x12 y"), vec!["x", "1", "2", " y"]);
        assert_eq!(split("superbpe", "a1234567"), vec!["a", "1", "", "234", "", "567"]);
        assert_eq!(split("deepseek-coder", "Hi, 你好\n1"), vec!["Hi", ",", " ", "你好", "\n", "1"]);
    }
}
