//! A checkpoint's tokenizer: Hugging Face's `tokenizers` on its tokenizer.json, and the chat
//! template of instruct models from tokenizer_config.json, rendered with minijinja as
//! transformers' `apply_chat_template` renders it with Jinja.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use crate::TextError;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A turn of `role`.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A checkpoint directory's tokenizer and chat template.
///
/// ```no_run
/// use kiln_text::{Message, TextTokenizer};
///
/// let tokenizer = TextTokenizer::from_hf_dir("SmolLM2-135M-Instruct")?;
/// let prompt = tokenizer.apply_chat_template(&[Message::new("user", "Hi!")], true)?;
/// let ids = tokenizer.encode(&prompt)?;
/// assert_eq!(tokenizer.decode(&ids, false)?, prompt);
/// # Ok::<(), kiln_text::TextError>(())
/// ```
#[derive(Clone)]
pub struct TextTokenizer {
    tokenizer: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// The special tokens the template may name (`bos_token`, `eos_token`, ...).
    specials: HashMap<String, String>,
    /// Bytes a byte-level vocabulary has no token for, in order: with no unknown token and no
    /// byte fallback its BPE would drop them without a word, so text holding them is refused.
    /// Empty for every well-formed vocabulary.
    unspelled: Vec<u8>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl TextTokenizer {
    /// Reads `tokenizer.json` (required) and `tokenizer_config.json` (optional: the chat
    /// template and special tokens) from the checkpoint directory `dir`.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self, TextError> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TextError::Tokenizer(format!(
                "{}: no tokenizer.json (kiln-text reads the fast tokenizer's file that \
                 `tokenizer.save_pretrained` writes)",
                dir.display()
            )));
        }
        let tokenizer_json = std::fs::read_to_string(&path)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", path.display())))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = std::fs::read_to_string(&config_path).ok();
        let mut tokenizer = Self::from_json(&tokenizer_json, config.as_deref())
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", dir.display())))?;
        let jinja = dir.join("chat_template.jinja");
        if tokenizer.chat_template.is_none() && jinja.is_file() {
            tokenizer.chat_template = std::fs::read_to_string(&jinja).ok();
        }
        tokenizer.warn_of_unspelled_bytes(&path);
        Ok(tokenizer)
    }

    /// The tokenizer of a `tokenizer.json`'s text and, where given, a `tokenizer_config.json`'s
    /// (its chat template and special tokens): a tokenizer made in memory.
    pub fn from_json(tokenizer_json: &str, config_json: Option<&str>) -> Result<Self, TextError> {
        let tokenizer = tokenizer_json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| TextError::Tokenizer(format!("tokenizer.json: {e}")))?;
        let config: Value = match config_json {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| TextError::Tokenizer(format!("tokenizer_config.json: {e}")))?,
            None => Value::Null,
        };
        let chat_template = config
            .get("chat_template")
            .and_then(|t| template_named(t, "default"));
        let specials = ["bos_token", "eos_token", "pad_token", "unk_token"]
            .into_iter()
            .filter_map(|key| Some((key.to_string(), token_text(config.get(key)?)?)))
            .collect();
        Ok(Self::from_parts(tokenizer, chat_template, specials))
    }

    /// A tokenizer built elsewhere (from a GGUF file's metadata), with its chat template and the
    /// texts of its special tokens (`bos_token`, ...).
    pub(crate) fn from_parts(
        tokenizer: tokenizers::Tokenizer,
        chat_template: Option<String>,
        specials: HashMap<String, String>,
    ) -> Self {
        let unspelled = unspelled_bytes(&tokenizer);
        TextTokenizer {
            tokenizer,
            chat_template,
            specials,
            unspelled,
        }
    }

    /// Warns, naming the tokenizer's file, when its vocabulary cannot spell some bytes.
    pub(crate) fn warn_of_unspelled_bytes(&self, source: &Path) {
        if !self.unspelled.is_empty() {
            log::warn!(
                "{}: the tokenizer's vocabulary has no token for the bytes {}, and neither an \
                 unknown token nor byte fallback: text holding them will be refused",
                source.display(),
                hex_list(&self.unspelled)
            );
        }
    }

    /// The ids of `text`, with the special tokens the tokenizer's post-processor adds (as
    /// transformers' `tokenizer(text)` gives them).
    ///
    /// Text the vocabulary cannot spell is refused, naming the character, where a tokenizer
    /// with neither an unknown token nor byte fallback would drop it silently.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode_checked(text, true)
    }

    /// The ids of `text` alone, no special tokens added (transformers'
    /// `tokenizer(text, add_special_tokens=False)`: for text a chat template already marked up).
    pub fn encode_without_special_tokens(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode_checked(text, false)
    }

    fn encode_checked(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        self.check_nothing_dropped(text, &encoding)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Refuses `text` when its encoding dropped a character: one holding a byte the vocabulary
    /// has no token for, outside the added tokens (matched whole, before the BPE) it encoded to.
    fn check_nothing_dropped(
        &self,
        text: &str,
        encoding: &tokenizers::Encoding,
    ) -> Result<(), TextError> {
        if self.unspelled.is_empty() || !text.bytes().any(|b| self.unspelled.contains(&b)) {
            return Ok(());
        }
        let added = self.tokenizer.get_added_tokens_decoder();
        let within_added_token = |at: usize| {
            let tokens = encoding.get_ids().iter().zip(encoding.get_offsets());
            tokens
                .filter(|(id, _)| added.contains_key(id))
                .any(|(_, &(start, end))| (start..end).contains(&at))
        };
        for (index, (at, character)) in text.char_indices().enumerate() {
            let mut utf8 = [0; 4];
            let unspelled = character
                .encode_utf8(&mut utf8)
                .bytes()
                .find(|b| self.unspelled.contains(b));
            if let Some(byte) = unspelled
                && !within_added_token(at)
            {
                return Err(TextError::Tokenizer(format!(
                    "the text's character {character:?} (character {}) cannot be encoded: the \
                     vocabulary has no token for its byte 0x{byte:02X}, nor an unknown token \
                     or byte fallback, so it would be dropped",
                    index + 1
                )));
            }
        }
        Ok(())
    }

    /// The text of `ids`, without special tokens when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// The id of a token (`"<|im_end|>"`, say), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The vocabulary's spelling of token `id` (`"Ġ"` for a byte-level BPE's bare space, say),
    /// if the vocabulary has it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The text of a special token named in tokenizer_config.json (`"eos_token"`, ...).
    pub fn special(&self, name: &str) -> Option<&str> {
        self.specials.get(name).map(String::as_str)
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Whether the checkpoint has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// `messages` rendered by the checkpoint's chat template, with the assistant's turn opened
    /// when `add_generation_prompt`.
    ///
    /// A template comes with the model, so it is not trusted: its rendering is given a budget
    /// of [`CHAT_TEMPLATE_FUEL`] steps (a template that loops without end is refused) and an
    /// output of at most [`CHAT_TEMPLATE_OUTPUT`] bytes beyond four times the messages' own
    /// (one that writes a string doubling until memory runs out is refused). A string doubled
    /// in a variable and never written is bounded only by memory: minijinja has no hook on a
    /// string's growth.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            TextError::Tokenizer(
                "the model has no chat template (neither tokenizer_config.json's chat_template \
                 nor a GGUF file's tokenizer.chat_template): give the prompt as plain text"
                    .into(),
            )
        })?;
        let mut environment = Environment::new();
        minijinja_contrib::add_to_environment(&mut environment);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        let text: usize = messages.iter().map(|m| m.content.len()).sum();
        let most = CHAT_TEMPLATE_OUTPUT.saturating_add(text.saturating_mul(4));
        let mut output = Bounded {
            text: Vec::new(),
            most,
        };
        let jinja = |e: JinjaError| {
            let said = match e.kind() {
                ErrorKind::OutOfFuel => format!(
                    "took more than {CHAT_TEMPLATE_FUEL} steps, which no chat template needs: \
                     it loops without end, or nearly"
                ),
                ErrorKind::WriteFailure => format!(
                    "wrote more than {most} bytes for {} messages of {text} bytes, which no \
                     chat template needs",
                    messages.len()
                ),
                _ => e.to_string(),
            };
            TextError::Tokenizer(format!("the model's chat template: {said}"))
        };
        environment.add_template("chat", template).map_err(jinja)?;
        let special = |name: &str| self.special(name).unwrap_or_default().to_string();
        let chat = environment.get_template("chat").map_err(jinja)?;
        let context = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => special("bos_token"),
            eos_token => special("eos_token"),
        };
        chat.render_captured_to(context, &mut output)
            .map_err(jinja)?;
        String::from_utf8(output.text).map_err(|e| {
            TextError::Tokenizer(format!(
                "the model's chat template wrote no UTF-8 text: {e}"
            ))
        })
    }
}

/// The steps a chat template may take to render (minijinja's fuel): real templates take a few
/// thousand for a conversation.
pub const CHAT_TEMPLATE_FUEL: u64 = 10_000_000;

/// The bytes a chat template may write beyond four times its messages' text.
pub const CHAT_TEMPLATE_OUTPUT: usize = 1 << 20;

/// A writer that refuses to hold more than `most` bytes.
struct Bounded {
    text: Vec<u8>,
    most: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + bytes.len() > self.most {
            return Err(std::io::Error::other("a chat template's output limit"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A chat template: the string itself, or from a list of `{name, template}` the one named
/// `name`.
fn template_named(value: &Value, name: &str) -> Option<String> {
    match value {
        Value::String(template) => Some(template.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// A special token's text: a string, or an added-token object's `content`.
fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(token) => token.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The bytes a byte-level BPE (ByteLevel decoder, no unknown token, no byte fallback) has no
/// token for, in order; empty for any other tokenizer, which maps what it cannot spell to its
/// unknown token or to bytes.
fn unspelled_bytes(tokenizer: &tokenizers::Tokenizer) -> Vec<u8> {
    let tokenizers::ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return Vec::new();
    };
    let byte_level = matches!(
        tokenizer.get_decoder(),
        Some(tokenizers::DecoderWrapper::ByteLevel(_))
    );
    if !byte_level || bpe.unk_token.is_some() || bpe.byte_fallback {
        return Vec::new();
    }
    let vocabulary = bpe.get_vocab();
    (0..=255u8)
        .zip(byte_spelling())
        .filter(|(_, letter)| !vocabulary.contains_key(&letter.to_string()))
        .map(|(byte, _)| byte)
        .collect()
}

/// `0x7E, 0x80`: bytes as a message lists them.
fn hex_list(bytes: &[u8]) -> String {
    let shown: Vec<String> = bytes
        .iter()
        .take(16)
        .map(|b| format!("0x{b:02X}"))
        .collect();
    let more = bytes.len().saturating_sub(16);
    if more == 0 {
        shown.join(", ")
    } else {
        format!("{} and {more} more", shown.join(", "))
    }
}

/// GPT-2's spelling of bytes as characters (`bytes_to_unicode`): printable bytes as themselves,
/// the others as the characters from U+0100 on, in byte order (the vocabulary keys of every
/// byte-level BPE).
pub fn byte_spelling() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100 .. U+0143 are characters")
            }
        })
        .collect()
}

/// Texts tokenised once: a training loop's targets are encoded the first time they are seen and
/// served from memory after (LatentWire re-tokenised every target at every step).
///
/// ```no_run
/// use kiln_text::{TextTokenizer, TokenCache};
///
/// let tokenizer = TextTokenizer::from_hf_dir("SmolLM2-135M-Instruct")?;
/// let mut cache = TokenCache::new(tokenizer);
/// let first = cache.ids("a caption")?;
/// let again = cache.ids("a caption")?; // no tokenisation
/// assert!(std::sync::Arc::ptr_eq(&first, &again));
/// # Ok::<(), kiln_text::TextError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TokenCache {
    tokenizer: TextTokenizer,
    encoded: HashMap<String, Arc<[u32]>>,
}

impl TokenCache {
    /// An empty cache over `tokenizer`.
    pub fn new(tokenizer: TextTokenizer) -> Self {
        TokenCache {
            tokenizer,
            encoded: HashMap::new(),
        }
    }

    /// The ids of `text`, encoded on first use.
    pub fn ids(&mut self, text: &str) -> Result<Arc<[u32]>, TextError> {
        if let Some(ids) = self.encoded.get(text) {
            return Ok(ids.clone());
        }
        let ids: Arc<[u32]> = self.tokenizer.encode(text)?.into();
        self.encoded.insert(text.to_string(), ids.clone());
        Ok(ids)
    }

    /// Distinct texts encoded so far.
    pub fn len(&self) -> usize {
        self.encoded.len()
    }

    /// Whether nothing was encoded yet.
    pub fn is_empty(&self) -> bool {
        self.encoded.is_empty()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_spelled_as_gpt2_spells_them() {
        let spelling = byte_spelling();
        assert_eq!(
            (spelling[b' ' as usize], spelling[b'\n' as usize]),
            ('Ġ', 'Ċ')
        );
        assert_eq!((spelling[b'a' as usize], spelling[0]), ('a', 'Ā'));
        let mut sorted = spelling.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 256, "each byte its own character");
    }

    /// A byte-level BPE of every byte but `~`, with `<~>` an added token: what a damaged
    /// vocabulary (a GGUF file's, say) looks like.
    fn without_tilde() -> TextTokenizer {
        let vocab: serde_json::Map<String, Value> = byte_spelling()
            .into_iter()
            .filter(|&letter| letter != '~')
            .enumerate()
            .map(|(id, letter)| (letter.to_string(), serde_json::json!(id)))
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
            "added_tokens": [{"id": 255, "content": "<~>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": []},
        });
        TextTokenizer::from_json(&json.to_string(), None).unwrap()
    }

    #[test]
    fn characters_the_vocabulary_cannot_spell_are_refused_not_dropped() {
        let tokenizer = without_tilde();
        assert_eq!(tokenizer.unspelled, [b'~']);
        // The premise: `tokenizers` itself drops the character without a word.
        let dropped = tokenizer.tokenizer.encode("a ~ b", false).unwrap();
        assert_eq!(tokenizer.decode(dropped.get_ids(), false).unwrap(), "a  b");

        let err = tokenizer.encode("a ~ b").unwrap_err().to_string();
        assert!(err.contains("'~' (character 3)"), "{err}");
        assert!(err.contains("0x7E"), "{err}");
        let err = tokenizer.encode_without_special_tokens("~").unwrap_err();
        assert!(err.to_string().contains("(character 1)"), "{err}");
        // What it can spell, and `~` inside an added token (matched whole), encode as before.
        for text in ["a b", "a<~>b", "", "☃ 狐"] {
            let ids = tokenizer.encode(text).unwrap();
            assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
        }
    }

    #[test]
    fn whole_vocabularies_have_nothing_unspelled() {
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama");
        let tokenizer = TextTokenizer::from_hf_dir(fixture).unwrap();
        assert!(tokenizer.unspelled.is_empty());
        assert!(tokenizer.encode("a ~ b ☃").is_ok());
    }

    fn with_template(template: &str) -> TextTokenizer {
        let tokenizer = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
        TextTokenizer::from_parts(tokenizer, Some(template.into()), HashMap::new())
    }

    fn rendered(template: &str) -> Result<String, String> {
        let chat = [Message::new("user", "Hi!")];
        (with_template(template).apply_chat_template(&chat, true)).map_err(|e| e.to_string())
    }

    /// A template read from a model file is untrusted: one that loops without end or doubles a
    /// string until memory runs out is refused, in the template's terms; real ones render.
    #[test]
    fn a_chat_template_renders_within_its_budget() {
        let plain = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
        assert_eq!(rendered(plain).unwrap(), "<user>Hi!");
        let nested = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}\
                      {% endfor %}";
        let err = rendered(nested).unwrap_err();
        assert!(
            err.contains("the model's chat template: took more than 10000000 steps"),
            "{err}"
        );
        let doubling = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}\
                        {% set ns.s = ns.s ~ ns.s %}{{ ns.s }}{% endfor %}";
        let err = rendered(doubling).unwrap_err();
        assert!(
            err.contains("wrote more than 1048588 bytes for 1 messages of 3 bytes"),
            "{err}"
        );
        let none = TextTokenizer::from_parts(
            tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()),
            None,
            HashMap::new(),
        );
        let err = none.apply_chat_template(&[], true).unwrap_err().to_string();
        assert!(
            err.contains("a GGUF file's tokenizer.chat_template"),
            "{err}"
        );
    }
}
