//! The release variant against fVLM's own `FoveatedVLM` (scripts/fixtures/fvlm_release.py runs
//! it from a checkout of fVLM's code on the tiny `dino/` and `lm/` fixtures): its checkpoint
//! loaded through fVLM's names, both readouts, stage 1 (every text token scored), stage 2 (the
//! answer only) and λ_coarse = 0.5; padding frames and padded text. The visual tokens, the
//! queries, the text logits, the losses and every parameter's gradient. Tolerance: max |Δ| /
//! max |reference| ≤ 1e-4 in f32 on Flex (gradients 1e-3: they sum over long chains).

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_foveated::{ClipBatch, FoveatedConfig, FoveatedModel, Mode, Readout};

use super::support::{Reference, assert_close, fixtures, one_at_a_time, tiny_model};

type Ad = Autodiff<Flex>;

/// The smallest gradient scale a gradient's error is measured against (the others here are
/// above 1e-2).
const GRADIENT_FLOOR: f32 = 1e-4;

pub(super) fn references() -> Reference {
    Reference::open("release/references.safetensors")
}

/// fVLM's model of the fixture with `readout` and λ_coarse = `lambda`, its weights read from
/// fVLM's state dict.
pub(super) fn load<B: Backend>(readout: Readout, lambda: f64) -> FoveatedModel<B> {
    let config = FoveatedConfig {
        query_dim: 8,
        readout,
        lambda_coarse: lambda,
        ..FoveatedConfig::release()
    };
    tiny_model::<B>(config)
        .with_fvlm_weights(fixtures().join("release"))
        .unwrap()
}

/// The fixture's batch as fVLM collates it: frames with a frame mask (clip 2's last frame is
/// padding), the text with its attention mask (clip 2's last two tokens are padding) and, for
/// stage 2, the answer mask as the loss mask.
fn batch<B: Backend>(reference: &Reference, answer_only: bool) -> ClipBatch<B> {
    let count = |row: Vec<i64>| row.iter().filter(|&&x| x != 0).count();
    let frame_lengths = reference.table_u8("frame_mask").into_iter().map(count);
    let target_lengths = reference.table("attention_mask").into_iter().map(count);
    let batch = ClipBatch::new(reference.tensor("frames"))
        .with_frame_lengths(frame_lengths.collect())
        .with_target(reference.ids("input_ids"));
    let batch = ClipBatch {
        target_lengths: target_lengths.collect(),
        ..batch
    };
    if !answer_only {
        return batch;
    }
    let mask = reference.table("answer_mask");
    batch.with_loss_mask(
        mask.into_iter()
            .map(|row| row.into_iter().map(|x| x != 0).collect())
            .collect(),
    )
}

/// The reference's text logits `[B, S, V]` at the positions kiln keeps: fVLM's position i
/// predicts text token i + 1, so its last position predicts nothing.
fn predicting<B: Backend>(reference: &Reference, key: &str) -> Tensor<B, 3> {
    let logits: Tensor<B, 3> = reference.tensor(key);
    let [clips, text, vocab] = logits.dims();
    logits.slice([0..clips, 0..text - 1, 0..vocab])
}

#[test]
fn both_passes_read_what_fvlm_reads() {
    let reference = references();
    for (readout, name) in [(Readout::Deep, "deep"), (Readout::Shallow, "shallow")] {
        let model = load::<Flex>(readout, 0.0);
        let output = model
            .forward(&batch(&reference, false), Mode::CoarseFine)
            .unwrap();
        let coarse = output.coarse.unwrap();
        assert_close(coarse.tokens, &reference, &format!("{name}.z_coarse"));
        assert_close(
            output.queries.unwrap(),
            &reference,
            &format!("{name}.queries"),
        );
        let fine = output.fine.unwrap();
        assert_close(fine.tokens, &reference, &format!("{name}.z_fine"));
        // The coarse pass ran over the visual tokens alone (λ = 0): no text, no logits.
        assert_eq!(coarse.hidden.dims()[1], 3, "{name}");
        assert_eq!(coarse.text_logits.dims()[1], 0, "{name}");
    }
}

/// Each parameter's gradient, as a model of the same shape (zero where none flowed).
struct Gradients<'a, B: AutodiffBackend>(&'a B::Gradients);

impl<B: AutodiffBackend> ModuleMapper<B> for Gradients<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let grads = self.0;
        param.map(|tensor| {
            let grad = tensor
                .grad(grads)
                .unwrap_or_else(|| tensor.clone().inner().zeros_like());
            Tensor::from_inner(grad)
        })
    }
}

/// Checks each of `reference`'s `{prefix}.grad.<parameter>` against `saved`'s `<parameter>`;
/// returns how many.
fn compare_gradients(saved: &Reference, reference: &Reference, prefix: &str) -> usize {
    let mut checked = 0;
    for key in reference.keys(&format!("{prefix}.grad.")) {
        let parameter = &key[prefix.len() + ".grad.".len()..];
        let ((ours, shape), (theirs, their_shape)) =
            (saved.floats(parameter), reference.floats(&key));
        assert_eq!(shape, their_shape, "{key}: shapes");
        // The keys' biases get no gradient in exact arithmetic (softmax ignores a shift common
        // to every key): both sides are rounding noise, measured against a floor.
        let scale = theirs
            .iter()
            .map(|x| x.abs())
            .fold(GRADIENT_FLOOR, f32::max);
        let worst = (ours.iter().zip(&theirs))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-3 * scale,
            "{key}: max |Δ| {worst:.2e}, max |grad| {scale:.2e}"
        );
        checked += 1;
    }
    checked
}

#[test]
fn losses_logits_and_every_gradient_match_fvlm_in_both_stages() {
    let _alone = one_at_a_time();
    let reference = references();
    let cases = [
        ("stage1", 0.0, false),
        ("stage2", 0.0, true),
        ("coarse", 0.5, false),
    ];
    let saved = tempfile::tempdir().unwrap();
    for (readout, name) in [(Readout::Deep, "deep"), (Readout::Shallow, "shallow")] {
        for (case, lambda, answer_only) in cases {
            let prefix = format!("{name}.{case}");
            let model = load::<Ad>(readout, lambda);
            let batch = batch(&reference, answer_only);
            let output = model.forward(&batch, Mode::CoarseFine).unwrap();
            let losses = model.loss(&output, &batch).unwrap();
            let scalar = |loss: &Tensor<Ad, 1>, key: &str| {
                let ours = loss.clone().into_scalar();
                let theirs = reference.floats(&format!("{prefix}.{key}")).0[0];
                assert!(
                    (ours - theirs).abs() <= 1e-5 * theirs.abs(),
                    "{prefix}.{key}: {ours} vs {theirs}"
                );
            };
            scalar(&losses.total, "loss");
            scalar(losses.fine.as_ref().unwrap(), "fine_loss");
            if lambda > 0.0 {
                scalar(losses.coarse.as_ref().unwrap(), "coarse_loss");
            } else {
                assert!(
                    losses.coarse.is_none(),
                    "{prefix}: λ = 0 scores no coarse pass"
                );
            }
            let logits = output.fine.as_ref().unwrap().text_logits.clone();
            let expected: Tensor<Ad, 3> = predicting(&reference, &format!("{prefix}.logits"));
            let error = (logits - expected).abs().max().into_scalar();
            assert!(error < 1e-4, "{prefix}.logits: {error:.2e}");

            let grads = losses.total.backward();
            let gradients = model.clone().map(&mut Gradients::<Ad>(&grads));
            // The gradients in fVLM's names: the checkpoint writer names them.
            gradients.save_fvlm(saved.path()).unwrap();
            let saved_grads = Reference::open_path(&saved.path().join("model.safetensors"));
            let checked = compare_gradients(&saved_grads, &reference, &prefix);
            assert!(checked > 60, "{prefix}: {checked} gradients checked");
        }
    }
}

/// A text-only batch, as fVLM's `text_interleave.py` wraps one (a padding frame a sample,
/// nothing encoded, the visual tokens zero): the loss, the logits and every gradient as fVLM's
/// `forward_coarse_fine` gives them; no gradient reaches a parameter that only reads frames.
#[test]
fn a_text_only_batch_trains_what_fvlm_trains() {
    let _alone = one_at_a_time();
    let reference = references();
    let model = load::<Ad>(Readout::Deep, 0.0);
    let full = batch::<Ad>(&reference, false);
    let [clips, _, channels, height, width] = full.pixels.dims();
    let batch = ClipBatch {
        pixels: Tensor::zeros([clips, 1, channels, height, width], &Default::default()),
        frame_lengths: vec![0; clips],
        ..full
    };
    let output = model.forward(&batch, Mode::CoarseFine).unwrap();
    let losses = model.loss(&output, &batch).unwrap();
    let ours = losses.total.clone().into_scalar();
    let theirs = reference.floats("text_only.loss").0[0];
    assert!((ours - theirs).abs() <= 1e-5 * theirs, "{ours} vs {theirs}");
    let logits = output.fine.unwrap().text_logits;
    let expected: Tensor<Ad, 3> = predicting(&reference, "text_only.logits");
    let error = (logits - expected).abs().max().into_scalar();
    assert!(error < 1e-4, "text_only.logits: {error:.2e}");

    let grads = losses.total.backward();
    let gradients = model.clone().map(&mut Gradients::<Ad>(&grads));
    let saved = tempfile::tempdir().unwrap();
    gradients.save_fvlm(saved.path()).unwrap();
    let saved = Reference::open_path(&saved.path().join("model.safetensors"));
    assert_eq!(compare_gradients(&saved, &reference, "text_only"), 22);
    let reached = reference.keys("text_only.grad.");
    // The tiny LM ties its head to its embedding: one parameter, fVLM's name the embedding's.
    let tied = |key: &str| {
        key == "llm.lm_head.weight"
            && saved.floats(key) == saved.floats("llm.model.embed_tokens.weight")
    };
    for key in saved.keys("") {
        if !reached.contains(&format!("text_only.grad.{key}")) && !tied(&key) {
            let (values, _) = saved.floats(&key);
            assert!(values.iter().all(|&x| x == 0.0), "{key} got a gradient");
        }
    }
}

/// fVLM's inference pass (`forward_autoregressive`): each frame's query from the hidden state at
/// the frame before, the LM one visual token at a time, then the text, whose first token is
/// scored too. Every frame is real (with padding frames fVLM's inference reads zeroed keys and
/// values where its training passes read nothing).
#[test]
fn the_autoregressive_pass_matches_fvlm_inference() {
    let reference = references();
    let model = load::<Flex>(Readout::Deep, 0.0);
    for (case, answer_only) in [("stage1", false), ("stage2", true)] {
        let mut batch = batch::<Flex>(&reference, answer_only);
        batch.frame_lengths.clear();
        let output = model.forward(&batch, Mode::Autoregressive).unwrap();
        let losses = model.loss(&output, &batch).unwrap();
        let key = format!("autoregressive.{case}");
        let ours = losses.total.into_scalar();
        let theirs = reference.floats(&format!("{key}.loss")).0[0];
        assert!(
            (ours - theirs).abs() <= 1e-5 * theirs,
            "{key}.loss: {ours} vs {theirs}"
        );
        // fVLM's logits are the last visual position's, then every text position's: kiln's are
        // those that predict a text token, all but the last.
        let theirs = predicting::<Flex>(&reference, &format!("{key}.logits"));
        let ours = output.fine.unwrap().text_logits;
        assert_eq!(ours.dims(), theirs.dims(), "{key}.logits");
        let scale = theirs.clone().abs().max().into_scalar();
        let error = (ours - theirs).abs().max().into_scalar() / scale;
        assert!(error <= 1e-4, "{key}.logits: relative error {error:.2e}");
    }
}

/// Where kiln's autoregressive pass differs from fVLM's `forward_autoregressive` on purpose
/// (docs/FOVEATED.md, "fVLM as released"): a padding frame gives a zero visual token, as in
/// fVLM's training passes (fVLM's inference reads zeroed keys and values through every DINOv2
/// layer there and gets a token from the query alone); and the pass reads with the configured
/// readout (fVLM's always reads deep).
#[test]
fn autoregressive_padding_reads_nothing_with_the_configured_readout() {
    let reference = references();
    let model = load::<Flex>(Readout::Deep, 0.0);
    // Clip 2's last frame is padding.
    let padded = batch::<Flex>(&reference, false);
    let fine = model
        .forward(&padded, Mode::Autoregressive)
        .unwrap()
        .fine
        .unwrap();
    let [_, frames, width] = fine.tokens.dims();
    let token = |frame: usize| {
        (fine
            .tokens
            .clone()
            .slice([1..2, frame..frame + 1, 0..width]))
        .abs()
        .max()
        .into_scalar()
    };
    assert_eq!(token(frames - 1), 0.0, "the padding frame's token");
    assert!(token(0) > 0.0, "a real frame's token");

    let mut real = padded.clone();
    real.frame_lengths.clear();
    let heads = |readout| {
        let output = load::<Flex>(readout, 0.0).forward(&real, Mode::Autoregressive);
        output.unwrap().fine.unwrap().attention.unwrap().dims()[1]
    };
    // The deep readout's attention covers every layer's heads, the shallow one's one layer's.
    assert!(heads(Readout::Shallow) < heads(Readout::Deep));
}

/// What `save_fvlm` writes is fVLM's state dict: the same names, shapes and values as the one
/// fVLM's code saved (DINOv2's unused mask token as zeros), so its strict `load_state_dict`
/// takes it; and it loads back into kiln unchanged.
#[test]
fn fvlm_checkpoints_load_and_save() {
    let original = Reference::open("release/model.safetensors");
    let model = load::<Flex>(Readout::Deep, 0.0);
    let dir = tempfile::tempdir().unwrap();
    model.save_fvlm(dir.path()).unwrap();
    let saved = Reference::open_path(&dir.path().join("model.safetensors"));
    assert_eq!(saved.keys(""), original.keys(""));
    for key in original.keys("") {
        let ((ours, shape), (theirs, their_shape)) = (saved.floats(&key), original.floats(&key));
        assert_eq!(shape, their_shape, "{key}");
        if key == "encoder.dino.embeddings.mask_token" {
            assert!(ours.iter().all(|&x| x == 0.0));
        } else {
            assert_eq!(ours, theirs, "{key}");
        }
    }
    let again = tiny_model::<Flex>(model.config().clone())
        .with_fvlm_weights(dir.path())
        .unwrap();
    let batch = batch::<Flex>(&references(), false);
    let [a, b] = [&model, &again].map(|m| {
        let output = m.forward(&batch, Mode::CoarseFine).unwrap();
        m.loss(&output, &batch).unwrap().total.into_scalar()
    });
    assert_eq!(a, b);

    let research = tiny_model::<Flex>(FoveatedConfig {
        query_dim: 8,
        ..FoveatedConfig::research()
    });
    let message = research
        .with_fvlm_weights(dir.path())
        .unwrap_err()
        .to_string();
    assert!(message.contains("release variant"), "{message}");
}

/// Stage 3, DPO: the chosen conversation is the fixture's text with its answer mask, the rejected
/// one fVLM's `dpo.rejected_*`; the reference model is a frozen copy of the policy, as at fVLM's
/// first DPO step. The log-probabilities, the loss (ln 2 there) and every gradient match
/// `forward_dpo` and `train.compute_dpo_loss`.
#[test]
fn dpo_matches_fvlm_forward_dpo() {
    let _alone = one_at_a_time();
    let reference = references();
    let policy = load::<Ad>(Readout::Deep, 0.0);
    let frozen = load::<Ad>(Readout::Deep, 0.0);
    let (chosen, rejected) = dpo_pair::<Ad>(&reference);
    let ours = policy.preference_logps(&chosen, &rejected).unwrap();
    let anchor = frozen
        .preference_logps(&chosen, &rejected)
        .unwrap()
        .detach();
    assert_close(ours.chosen.clone(), &reference, "dpo.chosen_logps");
    assert_close(ours.rejected.clone(), &reference, "dpo.rejected_logps");
    let loss = kiln_foveated::dpo_loss(&ours, &anchor, kiln_foveated::DPO_BETA);
    let theirs = reference.floats("dpo.loss").0[0];
    let value = loss.clone().into_scalar();
    assert!(
        (value - theirs).abs() <= 1e-6,
        "dpo.loss: {value} vs {theirs}"
    );
    let grads = loss.backward();
    let gradients = policy.clone().map(&mut Gradients::<Ad>(&grads));
    let dir = tempfile::tempdir().unwrap();
    gradients.save_fvlm(dir.path()).unwrap();
    let saved = Reference::open_path(&dir.path().join("model.safetensors"));
    let checked = compare_gradients(&saved, &reference, "dpo");
    assert!(checked > 60, "{checked} gradients checked");
    // The frozen model got none.
    let frozen_grads = frozen.clone().map(&mut Gradients::<Ad>(&grads));
    let q_init: Tensor<Ad, 2> = frozen_grads.connectors.q_init.val();
    assert_eq!(q_init.abs().sum().into_scalar(), 0.0);
}

/// The fixture's preference pair: the text with its answer mask, and fVLM's `dpo.rejected_*`.
pub(super) fn dpo_pair<B: Backend>(reference: &Reference) -> (ClipBatch<B>, ClipBatch<B>) {
    let chosen = batch::<B>(reference, true);
    let count = |row: Vec<i64>| row.iter().filter(|&&x| x != 0).count();
    let rejected = ClipBatch {
        target: reference.ids("dpo.rejected_ids"),
        target_lengths: (reference.table("dpo.rejected_attention_mask").into_iter())
            .map(count)
            .collect(),
        loss_mask: (reference.table("dpo.rejected_loss_mask").into_iter())
            .map(|row| row.into_iter().map(|x| x != 0).collect())
            .collect(),
        ..chosen.clone()
    };
    (chosen, rejected)
}
