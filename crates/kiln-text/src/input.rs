//! What a forward pass takes: token ids or embeddings, which of them are padding, and where
//! each token sits in its sequence.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// The new tokens of a batch, as ids or as embeddings.
#[derive(Debug, Clone)]
pub enum Tokens<B: Backend> {
    /// Token ids `[batch][tokens]`, every row as long.
    Ids(Vec<Vec<u32>>),
    /// Input embeddings `[batch, tokens, hidden]` (the foveated model splices visual tokens in).
    Embeddings(Tensor<B, 3>),
}

impl<B: Backend> Tokens<B> {
    /// `(batch, tokens)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Tokens::Ids(ids) => (ids.len(), ids.first().map_or(0, Vec::len)),
            Tokens::Embeddings(x) => {
                let [batch, tokens, _] = x.dims();
                (batch, tokens)
            }
        }
    }
}

/// One forward pass's input.
///
/// ```
/// use burn::backend::Flex;
/// use kiln_text::TextInput;
///
/// // Two prompts of different lengths, left-padded with id 0 into one batch.
/// let input = TextInput::<Flex>::left_padded(&[vec![5, 6, 7], vec![8]], 0)?;
/// assert_eq!(input.attention_mask.as_ref().unwrap()[1], [false, false, true]);
/// # Ok::<(), kiln_text::TextError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TextInput<B: Backend> {
    /// The new tokens.
    pub tokens: Tokens<B>,
    /// `[batch][tokens]`: `false` marks padding, which no token attends to (all real without).
    pub attention_mask: Option<Vec<Vec<bool>>>,
    /// `[batch][tokens]`: each token's position; without, each real token's count of real tokens
    /// before it in its sequence (cache included), and 0 for padding.
    pub position_ids: Option<Vec<Vec<usize>>>,
    /// Whether to return every hidden state.
    pub hidden_states: bool,
    /// Which tokens get logits.
    pub logits: Logits,
}

/// Which tokens of a forward pass get next-token logits (the vocabulary projection is often the
/// largest product of a small model's pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Logits {
    /// Every token.
    #[default]
    All,
    /// The last token only (generation).
    Last,
    /// The tokens from this position on (scoring a continuation: training on a caption).
    From(usize),
}

impl<B: Backend> TextInput<B> {
    /// Token ids `[batch][tokens]`, none of them padding.
    pub fn ids(ids: Vec<Vec<u32>>) -> Self {
        Self::new(Tokens::Ids(ids))
    }

    /// Input embeddings `[batch, tokens, hidden]`, none of them padding.
    pub fn embeddings(x: Tensor<B, 3>) -> Self {
        Self::new(Tokens::Embeddings(x))
    }

    /// Sequences of different lengths left-padded with `pad` to the longest, with the mask
    /// that marks the padding.
    pub fn left_padded(sequences: &[Vec<u32>], pad: u32) -> Result<Self, crate::TextError> {
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(sequences.len());
        let mut mask = Vec::with_capacity(sequences.len());
        for sequence in sequences {
            let padding = longest - sequence.len();
            ids.push([vec![pad; padding], sequence.clone()].concat());
            mask.push([vec![false; padding], vec![true; sequence.len()]].concat());
        }
        Ok(Self::ids(ids).with_attention_mask(mask))
    }

    fn new(tokens: Tokens<B>) -> Self {
        TextInput {
            tokens,
            attention_mask: None,
            position_ids: None,
            hidden_states: false,
            logits: Logits::All,
        }
    }

    /// With a padding mask `[batch][tokens]` (`false` = padding).
    pub fn with_attention_mask(mut self, mask: Vec<Vec<bool>>) -> Self {
        self.attention_mask = Some(mask);
        self
    }

    /// With explicit positions `[batch][tokens]`.
    pub fn with_position_ids(mut self, positions: Vec<Vec<usize>>) -> Self {
        self.position_ids = Some(positions);
        self
    }

    /// Returning every hidden state.
    pub fn with_hidden_states(mut self) -> Self {
        self.hidden_states = true;
        self
    }

    /// Computing the last token's logits only.
    pub fn with_last_logits_only(mut self) -> Self {
        self.logits = Logits::Last;
        self
    }

    /// Computing the logits of the tokens from `position` (0-based) on only.
    pub fn with_logits_from(mut self, position: usize) -> Self {
        self.logits = Logits::From(position);
        self
    }
}
