//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use ferrollama_gguf::GgufFile;
use ferrollama_vocab::Vocab;

/// tests/data of the repository.
pub fn data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// Loads the vocabulary of a GGUF file. A real model installed from PyPI is in the models
/// directory as its list of pieces (NAME.gguf.pieces, read in place), which is taken when the
/// file itself is not there.
pub fn load(path: &std::path::Path) -> Vocab {
    let mut pieces = path.as_os_str().to_owned();
    pieces.push(".pieces");
    let pieces = PathBuf::from(pieces);
    let path = if !path.exists() && pieces.exists() { pieces.as_path() } else { path };
    let f = GgufFile::open(path, true).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Vocab::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A vocabulary of tests/data/vocab by name (ggml-vocab-NAME.gguf).
pub fn suite_vocab(name: &str) -> Vocab {
    load(&data_dir().join(format!("vocab/ggml-vocab-{name}.gguf")))
}

/// The directory of the real models ($FERROLLAMA_MODELS_DIR), if set.
pub fn models_dir() -> Option<PathBuf> {
    match std::env::var_os("FERROLLAMA_MODELS_DIR") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            println!("FERROLLAMA_MODELS_DIR is not set: skipping the real-model part of this test");
            None
        }
    }
}

/// The cases of llama.cpp's vocabulary suite, read as test-tokenizer-0 reads them: the .inp
/// file split at "\n__ggml_vocab_test__\n" (a trailing separator ends the last text), the
/// .out file by lines (stripped, ids separated by spaces), kept in a map keyed by text so a
/// repeated text keeps its last expectation.
pub fn read_suite(name: &str) -> BTreeMap<Vec<u8>, Vec<u32>> {
    let dir = data_dir().join("vocab");
    let raw = std::fs::read(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).expect("read .inp");
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).expect("read .out");
    let sep = b"\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].windows(sep.len()).position(|w| w == sep) {
            Some(p) => {
                inputs.push(raw[pos..pos + p].to_vec());
                pos += p + sep.len();
            }
            None => {
                inputs.push(raw[pos..].to_vec());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().expect("token id")).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: input and output files have different numbers of tests");
    inputs.into_iter().zip(outputs).collect()
}
