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
        Ok(TextTokenizer {
            tokenizer,
            chat_template,
            specials,
        })
    }

    /// A tokenizer built elsewhere (from a GGUF file's metadata), with its chat template and the
    /// texts of its special tokens (`bos_token`, ...).
    pub(crate) fn from_parts(
        tokenizer: tokenizers::Tokenizer,
        chat_template: Option<String>,
        specials: HashMap<String, String>,
    ) -> Self {
        TextTokenizer {
            tokenizer,
            chat_template,
            specials,
        }
    }

    /// The ids of `text`, with the special tokens the tokenizer's post-processor adds (as
    /// transformers' `tokenizer(text)` gives them).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.tokenizer
            .encode(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// The ids of `text` alone, no special tokens added (transformers'
    /// `tokenizer(text, add_special_tokens=False)`: for text a chat template already marked up).
    pub fn encode_without_special_tokens(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.tokenizer
            .encode(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TextError::Tokenizer(e.to_string()))
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
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            TextError::Tokenizer(
                "the checkpoint has no chat_template in tokenizer_config.json: give the prompt \
                 as plain text"
                    .into(),
            )
        })?;
        let mut environment = Environment::new();
        minijinja_contrib::add_to_environment(&mut environment);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        let jinja = |e: JinjaError| TextError::Tokenizer(format!("chat template: {e}"));
        environment.add_template("chat", template).map_err(jinja)?;
        let special = |name: &str| self.special(name).unwrap_or_default().to_string();
        environment
            .get_template("chat")
            .map_err(jinja)?
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => special("bos_token"),
                eos_token => special("eos_token"),
            })
            .map_err(jinja)
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
