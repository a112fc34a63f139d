//! The model: backbones, connectors, the readouts and the two passes. Its batches and their
//! checks are in `batch.rs`, what a forward gives in `output.rs`, the loss in `loss.rs`.

mod batch;
mod generation;
mod loss;
mod output;
mod preference;
mod readout;
mod scoring;

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use kiln_core::{Policy, Precision, load_checkpoint};
use kiln_text::{CausalLm, KvCache, TextInput};
use kiln_vision::{Dinov2Model, Dinov2Patches, VisionModel};

use crate::{Connectors, FoveatedConfig, FoveatedError, Readout, Variant};

pub use batch::ClipBatch;
pub use output::{FoveatedOutput, Glimpse, Losses, PassOutput};
pub use preference::{DPO_BETA, PreferenceLogps, dpo_loss};

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

    /// The connectors saved in `dir` (a `model.safetensors` of them alone, PyTorch's layouts,
    /// their field names), in place of the current ones. fVLM's whole checkpoints load with
    /// [`FoveatedModel::with_fvlm_weights`].
    pub fn with_connectors_from(mut self, dir: impl AsRef<Path>) -> Result<Self, FoveatedError> {
        let dir = dir.as_ref();
        self.connectors = load_checkpoint(self.connectors, dir, &[], &[])?;
        Ok(self)
    }

    /// The same model with the LM under `policy`, DINOv2 and the connectors under theirs.
    /// fVLM keeps its LM's parameters in bf16 and computes it in bf16, DINOv2 and the
    /// connectors in f32 under bf16 autocast: [`FoveatedModel::from_dirs`] with the
    /// `mixed-bf16` policy, then this with [`FoveatedModel::fvlm_lm_policy`]. kiln's own mixed
    /// policy (f32 master weights everywhere) is `from_dirs` alone.
    pub fn with_lm_policy(mut self, policy: &Policy) -> Self {
        self.lm = self.lm.with_policy(policy);
        self
    }

    /// fVLM's LM precision: parameters and compute in bf16, outputs (the logits the loss
    /// reads) in f32, as autocast's cross-entropy computes.
    pub fn fvlm_lm_policy() -> Policy {
        Policy {
            param: Precision::BF16,
            compute: Precision::BF16,
            output: Precision::F32,
            accumulate: Precision::F32,
        }
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
    /// `prompt`-token prompt over `frames` frames: the LM's positions less the prompt, the
    /// research variant's mode token and the visual tokens (one a frame; every DINOv2 token of a
    /// frame for [`Mode::AllPatches`]). Loaders refuse longer captions up front.
    pub fn target_room(&self, prompt: usize, frames: usize) -> usize {
        let per_frame = match self.training {
            Mode::AllPatches => {
                let dino = self.dino.config();
                (dino.image_size / dino.patch_size).pow(2) + 1
            }
            _ => 1,
        };
        let positions = self.lm.config().max_position_embeddings;
        let mode_token = usize::from(self.config.variant == Variant::Research);
        positions.saturating_sub(prompt + mode_token + frames * per_frame)
    }

    /// The same model, trained and evaluated in `mode` (a static-only control trains
    /// [`Mode::CoarseOnly`]).
    pub fn with_training_mode(mut self, mode: Mode) -> Self {
        self.training = mode;
        self
    }

    /// The passes `mode` asks for over `batch`.
    pub fn forward(
        &self,
        batch: &ClipBatch<B>,
        mode: Mode,
    ) -> Result<FoveatedOutput<B>, FoveatedError> {
        self.check(batch)?;
        let (clips, frames) = (batch.clips(), batch.frames());
        let rows = frame_rows(batch);
        let patches = self.encode_rows(batch.pixels.clone(), &rows)?;
        let text = self.embedded_text(batch);
        let connectors = &self.connectors;
        let first_target = self.first_target(mode);
        match mode {
            Mode::Autoregressive => {
                return self.autoregressive(&patches, &rows, &text, clips, frames);
            }
            Mode::AllPatches => {
                if rows.iter().any(Option::is_none) {
                    return Err(FoveatedError::Input(
                        "every token of every frame (Mode::AllPatches) needs clips without \
                         padding frames"
                            .into(),
                    ));
                }
                let [_, per_frame, width] = patches.last_hidden_state.dims();
                let every = patches
                    .last_hidden_state
                    .reshape([clips, frames * per_frame, width]);
                let fine_token = self.mode_token(&connectors.fine_token);
                let pass = self.lm_pass(fine_token, every, per_frame, &text, first_target)?;
                return Ok(FoveatedOutput {
                    coarse: None,
                    fine: Some(pass),
                    queries: None,
                });
            }
            _ => {}
        }
        // fVLM's released coarse pass runs the LM over the visual tokens alone (the queries never
        // see text), and over the text too only when its loss counts.
        let coarse_text = match self.config.variant {
            Variant::Release if mode != Mode::CoarseOnly && self.config.lambda_coarse == 0.0 => {
                Text::none()
            }
            _ => text.clone(),
        };
        let looked = self.look(
            &patches,
            &rows,
            [clips, frames],
            mode,
            &coarse_text,
            first_target,
        )?;
        let Some((queries, fine_glimpse)) = looked.fine else {
            return Ok(FoveatedOutput {
                coarse: Some(looked.coarse),
                fine: None,
                queries: None,
            });
        };
        let mut fine = self.lm_pass(
            self.mode_token(&connectors.fine_token),
            self.per_clip(fine_glimpse.tokens, clips),
            1,
            &text,
            first_target,
        )?;
        fine.attention = Some(fine_glimpse.attention);
        Ok(FoveatedOutput {
            coarse: Some(looked.coarse),
            fine: Some(fine),
            queries: Some(queries),
        })
    }

    /// Everything before the fine pass's LM: the coarse pass (its LM over `coarse_text`) and,
    /// unless `mode` is [`Mode::CoarseOnly`], the fine queries `[clips, frames, query_dim]` and
    /// what they read.
    fn look(
        &self,
        patches: &Dinov2Patches<B>,
        rows: &[Option<usize>],
        [clips, frames]: [usize; 2],
        mode: Mode,
        coarse_text: &Text<B>,
        first_target: usize,
    ) -> Result<Looked<B>, FoveatedError> {
        let connectors = &self.connectors;
        let query_dim = self.config.query_dim;
        let q_static = connectors
            .q_static
            .val()
            .expand([clips * frames, query_dim]);
        let coarse_glimpse = self.read_rows(patches, q_static, rows)?;
        let mut coarse = self.lm_pass(
            self.mode_token(&connectors.coarse_token),
            self.per_clip(coarse_glimpse.tokens, clips),
            1,
            coarse_text,
            first_target,
        )?;
        coarse.attention = Some(coarse_glimpse.attention);
        if mode == Mode::CoarseOnly {
            return Ok(Looked { coarse, fine: None });
        }
        let queries = if mode == Mode::RandomQueries {
            let normal = Distribution::Normal(0.0, 1.0);
            Tensor::random([clips, frames, query_dim], normal, &coarse.hidden.device())
        } else {
            // The query for frame t comes from the coarse pass's hidden state at frame t − 1.
            let mut queries = vec![self.q_init(clips)];
            if frames > 1 {
                let before_last = coarse.at_frames().slice([0..clips, 0..frames - 1]);
                queries.push(connectors.llm_to_query.forward(before_last));
            }
            Tensor::cat(queries, 1)
        };
        let glimpse = self.read_rows(
            patches,
            queries.clone().reshape([clips * frames, query_dim]),
            rows,
        )?;
        Ok(Looked {
            coarse,
            fine: Some((queries, glimpse)),
        })
    }

    /// The fine pass alone, each frame's query from the fine pass's hidden state at the frame
    /// before ([`FoveatedModel::read_in_turn`]), then the LM once over the whole sequence with
    /// the target for the outputs (fVLM's `forward_autoregressive`, which scores the text's
    /// first token too).
    fn autoregressive(
        &self,
        patches: &Dinov2Patches<B>,
        rows: &[Option<usize>],
        text: &Text<B>,
        clips: usize,
        frames: usize,
    ) -> Result<FoveatedOutput<B>, FoveatedError> {
        let fine_token = self.mode_token(&self.connectors.fine_token);
        let read = self.read_in_turn(patches, rows, text, clips, frames)?;
        let mut fine = self.lm_pass(fine_token, Tensor::cat(read.tokens, 1), 1, text, 0)?;
        let attention = Tensor::cat(read.attention, 1);
        let [_, _, weights, patch_tokens] = attention.dims();
        fine.attention = Some(attention.reshape([clips * frames, weights, patch_tokens]));
        Ok(FoveatedOutput {
            coarse: None,
            fine: Some(fine),
            queries: Some(Tensor::cat(read.queries, 1)),
        })
    }

    /// fVLM's inference read: frame by frame, each query from the LM's hidden state after the
    /// frame before (`q_init` for the first). The LM runs one token a frame over `[prompt, mode
    /// token, z_1 … z_{T−1}]` (the release variant: `[z_1 … z_{T−1}]`), keeping its keys and
    /// values in the returned cache; the last frame's token is read but not given to the LM.
    fn read_in_turn(
        &self,
        patches: &Dinov2Patches<B>,
        rows: &[Option<usize>],
        text: &Text<B>,
        clips: usize,
        frames: usize,
    ) -> Result<ReadInTurn<B>, FoveatedError> {
        let connectors = &self.connectors;
        let query_dim = self.config.query_dim;
        let fine_token = self.mode_token(&connectors.fine_token);
        let mut query = self.q_init(clips).reshape([clips, query_dim]);
        let mut read = ReadInTurn {
            queries: Vec::new(),
            tokens: Vec::new(),
            attention: Vec::new(),
            cache: KvCache::new(),
        };
        for t in 0..frames {
            let frame_rows: Vec<Option<usize>> = (0..clips).map(|c| rows[c * frames + t]).collect();
            read.queries.push(query.clone().unsqueeze_dim::<3>(1));
            let glimpse = self.read_rows(patches, query.clone(), &frame_rows)?;
            let token = glimpse.tokens.unsqueeze_dim::<3>(1);
            read.tokens.push(token.clone());
            read.attention.push(glimpse.attention.unsqueeze_dim::<4>(1));
            if t + 1 < frames {
                let mut parts: Vec<Tensor<B, 3>> = Vec::new();
                if t == 0 {
                    parts.extend(text.prompt.iter().cloned());
                    parts.extend(fine_token.clone().map(|m| mode_embedding(m, clips)));
                }
                parts.push(self.visual_embeddings(token));
                let input = TextInput::embeddings(Tensor::cat(parts, 1)).with_last_logits_only();
                let state = self
                    .lm
                    .forward_cached(input, &mut read.cache)?
                    .last_hidden_state;
                let [_, length, width] = state.dims();
                let last = state.slice([0..clips, length - 1..length, 0..width]);
                query = connectors
                    .llm_to_query
                    .forward(last.reshape([clips, width]));
            }
        }
        Ok(read)
    }

    /// The first target token a pass in `mode` predicts: fVLM's released two-pass forward
    /// (`forward_coarse_fine`) scores text positions only, so the text's first token is not
    /// predicted from the visual tokens; its coarse-only and autoregressive passes
    /// (`forward_coarse_only`, `forward_autoregressive`) predict it from the last one. The
    /// research variant predicts every target token.
    fn first_target(&self, mode: Mode) -> usize {
        match (self.config.variant, mode) {
            (Variant::Release, Mode::Autoregressive | Mode::CoarseOnly) => 0,
            (Variant::Release, _) => 1,
            (Variant::Research, _) => 0,
        }
    }

    /// A mode token's value, for the research variant (the release variant has none).
    fn mode_token(&self, token: &Option<Param<Tensor<B, 1>>>) -> Option<Tensor<B, 1>> {
        token.as_ref().map(Param::val)
    }

    /// Visual tokens `[clips, n, D]` as LM input embeddings: `dino_to_llm`, scaled to sit among
    /// the LM's embeddings.
    fn visual_embeddings(&self, tokens: Tensor<B, 3>) -> Tensor<B, 3> {
        self.connectors.dino_to_llm.forward(tokens) * self.config.visual_scale
    }

    /// The LM over `[prompt, mode token, visual tokens, target]` (whichever are present),
    /// `per_frame` visual tokens a frame; logits for target tokens `first_target..`.
    fn lm_pass(
        &self,
        mode_token: Option<Tensor<B, 1>>,
        tokens: Tensor<B, 3>,
        per_frame: usize,
        text: &Text<B>,
        first_target: usize,
    ) -> Result<PassOutput<B>, FoveatedError> {
        let connectors = &self.connectors;
        let [clips, visual_tokens, _] = tokens.dims();
        let visual = self.visual_embeddings(tokens.clone());
        let mut parts: Vec<Tensor<B, 3>> = text.prompt.iter().cloned().collect();
        let prompt = text.prompt.as_ref().map_or(0, |p| p.dims()[1]);
        let first_visual = prompt + usize::from(mode_token.is_some());
        parts.extend(mode_token.map(|m| mode_embedding(m, clips)));
        parts.push(visual);
        parts.extend(text.target.iter().cloned());
        // Target token i is predicted at the position before it: the last visual token, then
        // the target's own tokens but its last. Only those positions (and the last) get logits.
        let target = text.target.as_ref().map_or(0, |t| t.dims()[1]);
        let first_target = first_target.min(target);
        let start = first_visual + visual_tokens - 1 + first_target;
        let input = TextInput::embeddings(Tensor::cat(parts, 1)).with_logits_from(start);
        let output = self.lm.forward(input)?;
        let hidden = output.last_hidden_state;
        let vocab = output.logits.dims()[2];
        let text_logits = output
            .logits
            .slice([0..clips, 0..target - first_target, 0..vocab]);
        let mut pass = PassOutput {
            tokens,
            per_frame,
            hidden,
            text_logits,
            first_target,
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

    /// The prompt and target embedded (absent when the batch has none), in the connectors'
    /// dtype, beside which they enter the LM (an LM under its own policy embeds in its
    /// parameters' dtype).
    fn embedded_text(&self, batch: &ClipBatch<B>) -> Text<B> {
        let device = batch.pixels.device();
        let dtype = self.connectors.dino_to_llm.weight.val().dtype();
        let embed = |ids: &[Vec<u32>]| {
            (!ids.is_empty() && !ids[0].is_empty()).then(|| {
                let (rows, tokens) = (ids.len(), ids[0].len());
                let flat: Vec<i64> = ids.iter().flatten().map(|&id| id as i64).collect();
                let ids =
                    Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows, tokens]), &device);
                self.lm.embed(ids).cast(dtype)
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

/// What [`FoveatedModel::read_in_turn`] read: per frame, its query `[clips, 1, query_dim]`,
/// visual token `[clips, 1, D]` and attention; and the LM's cache over all but the last token.
struct ReadInTurn<B: Backend> {
    queries: Vec<Tensor<B, 3>>,
    tokens: Vec<Tensor<B, 3>>,
    attention: Vec<Tensor<B, 4>>,
    cache: KvCache<B>,
}

/// The coarse pass, and the fine pass's queries and glimpse when the mode runs it.
struct Looked<B: Backend> {
    coarse: PassOutput<B>,
    fine: Option<(Tensor<B, 3>, Glimpse<B>)>,
}

/// The text around the visual tokens, embedded.
#[derive(Clone)]
struct Text<B: Backend> {
    prompt: Option<Tensor<B, 3>>,
    target: Option<Tensor<B, 3>>,
}

impl<B: Backend> Text<B> {
    /// No text: the visual tokens alone.
    fn none() -> Self {
        Text {
            prompt: None,
            target: None,
        }
    }
}

/// Per row of `[clips · frames]`, its row among the encoded frames, or `None` for a padding
/// frame (never encoded).
fn frame_rows<B: Backend>(batch: &ClipBatch<B>) -> Vec<Option<usize>> {
    let (clips, frames) = (batch.clips(), batch.frames());
    let real = |clip: usize| batch.frame_lengths.get(clip).copied().unwrap_or(frames);
    let mut next = 0;
    (0..clips)
        .flat_map(|clip| (0..frames).map(move |t| (clip, t)))
        .map(|(clip, t)| {
            (t < real(clip)).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}
