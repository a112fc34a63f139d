//! Captions as fVLM makes them: scripts/fixtures/fvlm_release.py runs fVLM's own
//! `generate_captions.py` `main()` on a tiny model (the `caption/` fixture: the `dino/` fixture and
//! an LM over kiln-text's fixture tokenizer), and kiln's [`FoveatedModel::generate`] must give
//! its greedy tokens, 200 a clip, from its prompts; kiln's scoring of those tokens must give its
//! logits (the first 32 steps) within 1e-4 of the largest.

use std::collections::BTreeMap;

use burn::backend::Flex;
use burn::tensor::Tensor;
use kiln_core::Policy;
use kiln_foveated::{CaptionTokenizer, ClipBatch, FoveatedModel, Mode, answer_letter, mcq_options};
use kiln_text::GenerationConfig;

use super::support::{Reference, fixtures, relative_error, relative_error_of};

/// fVLM's script turns a still image into this many frames.
const STILL_FRAMES: usize = 8;

fn model() -> FoveatedModel<Flex> {
    let dir = fixtures().join("caption");
    let (dino, lm) = (fixtures().join("dino"), dir.join("lm"));
    let device = Default::default();
    FoveatedModel::<Flex>::from_fvlm_checkpoint(&dir, dino, lm, &device, &Policy::full()).unwrap()
}

#[test]
fn captions_are_fvlms_greedy_tokens_and_logits() {
    let reference = Reference::open("caption/references.safetensors");
    let tokens = CaptionTokenizer::chat_from_lm_dir(fixtures().join("caption/lm"), "").unwrap();
    let model = model();
    let generation = GenerationConfig {
        stop_tokens: vec![tokens.end()],
        ..GenerationConfig::greedy(200)
    };
    for clip in 0..3 {
        let key = |name: &str| format!("caption.{clip}.{name}");
        let question = reference.ids(&key("prompt_ids")).remove(0);
        let user = reference.metadata(&key("user_prompt"));
        assert_eq!(
            tokens.question(&user).unwrap(),
            question,
            "clip {clip}: the prompt"
        );

        let frames: Tensor<Flex, 5> = reference.tensor(&key("frames"));
        let frames = match frames.dims()[1] {
            1 => frames.repeat_dim(1, STILL_FRAMES),
            _ => frames,
        };
        let batch = ClipBatch::new(frames.clone()).with_target(vec![question.clone()]);
        let mut ours = model
            .generate(&batch, &generation, |_| {})
            .unwrap()
            .remove(0);
        if ours.last() == Some(&tokens.end()) {
            ours.pop();
        }
        let theirs = reference.ids(&key("tokens")).remove(0);
        assert_eq!(ours, theirs, "clip {clip}: the greedy tokens");

        // Token j is scored at the text position before it: the question's length + j.
        let (logits, shape) = reference.floats(&key("logits"));
        let steps = shape[0];
        let scored = [question.clone(), theirs[..steps].to_vec()].concat();
        let output = ClipBatch::new(frames).with_target(vec![scored]);
        let output = model.forward(&output, Mode::Autoregressive).unwrap();
        let text_logits = output.fine.unwrap().text_logits;
        let [_, _, vocab] = text_logits.dims();
        let start = question.len();
        let ours = text_logits.slice([0..1, start..start + steps, 0..vocab]);
        let ours = (
            ours.into_data().to_vec::<f32>().unwrap(),
            vec![steps, vocab],
        );
        let error = relative_error_of(ours, (logits, shape), &key("logits"));
        assert!(
            error <= 1e-4,
            "clip {clip}: logits, relative error {error:.2e}"
        );
    }
}

/// A checkpoint laid out as fVLM publishes one (`sanps/fVLM-135M`'s `model.safetensors`: its
/// `FoveatedVLM.state_dict()`, the LM's tensors in bf16 as fVLM builds its LM, the rest in f32)
/// loads and captions: the LM's weights rounded to bf16 move the tokens little, so the first
/// ones are the f32 model's.
#[test]
fn a_checkpoint_as_fvlm_publishes_it_captions() {
    let fixture = fixtures().join("caption");
    let bytes = std::fs::read(fixture.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let stored: Vec<(String, Vec<usize>, safetensors::Dtype, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let f32s = view.data().chunks_exact(4);
            let values = f32s.map(|b| f32::from_le_bytes(b.try_into().unwrap()));
            let (dtype, data) = match name.starts_with("llm.") {
                true => (
                    safetensors::Dtype::BF16,
                    values
                        .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                        .collect(),
                ),
                false => (safetensors::Dtype::F32, view.data().to_vec()),
            };
            (name, view.shape().to_vec(), dtype, data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = stored
        .iter()
        .map(|(name, shape, dtype, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();

    let device = Default::default();
    let (dino, lm) = (fixtures().join("dino"), fixture.join("lm"));
    let published =
        FoveatedModel::<Flex>::from_fvlm_checkpoint(dir.path(), dino, lm, &device, &Policy::full())
            .unwrap();
    let reference = Reference::open("caption/references.safetensors");
    let question = reference.ids("caption.0.prompt_ids").remove(0);
    let frames: Tensor<Flex, 5> = reference.tensor("caption.0.frames");
    let batch = ClipBatch::new(frames).with_target(vec![question]);
    let tokens = published
        .generate(&batch, &GenerationConfig::greedy(4), |_| {})
        .unwrap()
        .remove(0);
    let theirs = reference.ids("caption.0.tokens").remove(0);
    assert_eq!(tokens, theirs[..4]);
}

/// Generation refuses what fVLM's inference does not read as its training does: padding frames,
/// and texts of several lengths.
#[test]
fn padding_is_refused_by_clip() {
    let model = model();
    let frames = Tensor::<Flex, 5>::zeros([2, 3, 3, 16, 16], &Default::default());
    let config = GenerationConfig::greedy(2);
    let padded = ClipBatch::new(frames.clone())
        .with_frame_lengths(vec![3, 2])
        .with_target(vec![vec![1, 2], vec![1, 2]]);
    let err = model.generate(&padded, &config, |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("clip 2: 2 of its 3 frames"),
        "{err}"
    );
    let uneven = ClipBatch::new(frames).with_captions(vec![vec![1, 2], vec![3]], 0);
    let err = model.generate(&uneven, &config, |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("clip 2: its text is padded"),
        "{err}"
    );
}

/// fVLM's `forward_coarse_only` scores the text's first token from the last visual position,
/// as its autoregressive pass does; so does kiln's coarse-only mode: the same loss over every
/// text token, and the same logits for the first 8.
#[test]
fn coarse_only_scores_the_first_text_token_as_fvlm_does() {
    let reference = Reference::open("caption/references.safetensors");
    let model = model();
    let frames: Tensor<Flex, 5> = reference.tensor("bench.0.frames");
    let ids = reference.ids("coarse_only.ids").remove(0);
    let batch = ClipBatch::new(frames).with_target(vec![ids]);
    let output = model.forward(&batch, Mode::CoarseOnly).unwrap();
    let ours = model.loss(&output, &batch).unwrap().total.into_scalar();
    let theirs = reference.floats("coarse_only.loss").0[0];
    assert!(
        (ours - theirs).abs() <= 1e-5 * theirs,
        "loss {ours} vs {theirs}"
    );
    let pass = output.coarse.unwrap();
    assert_eq!(pass.first_target, 0);
    let [_, _, vocab] = pass.text_logits.dims();
    let first = pass.text_logits.slice([0..1, 0..8, 0..vocab]);
    let error = relative_error(first, &reference, "coarse_only.logits");
    assert!(error <= 1e-4, "logits: relative error {error:.2e}");
}

/// fVLM's `benchmark.py` on the caption fixture (its own `score_options_batched`,
/// `parse_mcq_options` and `extract_answer_letter`): the options and answers read from the
/// questions, and each option's loss in each mode within 1e-4 of fVLM's.
#[test]
fn options_score_as_fvlms_benchmark() {
    let reference = Reference::open("caption/references.safetensors");
    let json = |key: &str| -> serde_json::Value {
        serde_json::from_str(&reference.metadata(key)).unwrap()
    };
    for case in json("bench.parser").as_array().unwrap() {
        let text = case[0].as_str().unwrap();
        let theirs: BTreeMap<char, String> = (case[1].as_object().unwrap().iter())
            .map(|(k, v)| (k.chars().next().unwrap(), v.as_str().unwrap().into()))
            .collect();
        assert_eq!(mcq_options(text), theirs, "{text:?}");
    }
    for case in json("bench.answers").as_array().unwrap() {
        let (text, theirs) = (case[0].as_str().unwrap(), case[1].as_str().unwrap());
        assert_eq!(answer_letter(text), theirs, "{text:?}");
    }

    let tokens = CaptionTokenizer::chat_from_lm_dir(fixtures().join("caption/lm"), "").unwrap();
    assert_eq!(tokens.pad().to_string(), reference.metadata("bench.pad"));
    let model = model();
    let modes = [
        ("coarse_only", Mode::CoarseOnly),
        ("coarse_fine", Mode::CoarseFine),
        ("autoregressive", Mode::Autoregressive),
    ];
    for question in 0..2 {
        let key = |name: &str| format!("bench.{question}.{name}");
        let asked: serde_json::Value = json(&key("question"));
        let options = mcq_options(asked["user"].as_str().unwrap());
        let theirs: BTreeMap<String, String> =
            serde_json::from_value(json(&key("options"))).unwrap();
        let ours: BTreeMap<String, String> = (options.iter())
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        assert_eq!(ours, theirs);
        let texts: Vec<&str> = options.values().map(String::as_str).collect();
        let (start, ids) = tokens
            .options(asked["user"].as_str().unwrap(), &texts)
            .unwrap();
        let frames: Tensor<Flex, 5> = reference.tensor(&key("frames"));
        let frames = match frames.dims()[1] {
            1 => frames.repeat_dim(1, STILL_FRAMES),
            _ => frames,
        };
        for (name, mode) in modes {
            let ours = model
                .option_losses(frames.clone(), &ids, start, tokens.pad(), mode)
                .unwrap();
            let (theirs, _) = reference.doubles(&key(name));
            assert_eq!(ours.len(), theirs.len());
            for (a, b) in ours.iter().zip(&theirs) {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs(),
                    "question {question}, {name}: {ours:?} vs {theirs:?}"
                );
            }
        }
    }
}
