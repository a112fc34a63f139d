//! The foveated model on kiln-train: a training step (the configured mode's `fine + λ·coarse`)
//! and an evaluation step (losses and per-frame accuracy of each pass, overall and frame by
//! frame), both logging
//! [`FoveatedOutput::diagnostics`].

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor, TensorData};
use kiln_train::{
    BadBatch, Decay, EvalOutput, EvalStep, OptimizerConfig, Schedule, StepContext, StepOutput,
    TrainConfig, TrainStep,
};
use serde::{Deserialize, Serialize};

use crate::{ClipBatch, FoveatedModel, FoveatedOutput, Losses, PassOutput};

/// The research variant's optimisation for `steps` optimizer steps: AdamW with two groups — the
/// connectors (every parameter kiln-foveated adds) at peak `connector_lr`, DINOv2 and the LM at
/// `backbone_lr` — weight decay 0.01 except on biases and norms, linear warm-up over the first
/// 5% of steps, cosine decay to 0.1×, gradients clipped to norm 1.0.
///
/// ```
/// let config = kiln_foveated::research_recipe(1_000, 1e-3, 1e-5);
/// assert_eq!(config.max_grad_norm, Some(1.0));
/// ```
pub fn research_recipe(steps: u64, connector_lr: f64, backbone_lr: f64) -> TrainConfig {
    let mut config = TrainConfig::new(steps, backbone_lr);
    config.optimizer = OptimizerConfig::adamw(backbone_lr)
        .with_weight_decay(0.01)
        .with_group("connector", &["connectors"], connector_lr, 0.01)
        .without_decay_on_biases_and_norms();
    config.schedule = Schedule::warmup_cosine((steps / 20).max(1), 0.0, 0.1, steps);
    config.max_grad_norm = Some(1.0);
    config
}

/// One of fVLM's released training stages: the `training:` section of its
/// `configs/stage{1,2,3}_{135M,1.7B}.yaml`, as its `train.py` runs it.
///
/// ```
/// use kiln_foveated::ReleaseRecipe;
/// let stage1 = ReleaseRecipe::stage1_135m().train_config(1_000);
/// assert_eq!(stage1.optimizer.group_names(), ["connector", "dino", "llm", "default"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRecipe {
    /// Peak rate of fVLM's connector group: `q_static`, `q_init`, `query_input_proj`,
    /// `dino_to_llm` and `llm_to_query` (its `get_param_groups` name filter).
    pub lr_connector: f64,
    /// Peak rate of DINOv2 and the readout's `output_proj` (which fVLM's filter leaves with
    /// the encoder).
    pub lr_dino: f64,
    /// Peak rate of the LM.
    pub lr_llm: f64,
    /// The rate every group converges on (stage 1's `converging` schedule); `None`: cosine to
    /// 0.1× of each peak.
    pub target_lr: Option<f64>,
    /// The fraction of the steps the linear warm-up from 0 takes.
    pub warmup_ratio: f64,
    /// AdamW's decoupled weight decay, on every parameter.
    pub weight_decay: f64,
    /// Gradients are clipped to this norm.
    pub max_grad_norm: f64,
}

impl ReleaseRecipe {
    /// Stage 1 of fVLM-135M, visual alignment: connectors from 1e-3, backbones from 1e-5, both
    /// converging on 3e-5; every text token scored.
    pub fn stage1_135m() -> Self {
        ReleaseRecipe {
            lr_connector: 1e-3,
            lr_dino: 1e-5,
            lr_llm: 1e-5,
            target_lr: Some(3e-5),
            warmup_ratio: 0.03,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
        }
    }

    /// Stage 2 of fVLM-135M, instruction tuning: 3e-5 everywhere, cosine; the answer scored.
    pub fn stage2_135m() -> Self {
        ReleaseRecipe {
            lr_connector: 3e-5,
            lr_dino: 3e-5,
            lr_llm: 3e-5,
            target_lr: None,
            ..Self::stage1_135m()
        }
    }

    /// Stage 3 of fVLM-135M, DPO: 1e-6 everywhere, 10% warm-up, cosine.
    pub fn stage3_135m() -> Self {
        ReleaseRecipe {
            lr_connector: 1e-6,
            lr_dino: 1e-6,
            lr_llm: 1e-6,
            warmup_ratio: 0.1,
            ..Self::stage2_135m()
        }
    }

    /// Stage 1 of fVLM-1.7B: connectors from 3e-4, backbones from 3e-6, converging on 1e-5.
    pub fn stage1_1_7b() -> Self {
        ReleaseRecipe {
            lr_connector: 3e-4,
            lr_dino: 3e-6,
            lr_llm: 3e-6,
            target_lr: Some(1e-5),
            ..Self::stage1_135m()
        }
    }

    /// Stage 2 of fVLM-1.7B: 1e-5 everywhere, cosine.
    pub fn stage2_1_7b() -> Self {
        ReleaseRecipe {
            lr_connector: 1e-5,
            lr_dino: 1e-5,
            lr_llm: 1e-5,
            ..Self::stage2_135m()
        }
    }

    /// Stage 3 of fVLM-1.7B, DPO: 5e-7 everywhere, 10% warm-up, cosine.
    pub fn stage3_1_7b() -> Self {
        ReleaseRecipe {
            lr_connector: 5e-7,
            lr_dino: 5e-7,
            lr_llm: 5e-7,
            ..Self::stage3_135m()
        }
    }

    /// The stage over `steps` optimizer steps on kiln-train: AdamW over fVLM's three groups
    /// (parameters outside them, a per-frame head, at the LM's rate), decay on every parameter,
    /// `⌊steps · warmup_ratio⌋` warm-up steps from 0, then the converging or cosine schedule.
    pub fn train_config(&self, steps: u64) -> TrainConfig {
        self.config_under("", steps)
    }

    /// [`ReleaseRecipe::train_config`] for [`PreferenceTraining`](crate::PreferenceTraining),
    /// whose model's parameters sit under `policy.`.
    pub fn preference_train_config(&self, steps: u64) -> TrainConfig {
        self.config_under("policy.", steps)
    }

    /// The groups of the model's parameters under `prefix`.
    fn config_under(&self, prefix: &str, steps: u64) -> TrainConfig {
        let decay = self.weight_decay;
        let under = |names: &[&str]| -> Vec<String> {
            names.iter().map(|name| format!("{prefix}{name}")).collect()
        };
        let (connector, dino, llm) = (
            under(CONNECTOR_GROUP),
            under(&["dino", "connectors.output_proj"]),
            under(&["lm"]),
        );
        let mut config = TrainConfig::new(steps, self.lr_llm);
        config.optimizer = OptimizerConfig::adamw(self.lr_llm)
            .with_weight_decay(decay)
            .with_group("connector", &as_strs(&connector), self.lr_connector, decay)
            .with_group("dino", &as_strs(&dino), self.lr_dino, decay)
            .with_group("llm", &as_strs(&llm), self.lr_llm, decay);
        let warmup = (steps as f64 * self.warmup_ratio) as u64;
        config.schedule = match self.target_lr {
            Some(target_lr) => Schedule {
                warmup_steps: warmup,
                warmup_start: 0.0,
                decay: Decay::Converging { target_lr },
                total_steps: steps,
            },
            None => Schedule::warmup_cosine(warmup, 0.0, 0.1, steps),
        };
        config.max_grad_norm = Some(self.max_grad_norm);
        config
    }
}

/// `all` as the `&str`s `OptimizerConfig::with_group` takes.
fn as_strs(all: &[String]) -> Vec<&str> {
    all.iter().map(String::as_str).collect()
}

/// The parameters fVLM's `get_param_groups` puts in its connector group.
const CONNECTOR_GROUP: &[&str] = &[
    "connectors.q_static",
    "connectors.q_init",
    "connectors.query_input_proj",
    "connectors.dino_to_llm",
    "connectors.llm_to_query",
];

impl<B: AutodiffBackend> TrainStep<B> for FoveatedModel<B> {
    type Batch = ClipBatch<B>;

    /// A batch [`FoveatedModel::check`] refuses is a [`BadBatch`] (loaders check items
    /// before training starts).
    fn train_step(&self, batch: ClipBatch<B>, _: &StepContext) -> Result<StepOutput<B>, BadBatch> {
        let (output, losses) = scored(self, &batch)?;
        let mut step = StepOutput::new(losses.total, batch.pixels.dims()[0]);
        for (name, loss) in [("coarse_loss", losses.coarse), ("fine_loss", losses.fine)] {
            if let Some(loss) = loss {
                step = step.with_part(name, loss);
            }
        }
        for (name, scores) in accuracies(&output, &batch) {
            let (correct, count) = scores.total();
            step = step.with_part(name, correct.div_scalar(count as f32));
        }
        for (name, figure) in output.diagnostics() {
            step = step.with_part(name, figure.detach());
        }
        Ok(step)
    }
}

impl<B: Backend> EvalStep<B> for FoveatedModel<B> {
    type Batch = ClipBatch<B>;

    /// A batch [`FoveatedModel::check`] refuses is a [`BadBatch`].
    fn eval_step(&self, batch: ClipBatch<B>) -> Result<EvalOutput<B>, BadBatch> {
        let (output, losses) = scored(self, &batch)?;
        let clips = batch.pixels.dims()[0];
        let mut eval =
            EvalOutput::new(clips).with_sum("loss", losses.total.mul_scalar(clips as f32));
        for (name, scores) in accuracies(&output, &batch) {
            let (correct, count) = scores.total();
            eval = eval.with_mean(name, correct, count);
            // Per frame too: where a pass fails, it often fails on some frames only.
            for (frame, correct, count) in scores.by_frame() {
                eval = eval.with_mean(&format!("{name}_frame{frame}"), correct, count);
            }
        }
        for (name, figure) in output.diagnostics() {
            eval = eval.with_mean(name, figure.mul_scalar(clips as f32), clips);
        }
        Ok(eval)
    }
}

/// The model's training-mode forward over `batch` and its losses.
fn scored<B: Backend>(
    model: &FoveatedModel<B>,
    batch: &ClipBatch<B>,
) -> Result<(FoveatedOutput<B>, Losses<B>), BadBatch> {
    let bad = |e: crate::FoveatedError| BadBatch(e.to_string());
    let output = model.forward(batch, model.training_mode()).map_err(bad)?;
    let losses = model.loss(&output, batch).map_err(bad)?;
    Ok((output, losses))
}

/// Per pass with a per-frame head and frame targets, its [`FrameScores`].
fn accuracies<B: Backend>(
    output: &FoveatedOutput<B>,
    batch: &ClipBatch<B>,
) -> Vec<(&'static str, FrameScores<B>)> {
    [
        ("coarse_accuracy", &output.coarse),
        ("fine_accuracy", &output.fine),
    ]
    .into_iter()
    .filter_map(|(name, pass)| Some((name, FrameScores::of(pass.as_ref()?, batch)?)))
    .collect()
}

/// Which frames a pass's per-frame head got right.
struct FrameScores<B: Backend> {
    /// 1 where the predicted class is the target, else 0 (and 0 without a target),
    /// `[clips, frames]`.
    right: Tensor<B, 2>,
    /// Per frame, the clips with a target there.
    counts: Vec<usize>,
}

impl<B: Backend> FrameScores<B> {
    fn of(pass: &PassOutput<B>, batch: &ClipBatch<B>) -> Option<Self> {
        let logits = pass.frame_logits.clone()?;
        let [clips, frames, _] = logits.dims();
        let targets: Vec<i64> = batch.frame_targets.iter().flatten().copied().collect();
        if targets.iter().all(|&t| t < 0) {
            return None;
        }
        let counts = (0..frames)
            .map(|f| (0..clips).filter(|c| targets[c * frames + f] >= 0).count())
            .collect();
        let device = logits.device();
        let counted: Vec<bool> = targets.iter().map(|&t| t >= 0).collect();
        let counted =
            Tensor::<B, 2, Bool>::from_data(TensorData::new(counted, [clips, frames]), &device);
        let targets =
            Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [clips, frames]), &device);
        let predicted = logits.argmax(2).reshape([clips, frames]);
        let right = predicted.equal(targets).bool_and(counted).float();
        Some(FrameScores { right, counts })
    }

    /// The frames right (`[1]`) and the frames with a target.
    fn total(&self) -> (Tensor<B, 1>, usize) {
        (self.right.clone().sum(), self.counts.iter().sum())
    }

    /// Per frame with targets, its 1-based number, the clips right there (`[1]`) and the clips
    /// with a target there.
    fn by_frame(&self) -> impl Iterator<Item = (usize, Tensor<B, 1>, usize)> + '_ {
        let [clips, _] = self.right.dims();
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .map(move |(f, &count)| {
                let right = self.right.clone().slice([0..clips, f..f + 1]).sum();
                (f + 1, right, count)
            })
    }
}
