//! GGUF files (scripts/fixtures/gguf_text.py): their metadata as the model's configuration, the
//! tokenizer built from it against transformers' (`AutoTokenizer.from_pretrained(dir,
//! gguf_file=...)`), and damaged files refused with the reason. The models' logits and greedy
//! tokens against transformers are in `parity`.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_core::Policy;
use kiln_core::gguf::GgufFile;
use kiln_text::{CausalLm, Family, Message, RopeScaling, TextConfig, TextTokenizer, Weights};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn open(name: &str) -> GgufFile {
    GgufFile::open(fixture(name)).unwrap()
}

#[test]
fn metadata_becomes_the_configuration() {
    let llama = TextConfig::from_gguf(&open("llama.gguf")).unwrap();
    let want = TextConfig {
        family: Family::Llama,
        vocab_size: 384,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: None,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 100_000.0,
        rope_scaling: RopeScaling::None,
        attention_bias: false,
        mlp_bias: false,
        tie_word_embeddings: true,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        sliding: None,
    };
    // The file stores ε and θ as f32.
    assert!((llama.rms_norm_eps - want.rms_norm_eps).abs() < 1e-12);
    assert_eq!(
        TextConfig {
            rms_norm_eps: want.rms_norm_eps,
            ..llama
        },
        want
    );
    let qwen2 = TextConfig::from_gguf(&open("qwen2.gguf")).unwrap();
    assert_eq!(qwen2.family, Family::Qwen2);
    assert!(qwen2.qkv_bias() && !qwen2.attention_bias && !qwen2.tie_word_embeddings);
    assert_eq!((qwen2.num_key_value_heads, qwen2.rope_theta), (1, 10_000.0));
}

fn cases() -> Value {
    let text = std::fs::read_to_string(fixture("tokenizer_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Ids of unicode text, whitespace runs and special tokens as transformers' tokenizer from the
/// same file gives them: GPT-2's split without BOS (llama.gguf), Qwen2's split with BOS
/// (qwen2.gguf); and the chat template as transformers renders it.
#[test]
fn tokenizers_equal_transformers_from_the_same_file() {
    let cases = cases();
    for name in ["llama", "qwen2"] {
        let tokenizer = TextTokenizer::from_gguf(&open(&format!("{name}.gguf"))).unwrap();
        for case in cases[name]["texts"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let ids = tokenizer.encode(text).unwrap();
            assert_eq!(ids, want, "{name}: {text:?}");
            // Byte-level BPE loses nothing: decoding gives the text back (after BOS).
            let bos = if name == "qwen2" { "<|im_start|>" } else { "" };
            assert_eq!(
                tokenizer.decode(&ids, false).unwrap(),
                format!("{bos}{text}")
            );
        }
        assert_eq!(tokenizer.special("eos_token"), Some("<|im_end|>"));
        for chat in cases[name]["chats"].as_array().unwrap() {
            let messages: Vec<Message> = serde_json::from_value(chat["messages"].clone()).unwrap();
            let rendered = tokenizer.apply_chat_template(&messages, true).unwrap();
            assert_eq!(rendered, chat["rendered"].as_str().unwrap(), "{name}");
        }
    }
}

/// A copy of `name` with the bytes `from` replaced by `to` (of the same length) where they first
/// occur.
fn patched(name: &str, from: &[u8], to: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let mut bytes = std::fs::read(fixture(name)).unwrap();
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes to patch");
    bytes[at..at + to.len()].copy_from_slice(to);
    write_copy(name, &bytes)
}

fn write_copy(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn load(path: &Path) -> String {
    CausalLm::<Flex>::from_gguf(path, &Default::default(), &Policy::full(), Weights::F32)
        .unwrap_err()
        .to_string()
}

#[test]
fn an_unsupported_architecture_is_named() {
    // `general.architecture`, a string (type 8) of 5 bytes.
    let key = b"general.architecture\x08\0\0\0\x05\0\0\0\0\0\0\0";
    let (from, to) = ([&key[..], b"llama"].concat(), [&key[..], b"mamba"].concat());
    let (_dir, path) = patched("llama.gguf", &from, &to);
    let err = load(&path);
    assert!(
        err.contains("architecture `mamba` is not supported"),
        "{err}"
    );
    assert!(err.contains("llama, qwen2"), "{err}");
}

#[test]
fn a_missing_tensor_is_named_in_transformers_terms() {
    let (_dir, path) = patched("llama.gguf", b"blk.1.ffn_up.weight", b"blk.1.ffn_xx.weight");
    let err = load(&path);
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
    assert!(err.contains("not in the checkpoint"), "{err}");
}

#[test]
fn non_finite_weights_are_named() {
    let file = open("llama.gguf");
    let norm = file.tensor("output_norm.weight").unwrap();
    let mut bytes = std::fs::read(fixture("llama.gguf")).unwrap();
    bytes[norm.start + 8..norm.start + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    let (_dir, path) = write_copy("llama.gguf", &bytes);
    let err = load(&path);
    assert!(err.contains("output_norm.weight"), "{err}");
    assert!(err.contains("non-finite"), "{err}");
    assert!(err.contains("flat index 2"), "{err}");
}

#[test]
fn a_truncated_file_is_an_error() {
    let bytes = std::fs::read(fixture("qwen2.gguf")).unwrap();
    for keep in [0, 7, 100, bytes.len() / 2, bytes.len() - 1] {
        let (_dir, path) = write_copy("qwen2.gguf", &bytes[..keep]);
        let err = load(&path);
        assert!(err.contains("qwen2.gguf"), "{keep} bytes: {err}");
    }
}

/// A vocabulary whose `~` was overwritten (by the byte 0x7F, spelled anew and so a duplicate)
/// has no token for `~`: text holding it is refused, naming the character, where `tokenizers`
/// would drop it; text without it encodes as before.
#[test]
fn text_the_vocabulary_cannot_spell_is_refused() {
    let (_dir, path) = patched(
        "llama.gguf",
        b"\x01\0\0\0\0\0\0\0~",
        b"\x01\0\0\0\0\0\0\0\x7f",
    );
    let tokenizer = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let err = tokenizer.encode("a fox ~ ☃").unwrap_err().to_string();
    assert!(err.contains("'~' (character 7)"), "{err}");
    let whole = TextTokenizer::from_gguf(&open("llama.gguf")).unwrap();
    assert_eq!(
        tokenizer.encode("a fox ☃").unwrap(),
        whole.encode("a fox ☃").unwrap()
    );
}
