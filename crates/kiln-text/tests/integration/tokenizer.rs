//! The tokenizer against transformers' (`PreTrainedTokenizerFast` on the same tokenizer.json):
//! token ids of text with unicode, runs of whitespace and special tokens, round trips, and the
//! chat template as `apply_chat_template` renders it (tests/fixtures/tokenizer_cases.json, from
//! scripts/fixtures/text.py).

use std::path::PathBuf;

use kiln_text::{Message, TextTokenizer, TokenCache};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn cases() -> Value {
    let text = std::fs::read_to_string(fixtures().join("tokenizer_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_hf_dir(fixtures().join("llama")).unwrap()
}

#[test]
fn token_ids_equal_transformers() {
    let tokenizer = tokenizer();
    let cases = cases();
    for case in cases["texts"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect();
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids, want, "{text:?}");
        // Byte-level BPE loses nothing: decoding gives the text back.
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
    let end = tokenizer.token_id("<|im_end|>").unwrap();
    assert_eq!(tokenizer.special("eos_token"), Some("<|im_end|>"));
    assert!(!tokenizer.decode(&[end], true).unwrap().contains("im_end"));
}

#[test]
fn chat_template_renders_as_transformers() {
    let tokenizer = tokenizer();
    assert!(tokenizer.has_chat_template());
    for chat in cases()["chats"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let add = chat["add_generation_prompt"].as_bool().unwrap();
        let rendered = tokenizer.apply_chat_template(&messages, add).unwrap();
        assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    }
}

#[test]
fn texts_are_tokenised_once() {
    let mut cache = TokenCache::new(tokenizer());
    let first = cache.ids("A language model predicts").unwrap();
    let again = cache.ids("A language model predicts").unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    assert_eq!(
        *first,
        *tokenizer().encode("A language model predicts").unwrap()
    );
    cache.ids("The fox").unwrap();
    assert_eq!(cache.len(), 2);
}

#[test]
fn a_missing_tokenizer_is_named() {
    let empty = tempfile::tempdir().unwrap();
    let err = TextTokenizer::from_hf_dir(empty.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no tokenizer.json"), "{err}");
}
