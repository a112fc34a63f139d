//! Loss scaling through a real backward pass on Autodiff<Flex>.

use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use kiln_core::{LossScale, StepDecision};

type B = Autodiff<Flex>;

fn grads(model: &Linear<B>, x: Tensor<B, 2>, scaler: &LossScale) -> GradientsParams {
    let loss = model.forward(x).powi_scalar(2).sum();
    let loss = scaler.scale_loss(loss);
    GradientsParams::from_grads(loss.backward(), model)
}

fn weight_grad(model: &Linear<B>, grads: &GradientsParams) -> Vec<f32> {
    grads
        .get::<Flex, 2>(model.weight.id)
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap()
}

#[test]
fn unscaled_gradients_equal_unscaled_training() {
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(vec![0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75], [2, 3]),
        &device,
    );

    let plain = grads(&model, x.clone(), &LossScale::NoOp);
    let want = weight_grad(&model, &plain);

    for scaler in [LossScale::Static(1024.0), LossScale::dynamic()] {
        let mut scaled = grads(&model, x.clone(), &scaler);
        let raw = weight_grad(&model, &scaled);
        assert!(
            (raw[0] / want[0] - scaler.scale()).abs() < 1e-2,
            "loss was not scaled"
        );
        assert!(scaler.unscale(&model, &mut scaled));
        for (g, w) in weight_grad(&model, &scaled).iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{g} vs {w}");
        }
        assert_eq!(scaled.len(), 2, "weight and bias");
    }
}

#[test]
fn overflowing_gradients_skip_the_step_and_lower_the_scale() {
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(2, 1).init(&device);
    let x = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32, 3.0e38], [1, 2]), &device);
    let mut scaler = LossScale::dynamic();
    let mut g = grads(&model, x, &scaler);
    let finite = scaler.unscale(&model, &mut g);
    assert!(!finite);
    assert_eq!(scaler.adjust(finite), StepDecision::Skip);
    assert_eq!(scaler.scale(), 16384.0);
}
