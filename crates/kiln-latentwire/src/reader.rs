//! One frozen language model reading a prompt: the user's turn of its chat template holding the
//! content (the text, its first `M` tokens, or the soft prompt the adapter made from the latents),
//! the assistant's turn opened with LatentWire's anchor ([`ANCHOR`]), then the answer.
//!
//! Every prompt kind goes through the same template, so the text, the token budget and the latent
//! prefix differ only in what fills the user's turn (LatentWire's train.py put its anchor text,
//! BOS and chat header around the prefix differently for each loss, and its teacher-forced loss
//! was shifted twice; kiln composes every loss from one layout, notes in docs/LATENTWIRE.md).
//!
//! The template's opening (the system turn and the user's header) is the same in every prompt:
//! its keys and values are computed once per model (kiln-text's `CausalLm::prefix`), and every
//! forward, training's included, starts after them. A batch's rows are laid out so that every
//! answer starts at the same column: the content is padded on its left, the answer on its right
//! (`[opening (cached)][pad…, content, after, answer, pad…]`), and the padding is masked. The
//! logits are computed from the column before the answer on.

use std::path::Path;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use kiln_core::{Policy, Precision};
use kiln_text::{
    CausalLm, CausalLmOutput, GenerationConfig, KvCache, Message, SharedPrefix, TextInput,
    TextTokenizer, generate_after,
};

use serde::{Deserialize, Serialize};

use crate::LatentWireError;

/// Where the user's content sits in a language model's prompt: the ids before it and after it
/// (the assistant's turn opened and [`ANCHOR`] written), and the id that ends the assistant's
/// turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The ids before the content (system turn, user header).
    pub before: Vec<u32>,
    /// The ids after the content (user turn closed, assistant header, [`ANCHOR`]).
    pub after: Vec<u32>,
    /// The id that ends an answer (the tokenizer's `eos_token`).
    pub end: u32,
}

/// The text every answer follows, its first words in the assistant's turn: LatentWire's
/// `"Answer: "` anchor (train.py's `DEFAULT_ANSWER_PREFIX`), so that a model starts its turn with
/// the answer rather than a sentence leading to it. Its space goes with the answer's first token
/// ([`Reader::answer_ids`]), as the tokenizer splits `"Answer: Paris"`.
pub const ANCHOR: &str = "Answer:";

/// Where a latent prefix sits, and how answers follow their prompts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// kiln's: every prompt kind in the user's turn of the chat template (after
    /// [`SYSTEM_PROMPT`]), the assistant's turn opened with [`ANCHOR`], the answer's space joined
    /// to its first token.
    #[default]
    Chat,
    /// LatentWire's default (`models.py` at 220ce571): the latent prefix alone at position 0, no
    /// BOS, no template and no anchor, the answer right after it; token prompts in the chat
    /// template without the anchor; answers tokenized alone, with no space before them (the BOS
    /// LatentWire's Llama tokenizer adds is not: it is no part of the answer).
    Latentwire,
}

impl Layout {
    /// `chat` or `latentwire`.
    pub fn parse(text: &str) -> Result<Layout, String> {
        match text {
            "chat" => Ok(Layout::Chat),
            "latentwire" => Ok(Layout::Latentwire),
            _ => Err(format!("{text:?}: the layout is `chat` or `latentwire`")),
        }
    }
}

/// What stands in the content's place while the template is rendered.
const CONTENT: &str = "KILN_LATENTWIRE_CONTENT";

/// The system turn of every prompt: LatentWire's `SYSTEM_PROMPT` (`core_utils.py`), which its
/// chat-mode prompts carry.
pub const SYSTEM_PROMPT: &str = "You are a concise QA assistant. Use the context to answer with \
a short phrase only. Answer in English. Respond with the answer phrase only.";

impl Template {
    /// The template of `tokenizer`: its chat template around [`SYSTEM_PROMPT`] and one user
    /// turn (the user turn alone where the template refuses a system turn), rendered as
    /// transformers' `apply_chat_template(..., add_generation_prompt=True)` and tokenized without
    /// adding special tokens (the template writes its own), then [`ANCHOR`]; without a chat
    /// template, the content followed by a new line and [`ANCHOR`]. Under
    /// [`Layout::Latentwire`], without [`ANCHOR`].
    pub fn of(tokenizer: &TextTokenizer, layout: Layout) -> Result<Template, LatentWireError> {
        let anchor = match layout {
            Layout::Chat => ANCHOR,
            Layout::Latentwire => "",
        };
        let eos = tokenizer.special("eos_token").ok_or_else(|| {
            LatentWireError::Input("the tokenizer names no eos_token to end an answer".into())
        })?;
        let end = tokenizer.token_id(eos).ok_or_else(|| {
            LatentWireError::Input(format!("the tokenizer's eos_token {eos:?} has no id"))
        })?;
        let (before, after) = if tokenizer.has_chat_template() {
            let user = Message::new("user", CONTENT);
            let with_system = [Message::new("system", SYSTEM_PROMPT), user.clone()];
            let rendered = (tokenizer.apply_chat_template(&with_system, true))
                .or_else(|_| tokenizer.apply_chat_template(&[user], true))?;
            let (before, after) = rendered.split_once(CONTENT).ok_or_else(|| {
                LatentWireError::Input("the chat template drops the user's message".into())
            })?;
            (before.to_string(), format!("{after}{anchor}"))
        } else {
            (String::new(), format!("\n{anchor}"))
        };
        Ok(Template {
            before: tokenizer.encode_without_special_tokens(&before)?,
            after: tokenizer.encode_without_special_tokens(&after)?,
            end,
        })
    }
}

impl Template {
    /// Token contents (any lengths) in the user's turn followed by `answers`, one row each, after
    /// the template's opening ([`Reader::forward`] reads them after its cached keys and values).
    pub fn compose_tokens<B: Backend>(
        &self,
        rows: &[Vec<u32>],
        answers: &[Vec<u32>],
    ) -> Composed<B> {
        assert_eq!(rows.len(), answers.len(), "one answer per row");
        let after = &self.after;
        let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
        let (mut ids, mut masks) = (Vec::new(), Vec::new());
        for (content, answer) in rows.iter().zip(answers) {
            let padded = vec![self.end; longest - content.len()];
            let (answer, answer_mask) = self.answer_part(answer, answers);
            ids.push([padded.as_slice(), content, after, &answer].concat());
            let real = content.len() + after.len();
            masks.push([vec![false; padded.len()], vec![true; real], answer_mask].concat());
        }
        let input = TextInput::ids(ids).with_attention_mask(masks);
        composed(input, longest + after.len(), answers, true)
    }

    /// `answer` padded on the right to the longest of `answers`, and its mask.
    fn answer_part(&self, answer: &[u32], answers: &[Vec<u32>]) -> (Vec<u32>, Vec<bool>) {
        let padding = longest(answers) - answer.len();
        let ids = [answer, &vec![self.end; padding]].concat();
        let mask = [vec![true; answer.len()], vec![false; padding]].concat();
        (ids, mask)
    }
}

/// The longest of `answers`.
fn longest(answers: &[Vec<u32>]) -> usize {
    answers.iter().map(Vec::len).max().unwrap_or(0)
}

/// `input` whose answers start at column `answer_start`, its logits from the column before,
/// read after the template's opening where `after_opening`.
fn composed<B: Backend>(
    input: TextInput<B>,
    answer_start: usize,
    answers: &[Vec<u32>],
    after_opening: bool,
) -> Composed<B> {
    Composed {
        input: input.with_logits_from(answer_start.saturating_sub(1)),
        answer_start,
        window: longest(answers) + 1,
        after_opening,
    }
}

/// What fills the user's turn, for every row of a batch.
#[derive(Debug, Clone)]
pub enum Contents<B: Backend> {
    /// Token ids per row (the text, or its first `M` tokens), any lengths.
    Tokens(Vec<Vec<u32>>),
    /// A soft prompt `[batch, M, hidden]` read through the input embeddings.
    Embeddings(Tensor<B, 3>),
}

impl<B: Backend> Contents<B> {
    fn rows(&self) -> usize {
        match self {
            Contents::Tokens(rows) => rows.len(),
            Contents::Embeddings(x) => x.dims()[0],
        }
    }

    /// The rows `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Contents<B> {
        match self {
            Contents::Tokens(ids) => {
                Contents::Tokens(rows.iter().map(|&r| ids[r].clone()).collect())
            }
            Contents::Embeddings(x) => {
                let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                let index = TensorData::new(index, [rows.len()]);
                let index = Tensor::<B, 1, Int>::from_data(index, &x.device());
                Contents::Embeddings(x.clone().select(0, index))
            }
        }
    }
}

/// A batch laid out for one language model: its input, and where the answers start.
#[derive(Debug, Clone)]
pub struct Composed<B: Backend> {
    /// The forward's input; its logits start one column before the answers.
    pub input: TextInput<B>,
    /// The column of every row's first answer token.
    pub answer_start: usize,
    /// The columns of logits the forward returns: the longest answer plus one.
    pub window: usize,
    /// Whether the input follows the template's opening (read from its cache); a latent
    /// prefix under [`Layout::Latentwire`] starts at position 0.
    pub after_opening: bool,
}

/// A frozen language model with its tokenizer and template (a module, so that training moves
/// it to the autodiff backend and back: its parameters never take a gradient).
#[derive(Module, Debug)]
pub struct Reader<B: Backend> {
    lm: CausalLm<B>,
    #[module(skip)]
    name: String,
    #[module(skip)]
    tokenizer: TextTokenizer,
    #[module(skip)]
    template: Template,
    /// The keys and values of the template's opening, computed once (none without one).
    #[module(skip)]
    opening: Option<SharedPrefix>,
    #[module(skip)]
    embedding_rms: f32,
    #[module(skip)]
    layout: Layout,
}

impl<B: Backend> Reader<B> {
    /// `lm` frozen (no parameter takes a gradient), read through `tokenizer`; `name` labels its
    /// results.
    pub fn new(
        name: impl Into<String>,
        lm: CausalLm<B>,
        tokenizer: TextTokenizer,
    ) -> Result<Self, LatentWireError> {
        let template = Template::of(&tokenizer, Layout::Chat)?;
        let vocab = lm.config().vocab_size;
        let too_large = template
            .before
            .iter()
            .chain(&template.after)
            .chain([&template.end]);
        if let Some(id) = too_large.into_iter().find(|&&id| id as usize >= vocab) {
            return Err(LatentWireError::Input(format!(
                "the tokenizer's template uses id {id}, outside the model's vocabulary of {vocab}"
            )));
        }
        let name = name.into();
        let (around, positions) = (
            template.before.len() + template.after.len(),
            lm.config().max_position_embeddings,
        );
        if around >= positions {
            return Err(LatentWireError::Input(format!(
                "{name}: its chat template around the content is {around} tokens, and the model \
                 reads at most {positions} positions"
            )));
        }
        // The rows the model reads: Gemma 3 scales its table's by √hidden.
        let embedding_rms = rms(lm.input_embeddings()) * lm.embedding_scale();
        let opening = opening(&lm, &template)?;
        Ok(Reader {
            name,
            lm: lm.no_grad(),
            tokenizer,
            template,
            opening,
            embedding_rms,
            layout: Layout::Chat,
        })
    }

    /// The same model read in `layout` (its template made again; under
    /// [`Layout::Latentwire`], answers tokenized without the space before them).
    pub fn with_layout(self, layout: Layout) -> Result<Self, LatentWireError> {
        let template = Template::of(&self.tokenizer, layout)?;
        let opening = opening(&self.lm, &template)?;
        Ok(Reader {
            template,
            opening,
            layout,
            ..self
        })
    }

    /// How its prompts are laid out.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The Hugging Face checkpoint directory `dir` (config.json, model.safetensors,
    /// tokenizer.json, tokenizer_config.json), in f32, named after the directory.
    pub fn from_hf_dir(dir: &Path, device: &B::Device) -> Result<Self, LatentWireError> {
        if !dir.is_dir() {
            return Err(LatentWireError::Input(format!(
                "{}: no such language model directory",
                dir.display()
            )));
        }
        let lm = CausalLm::from_hf_dir(dir, device, &Policy::full())?;
        let tokenizer = TextTokenizer::from_hf_dir(dir)?;
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Self::new(name, lm, tokenizer)
    }

    /// The language model under `policy` (kiln-text's `CausalLm::with_policy`: its parameters
    /// stored and its forwards computed in the policy's dtypes); the soft prompt joins it in
    /// its own dtype and is cast as the model computes.
    ///
    /// # Errors
    /// A policy other than f32 parameters and outputs computing in f32, f16 or bf16 (`full`,
    /// `mixed-bf16`, `mixed-f16`): the trained soft prompt and adapters are f32 and meet the
    /// frozen model's embeddings and outputs in f32, so pure half or f64 policies are refused
    /// before any work; and a policy the language model cannot compute its chat template's
    /// opening under (computed again, in the policy's dtypes).
    pub fn with_policy(self, policy: &Policy) -> Result<Self, LatentWireError> {
        let f32_edges = policy.param == Precision::F32 && policy.output == Precision::F32;
        if !f32_edges || policy.compute == Precision::F64 {
            return Err(LatentWireError::Input(format!(
                "policy {policy}: LatentWire keeps the frozen models' parameters and outputs in \
                 f32 (the trained soft prompt meets them there) and computes in f32, f16 or \
                 bf16: use full, mixed-bf16 or mixed-f16"
            )));
        }
        let lm = self.lm.with_policy(policy);
        let opening = opening(&lm, &self.template)?;
        Ok(Reader {
            lm,
            opening,
            ..self
        })
    }

    /// The name its results carry.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The language model.
    pub fn lm(&self) -> &CausalLm<B> {
        &self.lm
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Where the content sits in its prompts.
    pub fn template(&self) -> &Template {
        &self.template
    }

    /// The width of its input embeddings, which the adapter's soft prompt has.
    pub fn model_width(&self) -> usize {
        self.lm.config().hidden_size
    }

    /// The root mean square of its input embedding table (every row), the scale its soft prompts
    /// are given.
    pub fn embedding_rms(&self) -> f32 {
        self.embedding_rms
    }

    /// The ids of `text` as content or answer, without special tokens; an error where the
    /// tokenizer gives an id outside the model's vocabulary or nothing at all.
    pub fn ids(&self, text: &str) -> Result<Vec<u32>, LatentWireError> {
        let ids = self.tokenizer.encode_without_special_tokens(text)?;
        let vocab = self.lm.config().vocab_size;
        if ids.is_empty() && !text.is_empty() {
            return Err(LatentWireError::Input(format!(
                "{}: the tokenizer gives no tokens for {text:?}",
                self.name
            )));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(LatentWireError::Input(format!(
                "{}: the tokenizer encodes {text:?} with id {id}, outside the model's vocabulary \
                 of {vocab}",
                self.name
            )));
        }
        Ok(ids)
    }

    /// The ids of `answer` after [`ANCHOR`] (under [`Layout::Latentwire`], `answer`'s own ids,
    /// no space before them): those the tokenizer gives `"Answer: {answer}"` past
    /// the anchor's own (the space joined to the answer's first token, as in running text);
    /// `" {answer}"` alone where the anchor's ids are not a prefix of them; none for an empty
    /// answer.
    pub fn answer_ids(&self, answer: &str) -> Result<Vec<u32>, LatentWireError> {
        if answer.is_empty() {
            return Ok(Vec::new());
        }
        if self.layout == Layout::Latentwire {
            return self.ids(answer);
        }
        let anchor = self.ids(ANCHOR)?;
        let anchored = self.ids(&format!("{ANCHOR} {answer}"))?;
        match anchored.strip_prefix(anchor.as_slice()) {
            Some(answer_ids) if !answer_ids.is_empty() => Ok(answer_ids.to_vec()),
            _ => self.ids(&format!(" {answer}")),
        }
    }

    /// The position in `answer` (ids) of its first content token: the first whose text is not
    /// whitespace alone (SmolLM2's tokenizer starts `" 12 May 1740"` with a bare space token);
    /// the first where every one is.
    pub fn first_content_token(&self, answer: &[u32]) -> Result<usize, LatentWireError> {
        for (at, &id) in answer.iter().enumerate() {
            if !self.tokenizer.decode(&[id], false)?.trim().is_empty() {
                return Ok(at);
            }
        }
        Ok(0)
    }

    /// `prefix` `[batch, M, hidden]` scaled so that each row's root mean square over its `M ×
    /// hidden` values is the input embeddings' (LatentWire's `calibrate_to_embed_rms`; the
    /// gradient flows through the row's RMS too).
    pub fn calibrate(&self, prefix: Tensor<B, 3>) -> Tensor<B, 3> {
        let row_rms = (prefix.clone().powi_scalar(2))
            .mean_dim(2)
            .mean_dim(1)
            .sqrt()
            .clamp_min(1e-6);
        prefix / row_rms * self.embedding_rms
    }

    /// `contents` in the user's turn followed by `answers` (ids, each ending where its row's
    /// answer ends; give the end id where the answer should be scored as finished), one row each.
    pub fn compose(&self, contents: Contents<B>, answers: &[Vec<u32>]) -> Composed<B> {
        assert_eq!(contents.rows(), answers.len(), "one answer per row");
        match contents {
            Contents::Tokens(rows) => self.template.compose_tokens(&rows, answers),
            Contents::Embeddings(prefix) => {
                let [_, latents, _] = prefix.dims();
                let device = prefix.device();
                let after: &[u32] = match self.layout {
                    Layout::Chat => &self.template.after,
                    Layout::Latentwire => &[],
                };
                let (mut right, mut masks) = (Vec::new(), Vec::new());
                for answer in answers {
                    let (answer, answer_mask) = self.template.answer_part(answer, answers);
                    right.push([after, &answer].concat());
                    masks.push([vec![true; latents + after.len()], answer_mask].concat());
                }
                let dtype = FloatDType::from(prefix.dtype());
                let mut pieces = vec![prefix];
                if !right[0].is_empty() {
                    pieces.push(self.embed(&right, &device).cast(dtype));
                }
                let input = TextInput::embeddings(Tensor::cat(pieces, 1));
                composed(
                    input.with_attention_mask(masks),
                    latents + after.len(),
                    answers,
                    self.layout == Layout::Chat,
                )
            }
        }
    }

    /// The language model's forward over `composed`, after the template's opening.
    pub fn forward(&self, composed: Composed<B>) -> Result<CausalLmOutput<B>, LatentWireError> {
        self.forward_with(&self.lm, composed)
    }

    /// [`Self::forward`] through `lm`, this reader's model on any backend (the autodiff one's
    /// inner, for a teacher that takes no gradient).
    pub(crate) fn forward_with<C: Backend>(
        &self,
        lm: &CausalLm<C>,
        composed: Composed<C>,
    ) -> Result<CausalLmOutput<C>, LatentWireError> {
        let batch = composed.input.tokens.dims().0;
        let mut cache = match (&self.opening, composed.after_opening) {
            (Some(opening), true) => KvCache::discarding_after(opening, batch),
            _ => KvCache::discarding(),
        };
        Ok(lm.forward_cached(composed.input, &mut cache)?)
    }

    /// The model's final hidden states `[texts, tokens, hidden]` of `texts` (ids, any lengths;
    /// the shorter continued with the end id, which a causal model reads after the text), without
    /// the template: what the state encoder reads. Computed without gradient.
    pub fn text_states(&self, texts: &[Vec<u32>]) -> Result<Tensor<B, 3>, LatentWireError> {
        let longest = texts.iter().map(Vec::len).max().unwrap_or(0);
        if longest == 0 {
            return Err(LatentWireError::Input(format!(
                "{}: no text to read hidden states of",
                self.name
            )));
        }
        let end = self.template.end;
        let rows = (texts.iter())
            .map(|text| [text.as_slice(), &vec![end; longest - text.len()]].concat())
            .collect();
        let input = TextInput::ids(rows).with_last_logits_only();
        Ok(self.lm.forward(input)?.last_hidden_state.detach())
    }

    /// Each row's continuation of `contents` in the user's turn, the assistant's turn opened
    /// (kiln-text's generation, after the template's opening).
    pub fn generate(
        &self,
        contents: Contents<B>,
        config: &GenerationConfig,
    ) -> Result<Vec<Vec<u32>>, LatentWireError> {
        let rows = contents.rows();
        let composed = self.compose(contents, &vec![Vec::new(); rows]);
        let cache = match (&self.opening, composed.after_opening) {
            (Some(opening), true) => KvCache::after(opening, rows),
            _ => KvCache::new(),
        };
        let prompt = composed.input;
        Ok(generate_after(&self.lm, cache, prompt, config, |_| {})?)
    }

    /// The input embeddings of rows of ids (all as long) `[rows, ids, hidden]`.
    fn embed(&self, rows: &[Vec<u32>], device: &B::Device) -> Tensor<B, 3> {
        let width = rows.first().map_or(0, Vec::len);
        let ids: Vec<i64> = rows.iter().flatten().map(|&id| i64::from(id)).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows.len(), width]), device);
        self.lm.embed(ids)
    }
}

/// The keys and values of `template`'s opening read by `lm` (none when it has none).
fn opening<B: Backend>(
    lm: &CausalLm<B>,
    template: &Template,
) -> Result<Option<SharedPrefix>, LatentWireError> {
    if template.before.is_empty() {
        return Ok(None);
    }
    Ok(Some(lm.prefix(&template.before)?))
}

/// The root mean square of every value of `x`.
fn rms<B: Backend>(x: Tensor<B, 2>) -> f32 {
    let values = x.into_data().convert::<f32>();
    let values = values.as_slice::<f32>().expect("converted to f32");
    let sum: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    (sum / values.len().max(1) as f64).sqrt() as f32
}
