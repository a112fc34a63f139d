//! The interlingua encoder against LatentWire's own `InterlinguaEncoder`
//! (scripts/fixtures/latentwire_modules.py).

use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_latentwire::{ByteBatch, EncoderConfig, InterlinguaEncoder};
use kiln_transformer::PackedAttention;

use crate::support::{Reference, assert_close, assert_linear_grads, assert_norm_grads, fixtures};

type Ad = Autodiff<Flex>;

/// The fixture script's `ENCODER_TEXTS`: one cut at 48 bytes, with a two-byte character, and one
/// padded.
const TEXTS: [&str; 2] = [
    "Ada Lovelace was born in Zürich on 3 May; she works at the mill.",
    "Who?",
];

fn tiny<B: Backend>() -> InterlinguaEncoder<B> {
    EncoderConfig::new(4)
        .with_width(32)
        .with_layers(2)
        .with_heads(4)
        .with_max_bytes(48)
        .init::<B>(&Default::default())
        .with_weights(&fixtures().join("encoder"))
        .expect("the fixture's encoder loads")
}

#[test]
fn texts_become_latentwires_bytes() {
    let reference = Reference::open("encoder_references.safetensors");
    let batch = ByteBatch::new(&TEXTS, 48);
    let bytes: Vec<i64> = batch.bytes().iter().map(|&b| i64::from(b)).collect();
    assert_eq!(bytes, reference.ints("bytes"));
    assert_eq!(batch.dims(), [2, 48]);
}

/// The latents, and the gradients of `(out · w).sum()` with respect to every parameter, as
/// LatentWire computes them.
#[test]
fn the_encoder_is_latentwires() {
    let reference = Reference::open("encoder_references.safetensors");
    let encoder = tiny::<Ad>();
    let out = encoder.encode(&TEXTS);
    assert_close(out.clone().inner(), &reference, "out", 1e-5);

    let weights: Tensor<Ad, 3> = reference.tensor("weights");
    let grads = (out * weights).sum().backward();
    let backbone = &encoder.backbone;
    let embedding = backbone.byte_emb.weight.grad(&grads).unwrap();
    assert_close(embedding, &reference, "grad.backbone.byte_emb.weight", 1e-5);
    for (i, layer) in backbone.layers.iter().enumerate() {
        let name = |part: &str| format!("backbone.encoder.layers.{i}.{part}");
        assert_attention_grads(&layer.self_attn, &grads, &reference, &name("self_attn"));
        assert_linear_grads(&layer.linear1, &grads, &reference, &name("linear1"));
        assert_linear_grads(&layer.linear2, &grads, &reference, &name("linear2"));
        assert_norm_grads(&layer.norm1, &grads, &reference, &name("norm1"));
        assert_norm_grads(&layer.norm2, &grads, &reference, &name("norm2"));
    }
    assert_norm_grads(&backbone.ln, &grads, &reference, "backbone.ln");

    let pooler = &encoder.shared_pooler;
    let latent = pooler.latent.grad(&grads).unwrap();
    assert_close(latent, &reference, "grad.shared_pooler.latent", 1e-5);
    let prefix = "shared_pooler.cross_attn";
    assert_attention_grads(&pooler.cross_attn, &grads, &reference, prefix);
    let linears = [
        ("gate.1", &pooler.gate),
        ("ff.1", &pooler.ff_in),
        ("ff.3", &pooler.ff_out),
    ];
    for (name, linear) in linears {
        assert_linear_grads(linear, &grads, &reference, &format!("shared_pooler.{name}"));
    }
    for (name, norm) in [("gate.0", &pooler.gate_norm), ("ff.0", &pooler.ff_norm)] {
        assert_norm_grads(norm, &grads, &reference, &format!("shared_pooler.{name}"));
    }
}

/// The gradients of the packed q, k and v projection (`{prefix}.in_proj_weight`, `_bias`) and
/// of the output projection are LatentWire's.
fn assert_attention_grads(
    attention: &PackedAttention<Ad>,
    grads: &<Ad as AutodiffBackend>::Gradients,
    reference: &Reference,
    prefix: &str,
) {
    let in_proj = &attention.in_proj;
    let weight = in_proj.weight.grad(grads).unwrap().transpose();
    assert_close(
        weight,
        reference,
        &format!("grad.{prefix}.in_proj_weight"),
        1e-5,
    );
    let bias = in_proj.bias.as_ref().unwrap().grad(grads).unwrap();
    assert_close(
        bias,
        reference,
        &format!("grad.{prefix}.in_proj_bias"),
        1e-5,
    );
    let out_proj = &attention.out_proj;
    assert_linear_grads(out_proj, grads, reference, &format!("{prefix}.out_proj"));
}

/// Without autodiff the encoder runs on kiln's host kernels (q, k and v read in place, residual
/// adds into the product): the same latents.
#[test]
fn inference_on_the_host_kernels_gives_the_same_latents() {
    let reference = Reference::open("encoder_references.safetensors");
    let out = tiny::<Flex>().encode(&TEXTS);
    assert_close(out, &reference, "out", 1e-5);
}

/// Every parameter of a default-sized encoder is LatentWire's size (d_z 256, 6 layers, FF 1024).
#[test]
fn the_default_encoder_has_latentwires_sizes() {
    let encoder = EncoderConfig::new(8).init::<Flex>(&Default::default());
    assert_eq!(encoder.backbone.layers.len(), 6);
    assert_eq!(
        encoder.backbone.layers[0].linear1.weight.dims(),
        [256, 1024]
    );
    assert_eq!(encoder.shared_pooler.latent.dims(), [8, 256]);
    assert_eq!(encoder.encode(&["a text"]).dims(), [1, 8, 256]);
}
