//! The adapter against LatentWire's own `Adapter` (scripts/fixtures/latentwire_modules.py).

use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use kiln_latentwire::{Adapter, AdapterConfig};

use crate::support::{Reference, assert_close, assert_linear_grads, assert_norm_grads, fixtures};

type Ad = Autodiff<Flex>;

fn tiny() -> Adapter<Ad> {
    AdapterConfig::new(16, 24, 4)
        .init::<Ad>(&Default::default())
        .with_weights(&fixtures().join("adapter"))
        .expect("the fixture's adapter loads")
}

/// The soft prompt with and without answer lengths, and the gradients of `(out · w).sum()` with
/// respect to the latents and every parameter, as LatentWire computes them.
#[test]
fn the_adapter_is_latentwires() {
    let reference = Reference::open("adapter_references.safetensors");
    let adapter = tiny();
    let z: Tensor<Ad, 3> = reference.tensor::<Ad, 3>("z").require_grad();
    let lengths: Tensor<Ad, 1> = reference.tensor("answer_lengths");
    let out = adapter.forward(z.clone(), Some(lengths));
    assert_close(out.clone().inner(), &reference, "out", 1e-5);
    let without = adapter.forward(z.clone().detach(), None);
    assert_close(without.inner(), &reference, "out_without_lengths", 1e-5);

    let weights: Tensor<Ad, 3> = reference.tensor("weights");
    let grads = (out * weights).sum().backward();
    assert_close(z.grad(&grads).unwrap(), &reference, "grad.z", 1e-5);
    let linears = [
        ("proj_in", &adapter.proj_in),
        ("mid", &adapter.mid),
        ("proj_out", &adapter.proj_out),
        ("skip", &adapter.skip),
        ("film_scale", &adapter.film_scale),
        ("film_shift", &adapter.film_shift),
        ("length_proj.0", adapter.length_proj.as_ref().unwrap()),
    ];
    for (name, linear) in linears {
        assert_linear_grads(linear, &grads, &reference, name);
    }
    assert_norm_grads(&adapter.input_norm, &grads, &reference, "input_norm");
    assert_norm_grads(&adapter.out_norm, &grads, &reference, "out_norm");
    let position = adapter.position_emb.as_ref().unwrap().grad(&grads).unwrap();
    assert_close(position, &reference, "grad.position_emb", 1e-5);
    assert_close(
        adapter.scale.grad(&grads).unwrap(),
        &reference,
        "grad.scale",
        1e-5,
    );
}

/// A directory without the checkpoint is an error naming it, not a panic.
#[test]
fn a_missing_checkpoint_is_an_error() {
    let missing = fixtures().join("no-such-adapter");
    let error = AdapterConfig::new(16, 24, 4)
        .init::<Flex>(&Default::default())
        .with_weights(&missing)
        .unwrap_err();
    assert!(error.to_string().contains("no-such-adapter"), "{error}");
}
