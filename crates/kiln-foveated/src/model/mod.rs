//! The model: backbones, connectors, the readouts and the two passes. Its batches and their
//! checks are in `batch.rs`, what a forward gives in `output.rs`, the loss in `loss.rs`.

mod batch;
mod loss;
mod output;

use std::path::Path;

use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use kiln_core::{Policy, load_checkpoint};
use kiln_text::{CausalLm, KvCache, TextInput};
use kiln_vision::{Dinov2Model, Dinov2Patches, VisionModel};

use crate::{Connectors, FoveatedConfig, FoveatedError, Readout};

pub use batch::ClipBatch;
pub use output::{FoveatedOutput, Glimpse, Losses, PassOutput};

/// Which passes run, and where the fine pass's queries come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The coarse pass only (every frame read by `q_static`).
    CoarseOnly,
    /// Both passes, the fine queries from the coarse pass's hidden states (training).
    CoarseFine,
    /// The fine pass only, each query from the fine pass's own hidden state at the previous
    /// frame, one frame at a time (inference).
    Autoregressive,
    /// A control: both passes, the fine queries drawn from N(0, 1) afresh for every forward —
    /// reading somewhere else, not where the model chose.
    RandomQueries,
    /// A control: no readout, the LM sees every token of every frame (in
    /// [`FoveatedOutput::fine`]) — the upper bound with nothing compressed.
    AllPatches,
}

/// fVLM's foveated model: DINOv2, the LM, and the [`Connectors`] between them.
#[derive(Module, Debug)]
pub struct FoveatedModel<B: Backend> {
    /// The frame encoder.
    pub dino: Dinov2Model<B>,
    /// The language model.
    pub lm: CausalLm<B>,
    /// The foveated model's own parameters.
    pub connectors: Connectors<B>,
    #[module(skip)]
    config: FoveatedConfig,
    #[module(skip)]
    training: Mode,
}

impl<B: Backend> FoveatedModel<B> {
    /// DINOv2 from the Hugging Face directory `dino`, the LM from `lm`, newly initialised
    /// connectors of `config`.
    pub fn from_dirs(
        dino: impl AsRef<Path>,
        lm: impl AsRef<Path>,
        config: FoveatedConfig,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, FoveatedError> {
        let dino_dir = dino.as_ref();
        let dino = match VisionModel::from_hf_dir(dino_dir, device, policy)?.into_tower() {
            Ok(model) => model,
            Err(other) => {
                return Err(FoveatedError::Config(format!(
                    "{}: a {} vision tower; the foveated model reads frames with DINOv2",
                    dino_dir.display(),
                    other.family()
                )));
            }
        };
        let lm = CausalLm::from_hf_dir(lm, device, policy)?;
        Self::new(dino, lm, config, device)
    }

    /// The model from its parts, with newly initialised connectors.
    pub fn new(
        dino: Dinov2Model<B>,
        lm: CausalLm<B>,
        config: FoveatedConfig,
        device: &B::Device,
    ) -> Result<Self, FoveatedError> {
        let config = config.validate()?;
        let vision = dino.hidden_size();
        if config.readout == Readout::Shallow && !vision.is_multiple_of(config.shallow_heads) {
            return Err(FoveatedError::Config(format!(
                "the shallow readout's {} heads do not divide DINOv2's width {vision}",
                config.shallow_heads
            )));
        }
        let connectors = Connectors::init(&config, vision, lm.config().hidden_size, device);
        Ok(FoveatedModel {
            dino,
            lm,
            connectors,
            config,
            training: Mode::CoarseFine,
        })
    }

    /// The connectors saved in `dir` (`model.safetensors` in PyTorch's names and layouts, as
    /// fVLM's state dict has them), in place of the current ones.
    pub fn with_connectors_from(mut self, dir: impl AsRef<Path>) -> Result<Self, FoveatedError> {
        let dir = dir.as_ref();
        self.connectors = load_checkpoint(self.connectors, dir, &[], &[])?;
        Ok(self)
    }

    /// The settings.
    pub fn config(&self) -> &FoveatedConfig {
        &self.config
    }

    /// The mode kiln-train's steps run ([`Mode::CoarseFine`] unless set).
    pub fn training_mode(&self) -> Mode {
        self.training
    }

    /// The most target tokens one LM pass of the training mode has room for after a
    /// `prompt`-token prompt over `frames` frames: the LM's positions less the prompt, the mode
    /// token and the visual tokens (one a frame; every DINOv2 token of a frame for
    /// [`Mode::AllPatches`]). Loaders refuse longer captions up front.
    pub fn target_room(&self, prompt: usize, frames: usize) -> usize {
        let per_frame = match self.training {
            Mode::AllPatches => {
                let dino = self.dino.config();
                (dino.image_size / dino.patch_size).pow(2) + 1
            }
            _ => 1,
        };
        let positions = self.lm.config().max_position_embeddings;
        positions.saturating_sub(prompt + 1 + frames * per_frame)
    }

    /// The same model, trained and evaluated in `mode` (a static-only control trains
    /// [`Mode::CoarseOnly`]).
    pub fn with_training_mode(mut self, mode: Mode) -> Self {
        self.training = mode;
        self
    }

    /// Every frame of `pixels` `[clips, frames, 3, H, W]` through DINOv2 in one batch (frame
    /// `t` of clip `c` is row `c · frames + t`), keeping what the readouts read.
    pub fn encode_frames(&self, pixels: Tensor<B, 5>) -> Result<Dinov2Patches<B>, FoveatedError> {
        let [clips, frames, channels, height, width] = pixels.dims();
        let flat = pixels.reshape([clips * frames, channels, height, width]);
        let patches = self.dino.encode_patches(flat)?;
        Ok(if self.config.keep_cls {
            patches
        } else {
            patches.without_cls()
        })
    }

    /// What `queries` `[frames, query_dim]` read from `patches` (one query per frame).
    pub fn read(
        &self,
        patches: &Dinov2Patches<B>,
        queries: Tensor<B, 2>,
    ) -> Result<Glimpse<B>, FoveatedError> {
        let connectors = &self.connectors;
        let queries = connectors
            .query_input_proj
            .forward(queries)
            .unsqueeze_dim(1);
        let (read, attention) = match self.config.readout {
            Readout::Deep => {
                let reading = self.dino.read_with_attention(queries, patches)?;
                (reading.output, Tensor::cat(reading.attention, 1))
            }
            Readout::Shallow => shallow_read(
                queries,
                patches.last_hidden_state.clone(),
                self.config.shallow_heads,
            ),
        };
        let [frames, _, width] = read.dims();
        let tokens = connectors
            .output_proj
            .forward(read.reshape([frames, width]));
        let [_, weights, _, patch_tokens] = attention.dims();
        Ok(Glimpse {
            tokens,
            attention: attention.reshape([frames, weights, patch_tokens]),
        })
    }

    /// The passes `mode` asks for over `batch`.
    pub fn forward(
        &self,
        batch: &ClipBatch<B>,
        mode: Mode,
    ) -> Result<FoveatedOutput<B>, FoveatedError> {
        self.check(batch)?;
        let (clips, frames) = (batch.clips(), batch.frames());
        let patches = self.encode_frames(batch.pixels.clone())?;
        let text = self.embedded_text(batch);
        let connectors = &self.connectors;
        match mode {
            Mode::Autoregressive => return self.autoregressive(&patches, &text, clips, frames),
            Mode::AllPatches => {
                let [_, per_frame, width] = patches.last_hidden_state.dims();
                let every = patches
                    .last_hidden_state
                    .reshape([clips, frames * per_frame, width]);
                let pass = self.lm_pass(connectors.fine_token.val(), every, per_frame, &text)?;
                return Ok(FoveatedOutput {
                    coarse: None,
                    fine: Some(pass),
                    queries: None,
                });
            }
            _ => {}
        }
        let q_static = connectors
            .q_static
            .val()
            .unsqueeze_dim::<2>(0)
            .expand([clips * frames, self.config.query_dim]);
        let coarse_glimpse = self.read(&patches, q_static)?;
        let mut coarse = self.lm_pass(
            connectors.coarse_token.val(),
            self.per_clip(coarse_glimpse.tokens, clips),
            1,
            &text,
        )?;
        coarse.attention = Some(coarse_glimpse.attention);
        if mode == Mode::CoarseOnly {
            return Ok(FoveatedOutput {
                coarse: Some(coarse),
                fine: None,
                queries: None,
            });
        }
        let query_dim = self.config.query_dim;
        let queries = if mode == Mode::RandomQueries {
            let normal = Distribution::Normal(0.0, 1.0);
            Tensor::random([clips, frames, query_dim], normal, &batch.pixels.device())
        } else {
            // The query for frame t comes from the hidden state at frame t − 1's coarse token.
            let mut queries = vec![self.q_init(clips)];
            if frames > 1 {
                let before_last = coarse.at_frames().slice([0..clips, 0..frames - 1]);
                queries.push(connectors.llm_to_query.forward(before_last));
            }
            Tensor::cat(queries, 1)
        };
        let fine_glimpse = self.read(
            &patches,
            queries.clone().reshape([clips * frames, query_dim]),
        )?;
        let mut fine = self.lm_pass(
            connectors.fine_token.val(),
            self.per_clip(fine_glimpse.tokens, clips),
            1,
            &text,
        )?;
        fine.attention = Some(fine_glimpse.attention);
        Ok(FoveatedOutput {
            coarse: Some(coarse),
            fine: Some(fine),
            queries: Some(queries),
        })
    }

    /// The fine pass alone, each frame's query from the fine pass's hidden state at the frame
    /// before: the LM runs one token a frame over `[prompt, fine token, z_1 … z_t]`, keeping its
    /// keys and values, then once over the whole sequence with the target for the outputs.
    fn autoregressive(
        &self,
        patches: &Dinov2Patches<B>,
        text: &Text<B>,
        clips: usize,
        frames: usize,
    ) -> Result<FoveatedOutput<B>, FoveatedError> {
        let connectors = &self.connectors;
        let device = patches.last_hidden_state.device();
        let query_dim = self.config.query_dim;
        let mut query = self.q_init(clips).reshape([clips, query_dim]);
        let (mut queries, mut tokens, mut attention) = (Vec::new(), Vec::new(), Vec::new());
        let mut cache = KvCache::new();
        for t in 0..frames {
            let rows: Vec<i64> = (0..clips).map(|c| (c * frames + t) as i64).collect();
            let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [clips]), &device);
            let frame = select_frames(patches, rows);
            queries.push(query.clone().unsqueeze_dim::<3>(1));
            let glimpse = self.read(&frame, query.clone())?;
            let token = glimpse.tokens.unsqueeze_dim::<3>(1);
            tokens.push(token.clone());
            attention.push(glimpse.attention.unsqueeze_dim::<4>(1));
            if t + 1 < frames {
                let visual = self.visual_embeddings(token);
                let new = if t == 0 {
                    let mode = mode_embedding(connectors.fine_token.val(), clips);
                    let mut parts: Vec<Tensor<B, 3>> = text.prompt.iter().cloned().collect();
                    parts.extend([mode, visual]);
                    Tensor::cat(parts, 1)
                } else {
                    visual
                };
                let input = TextInput::embeddings(new).with_last_logits_only();
                let state = self.lm.forward_cached(input, &mut cache)?.last_hidden_state;
                let [_, length, width] = state.dims();
                let last = state.slice([0..clips, length - 1..length, 0..width]);
                query = connectors
                    .llm_to_query
                    .forward(last.reshape([clips, width]));
            }
        }
        let mut fine =
            self.lm_pass(connectors.fine_token.val(), Tensor::cat(tokens, 1), 1, text)?;
        let attention = Tensor::cat(attention, 1);
        let [_, _, weights, patch_tokens] = attention.dims();
        fine.attention = Some(attention.reshape([clips * frames, weights, patch_tokens]));
        Ok(FoveatedOutput {
            coarse: None,
            fine: Some(fine),
            queries: Some(Tensor::cat(queries, 1)),
        })
    }

    /// Visual tokens `[clips, n, D]` as LM input embeddings: `dino_to_llm`, scaled to sit among
    /// the LM's embeddings.
    fn visual_embeddings(&self, tokens: Tensor<B, 3>) -> Tensor<B, 3> {
        self.connectors.dino_to_llm.forward(tokens) * self.config.visual_scale
    }

    /// The LM over `[prompt, mode token, visual tokens, target]`, `per_frame` visual tokens a
    /// frame.
    fn lm_pass(
        &self,
        mode_token: Tensor<B, 1>,
        tokens: Tensor<B, 3>,
        per_frame: usize,
        text: &Text<B>,
    ) -> Result<PassOutput<B>, FoveatedError> {
        let connectors = &self.connectors;
        let [clips, visual_tokens, _] = tokens.dims();
        let visual = self.visual_embeddings(tokens.clone());
        let mode = mode_embedding(mode_token, clips);
        let mut parts: Vec<Tensor<B, 3>> = text.prompt.iter().cloned().collect();
        let first_visual = text.prompt.as_ref().map_or(0, |p| p.dims()[1]) + 1;
        parts.extend([mode, visual]);
        parts.extend(text.target.iter().cloned());
        // Target token i is predicted at the position before it: the last visual token, then
        // the target's own tokens but its last. Only those positions (and the last) get logits.
        let target = text.target.as_ref().map_or(0, |t| t.dims()[1]);
        let start = first_visual + visual_tokens - 1;
        let input = TextInput::embeddings(Tensor::cat(parts, 1)).with_logits_from(start);
        let output = self.lm.forward(input)?;
        let hidden = output.last_hidden_state;
        let vocab = output.logits.dims()[2];
        let text_logits = output.logits.slice([0..clips, 0..target, 0..vocab]);
        let mut pass = PassOutput {
            tokens,
            per_frame,
            hidden,
            text_logits,
            frame_logits: None,
            first_visual,
            attention: None,
        };
        if let Some(head) = &connectors.frame_head {
            pass.frame_logits = Some(head.forward(pass.at_frames()));
        }
        Ok(pass)
    }

    /// `q_init` for every clip, `[clips, 1, query_dim]`.
    fn q_init(&self, clips: usize) -> Tensor<B, 3> {
        let query_dim = self.config.query_dim;
        self.connectors
            .q_init
            .val()
            .reshape([1, 1, query_dim])
            .expand([clips, 1, query_dim])
    }

    /// `[clips · frames, width]` → `[clips, frames, width]`.
    fn per_clip(&self, tokens: Tensor<B, 2>, clips: usize) -> Tensor<B, 3> {
        let [rows, width] = tokens.dims();
        tokens.reshape([clips, rows / clips, width])
    }

    /// The prompt and target embedded (absent when the batch has none).
    fn embedded_text(&self, batch: &ClipBatch<B>) -> Text<B> {
        let device = batch.pixels.device();
        let embed = |ids: &[Vec<u32>]| {
            (!ids.is_empty() && !ids[0].is_empty()).then(|| {
                let (rows, tokens) = (ids.len(), ids[0].len());
                let flat: Vec<i64> = ids.iter().flatten().map(|&id| id as i64).collect();
                let ids =
                    Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows, tokens]), &device);
                self.lm.embed(ids)
            })
        };
        Text {
            prompt: embed(&batch.prompt),
            target: embed(&batch.target),
        }
    }
}

/// A mode token `[W]` as one input embedding per clip, `[clips, 1, W]`.
fn mode_embedding<B: Backend>(mode_token: Tensor<B, 1>, clips: usize) -> Tensor<B, 3> {
    let width = mode_token.dims()[0];
    mode_token.reshape([1, 1, width]).expand([clips, 1, width])
}

/// The text around the visual tokens, embedded.
struct Text<B: Backend> {
    prompt: Option<Tensor<B, 3>>,
    target: Option<Tensor<B, 3>>,
}

/// fVLM's shallow readout, multi-head: per head, `softmax(q·Pᵀ/√d)·P` of the queries `[frames,
/// queries, width]` over the patch features `[frames, tokens, width]`, which serve as keys and
/// values both (no projections). Also gives the probabilities `[frames, heads, queries, tokens]`.
fn shallow_read<B: Backend>(
    queries: Tensor<B, 3>,
    patches: Tensor<B, 3>,
    heads: usize,
) -> (Tensor<B, 3>, Tensor<B, 4>) {
    let [frames, count, width] = queries.dims();
    let split = |x: Tensor<B, 3>| {
        let [frames, tokens, width] = x.dims();
        x.reshape([frames, tokens, heads, width / heads])
            .swap_dims(1, 2)
    };
    let (queries, patches) = (split(queries), split(patches));
    let scale = ((width / heads) as f64).powf(-0.5);
    let weights = softmax(queries.matmul(patches.clone().swap_dims(2, 3)) * scale, 3);
    let read = weights
        .clone()
        .matmul(patches)
        .swap_dims(1, 2)
        .reshape([frames, count, width]);
    (read, weights)
}

/// The rows `rows` of every tensor of `patches`.
fn select_frames<B: Backend>(
    patches: &Dinov2Patches<B>,
    rows: Tensor<B, 1, Int>,
) -> Dinov2Patches<B> {
    let select = |x: &Tensor<B, 3>| x.clone().select(0, rows.clone());
    Dinov2Patches {
        last_hidden_state: select(&patches.last_hidden_state),
        keys_values: patches
            .keys_values
            .iter()
            .map(|kv| [select(&kv[0]), select(&kv[1])])
            .collect(),
    }
}
