//! The model and optimizer of the `foveated_synthetic` example, shared with `benches/foveated.rs`.

use kiln::burn::tensor::backend::Backend;
use kiln::foveated::synthetic::CueThenRead;
use kiln::foveated::{FoveatedConfig, FoveatedModel, FrameHead, Readout};
use kiln::text::TextConfig;
use kiln::train::{OptimizerConfig, Schedule, TrainConfig};
use kiln::vision::Dinov2Config;

/// A small DINOv2 and LM from scratch for `task` (DINOv2's position table has a row for each
/// cell of its boards; other boards read it resized): the visual token is narrow (`token_width`, 8
/// by default, 2 heads), so one static token cannot carry every cell's glyph (16 wide, it
/// learned to carry part of the board: docs/FOVEATED.md). The position table starts at std 1,
/// not transformers' 0.02: a trained tower's positions are plain to see, and a from-scratch
/// one's at 0.02 are not, so no query could point at a cell (docs/FOVEATED.md). Weights come
/// from the backend's generator.
pub fn synthetic_model<B: Backend>(
    task: &CueThenRead,
    token_width: usize,
    vocab: usize,
    readout: Readout,
    device: &B::Device,
) -> Result<FoveatedModel<B>, String> {
    let dino = Dinov2Config {
        hidden_size: token_width,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        mlp_ratio: 4,
        image_size: task.image_size(),
        patch_size: task.cell,
        initializer_range: 1.0,
        ..Dinov2Config::default()
    }
    .init(device);
    let lm = TextConfig {
        // The captions name the cued cell: at least the board's cells.
        vocab_size: vocab.max(task.grid * task.grid),
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 1024,
        ..TextConfig::smollm2_135m()
    }
    .init(device);
    let config = FoveatedConfig {
        query_dim: 16,
        readout,
        frame_head: FrameHead::Classes(task.classes),
        ..FoveatedConfig::fvlm()
    };
    FoveatedModel::new(dino, lm, config, device).map_err(|e| e.to_string())
}

/// AdamW at peak `lr` (weight decay 0.01), warm-up over the first 5% of `steps`, cosine to
/// `end` × `lr`, clipping at 1.0.
pub fn recipe(steps: u64, lr: f64, end: f64) -> TrainConfig {
    let mut config = TrainConfig::new(steps, lr);
    config.optimizer = OptimizerConfig::adamw(lr).with_weight_decay(0.01);
    config.schedule = Schedule::warmup_cosine(steps / 20, 0.0, end, steps);
    config.max_grad_norm = Some(1.0);
    config
}
