//! The example's model: a tiny DINOv2 (kiln-vision's architecture, 32 × 32 images in 8 × 8
//! patches, width 64, 2 layers, 4 heads) and a linear head on its CLS output, trained with
//! cross-entropy. Shared with `benches/train.rs`, which measures its training step.

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use kiln::burn;
use kiln::core::{Policy, Precision};
use kiln::train::{
    BadBatch, EvalOutput, EvalStep, ImageBatch, LossScaling, OptimizerConfig, Schedule,
    StepContext, StepOutput, TrainConfig, TrainStep,
};
use kiln::vision::{Dinov2Config, Dinov2Model, Tower};

/// Image side in pixels.
pub const IMAGE_SIZE: usize = 32;

/// The tiny ViT's shape.
pub fn backbone_config() -> Dinov2Config {
    Dinov2Config {
        hidden_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        mlp_ratio: 4,
        image_size: IMAGE_SIZE,
        patch_size: 8,
        ..Dinov2Config::default()
    }
}

/// The optimization recipe: AdamW at `lr` (weight decay 0.05, none on biases and norms),
/// linear warm-up over the first tenth of `steps` from 1% of `lr`, cosine to 5%, clipping at
/// global norm 1, `accumulate` micro-batches per step, dynamic loss scaling when `policy`
/// computes in f16.
pub fn recipe(steps: u64, lr: f64, accumulate: usize, policy: &Policy) -> TrainConfig {
    let mut config = TrainConfig::new(steps, lr);
    config.accumulate = accumulate;
    config.optimizer = OptimizerConfig::adamw(lr)
        .with_weight_decay(0.05)
        .without_decay_on_biases_and_norms();
    config.schedule = Schedule::warmup_cosine((steps / 10).max(1), 0.01, 0.05, steps);
    config.max_grad_norm = Some(1.0);
    config.loss_scaling = match policy.compute {
        Precision::F16 => LossScaling::Dynamic,
        _ => LossScaling::Off,
    };
    config
}

/// A DINOv2 backbone and a linear head on its CLS output.
#[derive(Module, Debug)]
pub struct Classifier<B: Backend> {
    /// The vision transformer.
    pub backbone: Dinov2Model<B>,
    /// The classification head on its CLS output.
    pub head: Linear<B>,
}

impl<B: Backend> Classifier<B> {
    /// Random weights (from the backend's generator) for `classes` classes, under `policy`.
    pub fn new(classes: usize, policy: &Policy, device: &B::Device) -> Self {
        let config = backbone_config();
        Classifier {
            backbone: config.init::<B>(device).with_policy(policy),
            head: LinearConfig::new(config.hidden_size, classes).init(device),
        }
    }

    /// Logits `[n, classes]` in f32.
    pub fn logits(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        let features = self.backbone.forward(pixels).cast(DType::F32);
        self.head.forward(features)
    }
}

impl<B: Backend> Classifier<B> {
    /// Mean cross-entropy and the fraction classified right, `[1]` each, and the batch size.
    fn scores(&self, batch: ImageBatch<B>) -> (Tensor<B, 1>, Tensor<B, 1>, usize) {
        let items = batch.labels.dims()[0];
        let logits = self.logits(batch.pixels);
        let accuracy = logits
            .clone()
            .argmax(1)
            .flatten::<1>(0, 1)
            .equal(batch.labels.clone())
            .float()
            .mean();
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, batch.labels);
        (loss, accuracy, items)
    }
}

impl<B: AutodiffBackend> TrainStep<B> for Classifier<B> {
    type Batch = ImageBatch<B>;

    fn train_step(&self, batch: ImageBatch<B>, _: &StepContext) -> Result<StepOutput<B>, BadBatch> {
        let (loss, accuracy, items) = self.scores(batch);
        Ok(StepOutput::new(loss, items).with_part("accuracy", accuracy))
    }
}

impl<B: Backend> EvalStep<B> for Classifier<B> {
    type Batch = ImageBatch<B>;

    fn eval_step(&self, batch: ImageBatch<B>) -> Result<EvalOutput<B>, BadBatch> {
        let (loss, accuracy, items) = self.scores(batch);
        let sum = |mean: Tensor<B, 1>| mean.mul_scalar(items as f32);
        Ok(EvalOutput::new(items)
            .with_sum("loss", sum(loss))
            .with_sum("accuracy", sum(accuracy)))
    }
}
