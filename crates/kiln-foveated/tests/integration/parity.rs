//! The foveated model against a PyTorch implementation of fVLM's computation on tiny transformers
//! checkpoints (scripts/fixtures/foveated.py): DINOv2's patch features and per-layer keys and
//! values, the deep readout, and both passes of both readouts (visual tokens, queries, the LM's
//! hidden states, the text and per-frame logits, the losses). Tolerance: max |Δ| / max
//! |reference| ≤ 1e-4 in f32 on Flex.

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_core::Policy;
use kiln_foveated::{
    ClipBatch, FoveatedConfig, FoveatedError, FoveatedModel, FoveatedOutput, FrameHead, Mode,
    Readout,
};

use super::support::{Reference, assert_close, fixtures, one_at_a_time, tiny_model};

/// The fixture's batch: 2 clips of 3 frames, a prompt, a target and per-frame classes.
fn fixture_batch<B: Backend>(reference: &Reference) -> ClipBatch<B> {
    let pixels: Tensor<B, 4> = reference.tensor("pixel_values");
    let [frames, channels, height, width] = pixels.dims();
    ClipBatch::new(pixels.reshape([2, frames / 2, channels, height, width]))
        .with_prompt(reference.ids("prompt_ids"))
        .with_target(reference.ids("target_ids"))
        .with_frame_targets(reference.table("frame_targets"))
}

fn load<B: Backend>(readout: Readout) -> FoveatedModel<B> {
    let dir = fixtures();
    let mut config = FoveatedConfig::from_file(dir.join("connectors")).unwrap();
    config.readout = readout;
    tiny_model::<B>(config)
        .with_connectors_from(dir.join("connectors"))
        .unwrap()
}

#[test]
fn patches_keys_and_values_match_fvlm_encode_patches() {
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(Readout::Deep);
    let patches = model
        .dino
        .encode_patches(reference.tensor("pixel_values"))
        .unwrap();
    assert_close(
        patches.last_hidden_state.clone(),
        &reference,
        "patches.last_hidden_state",
    );
    assert_eq!(patches.keys_values.len(), 2);
    for (layer, [key, value]) in patches.keys_values.iter().enumerate() {
        assert_close(key.clone(), &reference, &format!("patches.key.{layer}"));
        assert_close(value.clone(), &reference, &format!("patches.value.{layer}"));
    }
    let queries: Tensor<Flex, 3> = reference.tensor("read.queries");
    let read = model.dino.read(queries.clone(), &patches).unwrap();
    assert_close(read, &reference, "read.output");
    let reading = model.dino.read_with_attention(queries, &patches).unwrap();
    assert_close(reading.output, &reference, "read.output");
    assert_eq!(reading.attention.len(), 2);
    for (layer, weights) in reading.attention.into_iter().enumerate() {
        assert_close(weights, &reference, &format!("read.attention.{layer}"));
    }
}

fn check_both_passes(readout: Readout, name: &str) {
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(readout);
    let batch = fixture_batch(&reference);
    let output = model.forward(&batch, Mode::CoarseFine).unwrap();
    let (coarse, fine) = (output.coarse.clone().unwrap(), output.fine.clone().unwrap());
    let key = |what: &str| format!("{name}.{what}");
    assert_close(coarse.tokens.clone(), &reference, &key("coarse_tokens"));
    assert_close(coarse.hidden.clone(), &reference, &key("coarse_hidden"));
    assert_close(output.queries.clone().unwrap(), &reference, &key("queries"));
    assert_close(fine.tokens.clone(), &reference, &key("fine_tokens"));
    assert_close(fine.hidden.clone(), &reference, &key("fine_hidden"));
    for (pass, output) in [("coarse", &coarse), ("fine", &fine)] {
        let frames = output.frame_logits.clone().unwrap();
        assert_close(frames, &reference, &key(&format!("{pass}_frame_logits")));
        let text = output.text_logits.clone();
        assert_close(text, &reference, &key(&format!("{pass}_text_logits")));
    }
    let losses = model.loss(&output, &batch).unwrap();
    assert_close(losses.coarse.unwrap(), &reference, &key("coarse_loss"));
    assert_close(losses.fine.unwrap(), &reference, &key("fine_loss"));
    assert_close(losses.total, &reference, &key("loss"));
}

#[test]
fn deep_readout_passes_match_the_reference() {
    check_both_passes(Readout::Deep, "deep");
}

#[test]
fn shallow_readout_passes_match_the_reference() {
    check_both_passes(Readout::Shallow, "shallow");
}

/// The coarse-only mode is the coarse pass of both passes; autoregressive mode's first query is
/// `q_init` (so its first token is the coarse-fine mode's), and each later query is
/// `llm_to_query` of its own final pass's hidden state at the frame before: the step-by-step LM
/// runs saw the same causal prefix as the final one.
#[test]
fn modes_agree_where_they_must() {
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(Readout::Deep);
    let batch = fixture_batch(&reference);
    let coarse_only = model.forward(&batch, Mode::CoarseOnly).unwrap();
    assert!(coarse_only.fine.is_none());
    assert_close(
        coarse_only.coarse.unwrap().hidden,
        &reference,
        "deep.coarse_hidden",
    );

    let both = model.forward(&batch, Mode::CoarseFine).unwrap();
    let stepwise = model.forward(&batch, Mode::Autoregressive).unwrap();
    assert!(stepwise.coarse.is_none());
    let (fine, queries) = (stepwise.fine.unwrap(), stepwise.queries.unwrap());
    let [clips, frames, width] = fine.tokens.dims();
    let first = |x: Tensor<Flex, 3>| x.slice([0..clips, 0..1, 0..width]);
    let gap = (first(fine.tokens.clone()) - first(both.fine.unwrap().tokens))
        .abs()
        .max()
        .into_scalar();
    assert!(gap < 1e-5, "first fine token differs by {gap}");

    let from_own = model
        .connectors
        .llm_to_query
        .forward(fine.at_frames())
        .slice([0..clips, 0..frames - 1]);
    let later = queries.clone().slice([0..clips, 1..frames]);
    let gap = (from_own - later).abs().max().into_scalar();
    assert!(
        gap < 1e-4,
        "autoregressive queries differ from the final pass's by {gap}"
    );
    // A clip of one frame has only q_init for its fine pass.
    let mut single = batch.clone();
    let [clips, _, c, h, w] = single.pixels.dims();
    single.pixels = single
        .pixels
        .clone()
        .slice([0..clips, 0..1, 0..c, 0..h, 0..w]);
    single.frame_targets = vec![vec![-100]; clips];
    let one = model.forward(&single, Mode::CoarseFine).unwrap();
    assert_eq!(one.queries.as_ref().unwrap().dims(), [clips, 1, 12]);
    assert!(
        model
            .loss(&one, &single)
            .unwrap()
            .total
            .into_scalar()
            .is_finite()
    );
    // And they are not the coarse pass's: the modes really differ.
    let from_coarse = both.queries.unwrap().slice([0..clips, 1..frames]);
    let apart = (from_coarse - queries.slice([0..clips, 1..frames]))
        .abs()
        .max()
        .into_scalar();
    assert!(
        apart > 1e-3,
        "autoregressive queries equal the coarse pass's"
    );
}

/// The controls: all-patches runs one pass over every token of every frame, its frame logits at
/// each frame's last token and no later frame's pixels reaching them; random queries change
/// every forward and leave the coarse pass as it is.
#[test]
fn control_modes_see_what_they_should() {
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(Readout::Deep);
    let batch = fixture_batch::<Flex>(&reference);
    let every = model.forward(&batch, Mode::AllPatches).unwrap();
    assert!(every.coarse.is_none() && every.queries.is_none());
    let pass = every.fine.unwrap();
    assert_eq!(pass.per_frame, 17);
    assert_close(
        pass.tokens.clone().reshape([6, 17, 24]),
        &reference,
        "patches.last_hidden_state",
    );
    let logits = pass.frame_logits.unwrap();
    // Another last frame leaves the earlier frames' logits as they were (the LM is causal).
    let mut changed = batch.clone();
    let [clips, frames, c, h, w] = changed.pixels.dims();
    changed.pixels = changed.pixels.clone().slice_assign(
        [0..clips, frames - 1..frames, 0..c, 0..h, 0..w],
        Tensor::zeros([clips, 1, c, h, w], &Default::default()),
    );
    let again = model
        .forward(&changed, Mode::AllPatches)
        .unwrap()
        .fine
        .unwrap();
    let again = again.frame_logits.unwrap();
    let classes = 5;
    let head =
        |x: Tensor<Flex, 3>, range: std::ops::Range<usize>| x.slice([0..clips, range, 0..classes]);
    let kept = (head(logits.clone(), 0..frames - 1) - head(again.clone(), 0..frames - 1))
        .abs()
        .max()
        .into_scalar();
    assert!(kept < 1e-5, "earlier frames moved by {kept}");
    let moved = (head(logits, frames - 1..frames) - head(again, frames - 1..frames))
        .abs()
        .max()
        .into_scalar();
    assert!(moved > 1e-3, "the changed frame's logits did not move");

    let first = model.forward(&batch, Mode::RandomQueries).unwrap();
    let second = model.forward(&batch, Mode::RandomQueries).unwrap();
    assert_close(
        first.coarse.unwrap().hidden,
        &reference,
        "deep.coarse_hidden",
    );
    let apart = (first.queries.unwrap() - second.queries.unwrap())
        .abs()
        .max()
        .into_scalar();
    assert!(apart > 0.1, "random queries repeated");
}

/// Both queries learn: `q_static` through the coarse pass, `q_init` through the fine pass's
/// first frame, and the LM-to-query connector through the fine pass's later frames.
#[test]
fn gradients_reach_both_queries_and_the_connectors() {
    let _alone = one_at_a_time();
    type Ad = Autodiff<Flex>;
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Ad>(Readout::Deep);
    let batch = fixture_batch::<Ad>(&reference);
    let output = model.forward(&batch, Mode::CoarseFine).unwrap();
    let grads = model.loss(&output, &batch).unwrap().total.backward();
    let connectors = &model.connectors;
    let norm = |grad: Option<Tensor<Flex, 2>>| grad.expect("a gradient").abs().sum().into_scalar();
    assert!(norm(connectors.q_static.grad(&grads)) > 0.0);
    assert!(norm(connectors.q_init.grad(&grads)) > 0.0);
    let llm_to_query = connectors
        .llm_to_query
        .weight
        .grad(&grads)
        .expect("a gradient");
    assert!(llm_to_query.abs().sum().into_scalar() > 0.0);
}

fn error_of(result: Result<impl Sized, FoveatedError>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_settings_and_inputs_are_named() {
    let dir = fixtures();
    let readout = error_of("glance".parse::<Readout>());
    assert!(
        readout.contains("'glance'") && readout.contains("deep"),
        "{readout}"
    );

    let wrong_family = |dino: &Path, lm: &Path| {
        error_of(FoveatedModel::<Flex>::from_dirs(
            dino,
            lm,
            FoveatedConfig::research(),
            &Default::default(),
            &Policy::full(),
        ))
    };
    let swapped = wrong_family(&dir.join("lm"), &dir.join("lm"));
    assert!(swapped.contains("llama"), "{swapped}");
    let swapped = wrong_family(&dir.join("dino"), &dir.join("dino"));
    assert!(swapped.contains("dinov2"), "{swapped}");

    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(Readout::Deep);
    let batch = fixture_batch::<Flex>(&reference);
    let mut long_target = batch.clone();
    long_target.target[1].push(7);
    let message = error_of(model.forward(&long_target, Mode::CoarseFine));
    assert!(message.contains("clip 2"), "{message}");
    let mut outside = batch.clone();
    outside.prompt[0][1] = 50;
    let message = error_of(model.forward(&outside, Mode::CoarseFine));
    assert!(message.contains("clip 1, prompt token 2"), "{message}");
    let mut class = batch.clone();
    class.frame_targets[1][2] = 5;
    let message = error_of(model.forward(&class, Mode::CoarseFine));
    assert!(message.contains("clip 2, frame 3"), "{message}");

    let config = FoveatedConfig {
        frame_head: FrameHead::Classes(1),
        ..FoveatedConfig::research()
    };
    assert!(config.validate().is_err());
}

/// The deep readout's gradient with respect to its queries (kiln's attention as one autodiff
/// operation, queries and keys of different lengths) against central finite differences.
#[test]
fn deep_readout_gradient_matches_finite_differences() {
    let _alone = one_at_a_time();
    type Ad = Autodiff<Flex>;
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Ad>(Readout::Deep);
    let patches = model
        .dino
        .encode_patches(reference.tensor("pixel_values"))
        .unwrap();
    let queries: Tensor<Ad, 3> = reference.tensor("read.queries");
    let weights: Tensor<Ad, 3> = reference.tensor::<Ad, 3>("read.output").sin();
    let objective =
        |q: Tensor<Ad, 3>| (model.dino.read(q, &patches).unwrap() * weights.clone()).sum();
    let q = queries.clone().require_grad();
    let grads = objective(q.clone()).backward();
    let analytic = q.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
    let base = queries.clone().into_data().to_vec::<f32>().unwrap();
    let dims = queries.dims();
    // The objective is an f32 sum: its rounding over 2h dominates the gap at small h (1e-2 left
    // 2.8e-3 on a CPU without AVX-512, 5e-2 leaves 3.8e-4), so h is large and the stencil's
    // O(h⁴) truncation keeps that honest.
    let h = 5e-2f32;
    let mut worst = 0f32;
    let scale = analytic.iter().map(|g| g.abs()).fold(0f32, f32::max);
    for index in (0..base.len()).step_by(7) {
        let at = |delta: f32| {
            let mut values = base.clone();
            values[index] += delta;
            let q = Tensor::<Ad, 3>::from_data(TensorData::new(values, dims), &Default::default());
            objective(q).into_scalar()
        };
        // Five-point central difference (truncation O(h⁴)).
        let numeric = (8.0 * (at(h) - at(-h)) - (at(2.0 * h) - at(-2.0 * h))) / (12.0 * h);
        worst = worst.max((numeric - analytic[index]).abs());
    }
    assert!(scale > 0.0);
    assert!(
        worst / scale < 2e-3,
        "worst gap {worst:.2e} against a largest gradient {scale:.2e}"
    );
}

/// Each mode logs the figures that apply to it, each in its range; the readout's attention is a
/// distribution over every token of a frame (CLS and 16 patches), one per layer and head.
#[test]
fn diagnostics_name_what_each_mode_has() {
    let reference = Reference::open("foveated.safetensors");
    let batch = fixture_batch::<Flex>(&reference);
    let names = |output: &FoveatedOutput<Flex>| -> Vec<&str> {
        output.diagnostics().into_iter().map(|(n, _)| n).collect()
    };
    for readout in [Readout::Deep, Readout::Shallow] {
        let model = load::<Flex>(readout);
        let both = model.forward(&batch, Mode::CoarseFine).unwrap();
        let attention = both.fine.as_ref().unwrap().attention.clone().unwrap();
        let per_frame = if readout == Readout::Deep { 2 * 3 } else { 2 };
        assert_eq!(attention.dims(), [6, per_frame, 17]);
        let sums = attention.sum_dim(2);
        let off = (sums - 1.0).abs().max().into_scalar();
        assert!(off < 1e-5, "{readout:?}: probabilities sum to 1 ± {off}");
        assert_eq!(
            names(&both),
            [
                "coarse_attention_entropy",
                "coarse_attention_max",
                "fine_attention_entropy",
                "fine_attention_max",
                "coarse_fine_cosine",
                "query_similarity"
            ]
        );
        for (name, figure) in both.diagnostics() {
            let value = figure.into_scalar();
            let range = if name.ends_with("cosine") || name == "query_similarity" {
                -1.0..=1.0
            } else {
                0.0..=1.0
            };
            assert!(range.contains(&value), "{readout:?} {name} = {value}");
        }
        let coarse = model.forward(&batch, Mode::CoarseOnly).unwrap();
        assert_eq!(
            names(&coarse),
            ["coarse_attention_entropy", "coarse_attention_max"]
        );
    }
    let model = load::<Flex>(Readout::Deep);
    let stepwise = model.forward(&batch, Mode::Autoregressive).unwrap();
    assert_eq!(
        names(&stepwise),
        [
            "fine_attention_entropy",
            "fine_attention_max",
            "query_similarity"
        ]
    );
    let every = model.forward(&batch, Mode::AllPatches).unwrap();
    assert!(names(&every).is_empty());
}

/// Saved and loaded back, the model gives the same passes to the last bit; the directory holds
/// kiln's one `config.json` and one `model.safetensors`; a backbone directory or a missing one is
/// refused by name.
#[test]
fn a_saved_model_loads_back_the_same() {
    let reference = Reference::open("foveated.safetensors");
    let batch = fixture_batch::<Flex>(&reference);
    let model = load::<Flex>(Readout::Deep);
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("model");
    model.save(&saved).unwrap();
    let loaded = FoveatedModel::<Flex>::load(&saved, &Default::default(), &Policy::full()).unwrap();
    assert_eq!(loaded.config(), model.config());
    let (ours, theirs) = (
        model.forward(&batch, Mode::CoarseFine).unwrap(),
        loaded.forward(&batch, Mode::CoarseFine).unwrap(),
    );
    for (a, b) in [
        (ours.coarse.unwrap().hidden, theirs.coarse.unwrap().hidden),
        (ours.fine.unwrap().hidden, theirs.fine.unwrap().hidden),
    ] {
        assert_eq!(a.into_data(), b.into_data());
    }
    let mut names: Vec<String> = std::fs::read_dir(&saved)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "model.safetensors"]);

    let backbone =
        FoveatedModel::<Flex>::load(fixtures().join("lm"), &Default::default(), &Policy::full());
    assert!(error_of(backbone).contains("not a saved foveated model"));
    let missing = FoveatedModel::<Flex>::load(
        dir.path().join("absent"),
        &Default::default(),
        &Policy::full(),
    );
    assert!(error_of(missing).contains("absent"));
}

/// Captions of different lengths: padded to the longest, the padding outside the text loss —
/// the loss is the mean of −log p over the counted tokens alone, whatever the padding id.
#[test]
fn caption_padding_is_outside_the_loss() {
    let reference = Reference::open("foveated.safetensors");
    let model = load::<Flex>(Readout::Shallow);
    let full = fixture_batch::<Flex>(&reference);
    let mut captions = full.target.clone();
    captions[1].truncate(2);
    let batch = |pad| {
        ClipBatch::new(full.pixels.clone())
            .with_prompt(full.prompt.clone())
            .with_captions(captions.clone(), pad)
    };
    let losses: Vec<f32> = [0, 7]
        .map(|pad| {
            let batch = batch(pad);
            let output = model.forward(&batch, Mode::CoarseOnly).unwrap();
            model.loss(&output, &batch).unwrap().total.into_scalar()
        })
        .into();
    assert_eq!(losses[0], losses[1]);

    let output = model.forward(&batch(0), Mode::CoarseOnly).unwrap();
    let logits = output.coarse.unwrap().text_logits;
    let [_, tokens, vocab] = logits.dims();
    let logits = logits.into_data().to_vec::<f32>().unwrap();
    let mut total = 0.0;
    let mut counted = 0;
    for (clip, ids) in captions.iter().enumerate() {
        for (at, &id) in ids.iter().enumerate() {
            let row = &logits[(clip * tokens + at) * vocab..][..vocab];
            let peak = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let log_sum = peak + row.iter().map(|&l| (l - peak).exp()).sum::<f32>().ln();
            total += log_sum - row[id as usize];
            counted += 1;
        }
    }
    assert_eq!(counted, 5);
    let expected = total / counted as f32;
    assert!(
        (losses[0] - expected).abs() <= 1e-5 * expected.abs(),
        "{} vs {expected}",
        losses[0]
    );
}
