//! The tokenizer a GGUF file's metadata describes (`tokenizer.ggml.*`, as llama.cpp's
//! `llama-vocab.cpp` reads it): a byte-level BPE (`tokenizer.ggml.model` `gpt2`) of the file's
//! tokens and merges, split first as the `tokenizer.ggml.pre` name says, its control tokens kept
//! whole, BOS (and EOS) added as the file asks, and the file's chat template.

use std::collections::HashMap;

use kiln_core::gguf::{GgufFile, Value};
use serde_json::{Value as Json, json};

use crate::TextError;
use crate::tokenizer::{TextTokenizer, byte_spelling};

/// GPT-2's split (`tokenizers`' byte-level pre-tokenizer applies it itself).
const GPT2: &[&str] = &[
    "gpt-2", "gpt2", "default", "mpt", "olmo", "jais", "trillion",
];
/// Each digit apart, then GPT-2's split.
const DIGITS_THEN_GPT2: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva",
];
/// Llama 3's split; merges ignored for a word the vocabulary has whole.
const LLAMA3: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
];
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split.
const QWEN2: &[&str] = &["qwen2", "deepseek-r1-qwen", "megrez"];
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's token types (`llama_token_type`).
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

impl TextTokenizer {
    /// The tokenizer of a GGUF file's metadata: `tokenizer.ggml.model` `gpt2` (byte-level BPE,
    /// what SmolLM2, Llama 3 and Qwen2 files hold), split as `tokenizer.ggml.pre` names
    /// (`gpt-2`, `smollm`, `llama-bpe`, `qwen2` and the names llama.cpp treats as these; GPT-2's
    /// split when the file names none), tokens marked control kept whole as special tokens and
    /// those marked user-defined as plain added tokens, BOS and EOS added as
    /// `tokenizer.ggml.add_bos_token` / `add_eos_token` say, and `tokenizer.chat_template`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TextError> {
        let error =
            |message: String| TextError::Tokenizer(format!("{}: {message}", file.path().display()));
        let strings = |key: &str| -> Result<Vec<&str>, TextError> {
            let values = file
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| error(format!("no `{key}` array in the metadata")))?;
            let strings = values.strings().ok_or_else(|| {
                error(format!(
                    "`{key}` holds {} values, not strings",
                    values.element_type()
                ))
            })?;
            Ok(strings.iter().collect())
        };
        match file.get("tokenizer.ggml.model").and_then(Value::as_str) {
            Some("gpt2") => {}
            other => {
                return Err(error(format!(
                    "tokenizer `{}` is not supported; kiln-text builds byte-level BPE tokenizers \
                     (`gpt2`)",
                    other.unwrap_or("(none)")
                )));
            }
        }
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = match file.get("tokenizer.ggml.token_type") {
            Some(value) => value
                .as_array()
                .and_then(|types| types.integers())
                .and_then(|types| types.into_iter().map(|t| u64::try_from(t).ok()).collect())
                .ok_or_else(|| {
                    error("`tokenizer.ggml.token_type` is not integers of 0 or more".into())
                })?,
            None => Vec::new(),
        };
        let pre = file.get("tokenizer.ggml.pre").and_then(Value::as_str);
        let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| {
            error(format!(
                "pre-tokenizer `{}` is not one kiln-text knows; it splits as {}",
                pre.unwrap_or_default(),
                [GPT2, DIGITS_THEN_GPT2, LLAMA3, QWEN2]
                    .map(|names| names.join(", "))
                    .join("; ")
            ))
        })?;
        let id = |key: &str| -> Result<Option<u32>, TextError> {
            let Some(value) = file.get(key) else {
                return Ok(None);
            };
            value
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|&id| (id as usize) < tokens.len())
                .map(Some)
                .ok_or_else(|| {
                    error(format!(
                        "`{key}` is {value:?}, not the id of one of the vocabulary's {} tokens",
                        tokens.len()
                    ))
                })
        };
        let optional_id = |key: &str| {
            id(key).unwrap_or_else(|problem| {
                log::warn!("{problem}; left out");
                None
            })
        };
        let flag = |key: &str| file.get(key).and_then(Value::as_bool).unwrap_or(false);
        let (bos, eos) = (
            id("tokenizer.ggml.bos_token_id")?,
            id("tokenizer.ggml.eos_token_id")?,
        );
        let added = [
            (flag("tokenizer.ggml.add_bos_token"), bos),
            (flag("tokenizer.ggml.add_eos_token"), eos),
        ];
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens(&tokens, &types),
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor(&tokens, added),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": ignore_merges,
                "vocab": vocabulary(&tokens),
                "merges": merges,
            },
        });
        let tokenizer = spec
            .to_string()
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| error(format!("the tokenizer cannot be built: {e}")))?;
        let chat_template = file
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        // A padding or unknown token outside the vocabulary changes nothing kiln generates: it
        // is left out with a warning (llama.cpp does the same), where a wrong BOS or EOS above
        // is refused.
        let specials: HashMap<String, String> = [
            ("bos_token", bos),
            ("eos_token", eos),
            ("pad_token", optional_id("tokenizer.ggml.padding_token_id")),
            ("unk_token", optional_id("tokenizer.ggml.unknown_token_id")),
        ]
        .into_iter()
        .filter_map(|(name, id)| Some((name.to_string(), tokens[id? as usize].to_string())))
        .collect();
        let tokenizer = TextTokenizer::from_parts(tokenizer, chat_template, specials);
        tokenizer.warn_of_unspelled_bytes(file.path());
        Ok(tokenizer)
    }
}

/// The split `pre` names, as `tokenizers` serialises a pre-tokenizer, and whether merges are
/// skipped for words the vocabulary has whole; `None` for a name kiln-text does not know.
fn pre_tokenizer(pre: Option<&str>) -> Option<(Json, bool)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    let pre = pre.unwrap_or("default");
    if GPT2.contains(&pre) {
        Some((byte_level(true), false))
    } else if DIGITS_THEN_GPT2.contains(&pre) {
        let digits = json!({"type": "Digits", "individual_digits": true});
        Some((
            json!({"type": "Sequence", "pretokenizers": [digits, byte_level(true)]}),
            false,
        ))
    } else if LLAMA3.contains(&pre) {
        Some((split(LLAMA3_SPLIT), true))
    } else if QWEN2.contains(&pre) {
        Some((split(QWEN2_SPLIT), false))
    } else {
        None
    }
}

/// Token → id; a token spelled outside the byte-level alphabet (a mislabelled file's) respelled
/// in it, as transformers does.
fn vocabulary(tokens: &[&str]) -> serde_json::Map<String, Json> {
    let spelling = byte_spelling();
    tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let token = if token.chars().all(|c| spelling.contains(&c)) {
                token.to_string()
            } else {
                token.bytes().map(|b| spelling[b as usize]).collect()
            };
            (token, json!(id))
        })
        .collect()
}

/// The control tokens (special, kept whole) and user-defined ones (kept whole, not special). A
/// control token spelled outside the byte-level alphabet is a mislabel and is left out, as
/// transformers leaves it out.
fn added_tokens(tokens: &[&str], types: &[u64]) -> Vec<Json> {
    let spelling = byte_spelling();
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter_map(|(id, (token, &kind))| {
            let special = match kind {
                CONTROL if token.chars().all(|c| spelling.contains(&c)) => true,
                USER_DEFINED => false,
                _ => return None,
            };
            Some(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }))
        })
        .collect()
}

/// BOS before and EOS after each sequence, those of `added` that are asked for and exist.
fn post_processor(tokens: &[&str], added: [(bool, Option<u32>); 2]) -> Json {
    let [bos, eos] = added.map(|(wanted, id)| id.filter(|_| wanted));
    if bos.is_none() && eos.is_none() {
        return Json::Null;
    }
    let special = |id: u32| json!({"SpecialToken": {"id": tokens[id as usize], "type_id": 0}});
    let sequence = |name: &str| json!({"Sequence": {"id": name, "type_id": 0}});
    let around = |name: &str| -> Vec<Json> {
        bos.map(special)
            .into_iter()
            .chain([sequence(name)])
            .chain(eos.map(special))
            .collect()
    };
    let pair: Vec<Json> = around("A").into_iter().chain(around("B")).collect();
    let special_tokens: serde_json::Map<String, Json> = [bos, eos]
        .into_iter()
        .flatten()
        .map(|id| {
            let token = tokens[id as usize];
            (
                token.to_string(),
                json!({"id": token, "ids": [id], "tokens": [token]}),
            )
        })
        .collect();
    json!({"type": "TemplateProcessing", "single": around("A"), "pair": pair, "special_tokens": special_tokens})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_tokenizer_name_builds_and_others_are_refused() {
        for name in [GPT2, DIGITS_THEN_GPT2, LLAMA3, QWEN2].concat() {
            assert!(pre_tokenizer(Some(name)).is_some(), "{name}");
        }
        assert!(pre_tokenizer(None).is_some());
        assert!(pre_tokenizer(Some("tekken")).is_none());
    }
}
