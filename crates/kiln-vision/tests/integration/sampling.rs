//! How the towers run: Monte-Carlo dropout (deterministic at rate 0, reproducible per draw,
//! independent of batching, every site wired) and precision policies against transformers.

use burn::backend::Flex;
use burn::tensor::Tensor;
use kiln_core::{Policy, PolicySpec, Precision};
use kiln_kernels::gemm::{Products, is_mixed_bf16};
use kiln_vision::{Draw, DropoutSites, Sample, VisionModel};

use crate::support;

use support::{Reference, fixtures, relative, relative_error};

/// The vision-only fixtures and the reference key of their embeddings.
const MODELS: [(&str, &str); 3] = [
    ("clip_vision", "image_embeds"),
    ("siglip_vision", "pooler_output"),
    ("dinov2", "pooler_output"),
];

fn model(name: &str, policy: &Policy) -> VisionModel<Flex> {
    VisionModel::from_hf_dir(fixtures().join(name), &Default::default(), policy).unwrap()
}

fn pixels(name: &str) -> Tensor<Flex, 4> {
    Reference::open(name).input("pixel_values")
}

fn values(x: Tensor<Flex, 2>) -> Vec<f32> {
    x.into_data().to_vec().unwrap()
}

fn draw(items: &[u64], pass: u64) -> Draw {
    Draw::pass(2026, pass, items.iter().copied())
}

#[test]
fn rate_zero_is_bit_identical_to_the_deterministic_forward() {
    for (name, _) in MODELS {
        let plain = model(name, &Policy::full());
        let expected = values(plain.forward(pixels(name)));
        let batch = pixels(name).dims()[0];
        let items: Vec<u64> = (0..batch as u64).collect();
        let zero = plain.with_dropout(DropoutSites::all(0.0)).unwrap();
        let sampled = zero
            .forward_sampled(pixels(name), &draw(&items, 0))
            .unwrap();
        assert_eq!(values(sampled), expected, "{name}");
    }
}

/// A rate so small no mask drops anything (p·2³² rounds to 0) still routes attention through the
/// explicit softmax path: it must match transformers as the fused kernel does.
#[test]
fn active_sites_that_drop_nothing_match_transformers() {
    for (name, key) in MODELS {
        let tower = model(name, &Policy::full())
            .with_dropout(DropoutSites::all(1e-12))
            .unwrap();
        let batch = pixels(name).dims()[0];
        let items: Vec<u64> = (0..batch as u64).collect();
        let sampled = tower
            .forward_sampled(pixels(name), &draw(&items, 0))
            .unwrap();
        let error = relative_error(sampled, &Reference::open(name), key);
        assert!(error <= 1e-4, "{name}: {error}");
    }
}

#[test]
fn a_draw_reproduces_its_masks_and_another_pass_differs() {
    for (name, _) in MODELS {
        let tower = model(name, &Policy::full())
            .with_dropout(DropoutSites::all(0.1))
            .unwrap();
        let batch = pixels(name).dims()[0];
        let items: Vec<u64> = (0..batch as u64).collect();
        let run = |pass| {
            values(
                tower
                    .forward_sampled(pixels(name), &draw(&items, pass))
                    .unwrap(),
            )
        };
        let first = run(0);
        assert_eq!(run(0), first, "{name}: same draw");
        assert_ne!(run(1), first, "{name}: another pass");
        assert_ne!(
            values(tower.forward(pixels(name))),
            first,
            "{name}: deterministic"
        );
    }
}

/// A row's masks come from its own (image id, pass): alone, second in a batch, or next to another
/// pass of the same image, its embedding is the same (up to the batch's effect on floating-point
/// summation order).
#[test]
fn a_sample_gets_the_same_masks_in_any_batch() {
    for (name, _) in MODELS {
        let tower = model(name, &Policy::full())
            .with_dropout(DropoutSites::all(0.2))
            .unwrap();
        let both = pixels(name).narrow(0, 0, 2);
        let second = pixels(name).narrow(0, 1, 1);
        let pair = values(tower.forward_sampled(both, &draw(&[40, 41], 3)).unwrap());
        let alone = values(
            tower
                .forward_sampled(second.clone(), &draw(&[41], 3))
                .unwrap(),
        );
        let width = alone.len();
        assert!(relative(&pair[width..], &alone) <= 1e-5, "{name}");

        // Two passes of the image: as two copies of it, or as one image with two samples.
        let rows = [Sample { item: 41, pass: 4 }, Sample { item: 41, pass: 3 }];
        let draw = Draw {
            seed: 2026,
            rows: rows.to_vec(),
        };
        let copies = Tensor::cat(vec![second.clone(), second.clone()], 0);
        let passes = values(tower.forward_sampled(copies, &draw).unwrap());
        assert!(relative(&passes[width..], &alone) <= 1e-5, "{name}");
        assert!(
            relative(&passes[..width], &alone) > 1e-3,
            "{name}: passes 3 and 4 agree"
        );
        let samples = values(tower.forward_sampled(second, &draw).unwrap());
        assert!(relative(&samples, &passes) <= 1e-5, "{name}");
    }
}

/// Each site on its own changes the embeddings: every one is wired into every tower.
#[test]
fn every_site_acts_in_every_tower() {
    let sites = [
        DropoutSites {
            embeddings: 0.3,
            ..Default::default()
        },
        DropoutSites {
            attention_probs: 0.3,
            ..Default::default()
        },
        DropoutSites {
            attention_output: 0.3,
            ..Default::default()
        },
        DropoutSites {
            mlp_hidden: 0.3,
            ..Default::default()
        },
    ];
    for (name, _) in MODELS {
        let plain = model(name, &Policy::full());
        let deterministic = values(plain.forward(pixels(name)));
        let batch = pixels(name).dims()[0];
        let items: Vec<u64> = (0..batch as u64).collect();
        for site in sites {
            let tower = model(name, &Policy::full()).with_dropout(site).unwrap();
            let sampled = values(
                tower
                    .forward_sampled(pixels(name), &draw(&items, 0))
                    .unwrap(),
            );
            assert_ne!(sampled, deterministic, "{name} {site}");
        }
    }
}

#[test]
fn a_draw_must_name_every_batch_row() {
    let tower = model("dinov2", &Policy::full())
        .with_dropout(DropoutSites::all(0.1))
        .unwrap();
    let err = tower
        .forward_sampled(pixels("dinov2"), &draw(&[1], 0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1 sample(s)") && err.contains("the same number per image"),
        "{err}"
    );
    let err = model("dinov2", &Policy::full())
        .with_dropout(DropoutSites::all(1.5))
        .unwrap_err()
        .to_string();
    assert!(err.contains("below 1"), "{err}");
}

/// The policies, with the largest error each may show against transformers' f32 outputs
/// (max |Δ| / max |ref|; measured figures are in docs/PERFORMANCE.md).
const POLICIES: [(&str, f32); 4] = [
    ("mixed-f16", 5e-3),
    ("pure-f16", 5e-3),
    ("mixed-bf16", 4e-2),
    ("bf16", 4e-2),
];

#[test]
fn half_precision_policies_stay_within_their_tolerances() {
    let device = Default::default();
    for (policy_name, tolerance) in POLICIES {
        let policy = policy_name
            .parse::<PolicySpec>()
            .unwrap()
            .resolve::<Flex>(&device)
            .unwrap();
        for (name, key) in MODELS {
            let embeddings = model(name, &policy).forward(pixels(name));
            assert_eq!(
                Precision::from_dtype(embeddings.dtype()),
                Some(policy.output),
                "{name} {policy_name}"
            );
            let error = relative_error(embeddings, &Reference::open(name), key);
            eprintln!("{policy_name} {name}: {error:.2e}");
            assert!(error <= tolerance, "{policy_name} {name}: {error}");
            if is_mixed_bf16(&policy) && Products::under(&policy) == Products::F32 {
                // No bf16 products on this CPU (AVX2 only): mixed-bf16 multiplies in f32.
                assert!(error <= 1e-5, "{policy_name} {name}: {error}");
            } else {
                // Far above f32 rounding: the tower did compute in 16 bits.
                assert!(error > 1e-5, "{policy_name} {name}: {error}");
            }
        }
    }
}
