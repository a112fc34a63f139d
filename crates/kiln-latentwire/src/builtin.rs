//! Two tiny randomly initialised language models, only to run the pipeline without checkpoints
//! (the example with no `--lm`, tests): a Llama-shaped one and a Qwen2-shaped one of another
//! width, both reading through a byte-level tokenizer (GPT-2's byte alphabet, no merges) with a
//! ChatML chat template, made in memory. They know nothing: what they score measures nothing.

use burn::tensor::backend::Backend;
use kiln_text::{Family, TextConfig, TextTokenizer, byte_spelling};
use serde_json::{Map, Value, json};

use crate::{LatentWireError, Reader};

/// The special tokens after the 256 bytes.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// ChatML, with a system turn when the conversation has none.
const CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and \
messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a tiny built-in model.\
<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + \
'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' \
}}{% endif %}";

/// The two built-in readers, `tiny-llama` (width 64, 2 layers, tied head) and `tiny-qwen2`
/// (width 48, 2 layers, q/k/v biases, untied), initialised from the backend's generator.
pub fn tiny_readers<B: Backend>(device: &B::Device) -> Result<Vec<Reader<B>>, LatentWireError> {
    let tokenizer = byte_tokenizer()?;
    let vocab = tokenizer.vocab_size();
    let llama = TextConfig {
        vocab_size: vocab,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 1024,
        bos_token_id: None,
        eos_token_ids: vec![258],
        ..TextConfig::smollm2_135m()
    };
    let qwen2 = TextConfig {
        family: Family::Qwen2,
        hidden_size: 48,
        intermediate_size: 96,
        num_attention_heads: 6,
        num_key_value_heads: 1,
        tie_word_embeddings: false,
        ..llama.clone()
    };
    Ok(vec![
        Reader::new("tiny-llama", llama.init(device), tokenizer.clone())?,
        Reader::new("tiny-qwen2", qwen2.init(device), tokenizer)?,
    ])
}

/// A byte-level BPE without merges: one token per UTF-8 byte (as GPT-2's byte-level
/// pre-tokenizer spells bytes), then [`SPECIALS`].
fn byte_tokenizer() -> Result<TextTokenizer, LatentWireError> {
    let mut vocab = Map::new();
    for (byte, letter) in byte_spelling().into_iter().enumerate() {
        vocab.insert(letter.to_string(), json!(byte));
    }
    let added: Vec<Value> = (SPECIALS.iter().enumerate())
        .map(|(i, token)| {
            vocab.insert(token.to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": token, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    });
    let config = json!({
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
    });
    Ok(TextTokenizer::from_json(
        &tokenizer.to_string(),
        Some(&config.to_string()),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// Every text round-trips, one token per byte; the template's specials are single tokens.
    #[test]
    fn the_byte_tokenizer_spells_every_byte() {
        let tokenizer = byte_tokenizer().unwrap();
        let text = "Zoë was born in Zürich on 3 May.\n";
        let ids = tokenizer.encode_without_special_tokens(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
        let turn = "<|im_start|>user\nhi<|im_end|>";
        assert_eq!(
            tokenizer.encode_without_special_tokens(turn).unwrap().len(),
            1 + 7 + 1
        );
        assert_eq!(tokenizer.vocab_size(), 259);
    }

    #[test]
    fn the_builtin_readers_differ_in_family_and_width() {
        let readers = tiny_readers::<Flex>(&Default::default()).unwrap();
        let widths: Vec<usize> = readers.iter().map(Reader::model_width).collect();
        assert_eq!(widths, [64, 48]);
        assert_eq!(readers[1].lm().config().family, Family::Qwen2);
        assert_eq!(readers[0].template().end, 258);
    }
}
