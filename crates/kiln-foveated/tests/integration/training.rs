//! The foveated model trains on kiln-train: a tiny model from scratch fits a fixed batch of
//! cue-then-read clips (both passes' losses fall), and the evaluation step counts per-frame
//! accuracy against a count made here by hand.

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use kiln_foveated::synthetic::CueThenRead;
use kiln_foveated::{FoveatedConfig, FoveatedModel, FrameHead, Mode, Readout};
use kiln_text::TextConfig;
use kiln_train::{EvalStep, Optimization, OptimizerConfig, TrainConfig};
use kiln_vision::Dinov2Config;

use super::support::one_at_a_time;

type Ad = Autodiff<Flex>;

/// Optimizer steps of the fitting test.
const STEPS: u64 = 150;

fn tiny_model<B: Backend>(
    task: &CueThenRead,
    readout: Readout,
    device: &B::Device,
) -> FoveatedModel<B> {
    B::seed(device, 3);
    let dino = Dinov2Config {
        hidden_size: 16,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        mlp_ratio: 2,
        image_size: task.image_size(),
        patch_size: task.cell,
        ..Dinov2Config::default()
    }
    .init(device);
    let lm = TextConfig {
        vocab_size: 8,
        hidden_size: 16,
        intermediate_size: 32,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        max_position_embeddings: 32,
        ..TextConfig::smollm2_135m()
    }
    .init(device);
    let config = FoveatedConfig {
        query_dim: 8,
        readout,
        frame_head: FrameHead::Classes(task.classes),
        ..FoveatedConfig::research()
    };
    FoveatedModel::new(dino, lm, config, device).unwrap()
}

#[test]
fn a_tiny_model_fits_a_batch_of_synthetic_clips() {
    let _alone = one_at_a_time();
    let device = Default::default();
    let task = CueThenRead::new(2, 4, 3, 2, 5).unwrap();
    let mut model = tiny_model::<Ad>(&task, Readout::Deep, &device);
    let batch = task.batch::<Ad>(0..8, &device);
    let mut config = TrainConfig::new(STEPS, 3e-3);
    config.optimizer = OptimizerConfig::adamw(3e-3);
    config.max_grad_norm = Some(1.0);
    let mut optimization = Optimization::fresh(&config, &model, &device);
    let mut reports = Vec::new();
    for step in 0..STEPS {
        let (next, report) = optimization.step(model, step, || batch.clone()).unwrap();
        model = next;
        reports.push(report);
    }
    let part = |report: &kiln_train::StepReport, name: &str| {
        report.parts.iter().find(|(n, _)| n == name).unwrap().1
    };
    let (first, last) = (&reports[0], reports.last().unwrap());
    for name in ["coarse_loss", "fine_loss"] {
        let (before, after) = (part(first, name), part(last, name));
        assert!(after < 0.5 * before, "{name}: {before:.3} → {after:.3}");
    }
    assert!(
        last.loss < 0.5 * first.loss,
        "{} → {}",
        first.loss,
        last.loss
    );
    assert!(reports.iter().all(|r| r.applied));
}

#[test]
fn evaluation_counts_right_frames() {
    let _alone = one_at_a_time();
    let device = Default::default();
    let task = CueThenRead::new(2, 4, 3, 2, 5).unwrap();
    for readout in [Readout::Deep, Readout::Shallow] {
        let model = tiny_model::<Flex>(&task, readout, &device);
        let batch = task.batch::<Flex>(0..6, &device);
        let output = model.forward(&batch, Mode::CoarseFine).unwrap();
        let eval = model.eval_step(batch.clone()).unwrap();
        for (name, pass) in [
            ("coarse_accuracy", output.coarse),
            ("fine_accuracy", output.fine),
        ] {
            let logits = pass.unwrap().frame_logits.unwrap();
            let predicted = logits
                .argmax(2)
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .unwrap();
            let targets: Vec<i64> = batch.frame_targets.iter().flatten().copied().collect();
            let right = predicted
                .iter()
                .zip(&targets)
                .filter(|(p, t)| **t >= 0 && p == t)
                .count();
            let metric = |name: &str| eval.sums.iter().find(|s| s.name == name).unwrap();
            assert_eq!(
                metric(name).count,
                Some(6 * 2),
                "{name}: frames with a target"
            );
            assert_eq!(
                metric(name).sum.clone().into_scalar(),
                right as f32,
                "{name}"
            );
            // Frame by frame (1-based; the cue frame has no target, so no figure).
            assert!(!eval.sums.iter().any(|s| s.name == format!("{name}_frame1")));
            for frame in [2, 3] {
                let right = (0..6)
                    .filter(|c| predicted[c * 3 + frame - 1] == targets[c * 3 + frame - 1])
                    .count();
                let metric = metric(&format!("{name}_frame{frame}"));
                assert_eq!(metric.count, Some(6), "{name}, frame {frame}");
                assert_eq!(metric.sum.clone().into_scalar(), right as f32);
            }
        }
    }
    // The inner model of a trained one evaluates the same way.
    let trained = tiny_model::<Ad>(&task, Readout::Deep, &device).valid();
    assert_eq!(trained.training_mode(), Mode::CoarseFine);
}
