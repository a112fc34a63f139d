//! fVLM's released recipe on kiln-train against fVLM's own code (scripts/fixtures/fvlm_release.py
//! runs its `get_param_groups`, `get_converging_schedule` and `get_cosine_schedule_with_warmup`
//! with each 135M stage's config): which parameters each group holds, and every group's rate at
//! every step; stage 3's DPO steps.

use burn::backend::{Autodiff, Flex};
use kiln_foveated::{FoveatedConfig, PreferenceBatch, PreferenceTraining, Readout, ReleaseRecipe};
use kiln_train::{Optimization, StepReport};

use super::release::{dpo_pair, load, references};
use super::support::{Reference, one_at_a_time, tiny_model};

/// The optimizer steps the fixture's schedules span.
const STEPS: u64 = 40;

#[test]
fn release_groups_hold_what_fvlms_groups_hold() {
    let reference = Reference::open("release/references.safetensors");
    let model = tiny_model::<Autodiff<Flex>>(FoveatedConfig {
        query_dim: 8,
        ..FoveatedConfig::release()
    });
    let optimizer = ReleaseRecipe::stage1_135m().train_config(STEPS).optimizer;
    let mut sizes = vec![vec![0i64; 2]; optimizer.group_names().len()];
    for parameter in kiln_train::parameters(&model) {
        let group = &mut sizes[optimizer.group_of(&parameter.path)];
        group[0] += 1;
        group[1] += parameter.shape.iter().product::<usize>() as i64;
    }
    // connector, dino, llm: fVLM's; nothing is left to the default group.
    assert_eq!(sizes[..3], reference.table("recipe.groups")[..]);
    assert_eq!(sizes[3], [0, 0]);
}

#[test]
fn release_schedules_set_fvlms_rates_at_every_step() {
    let reference = Reference::open("release/references.safetensors");
    let stages = [
        ReleaseRecipe::stage1_135m(),
        ReleaseRecipe::stage2_135m(),
        ReleaseRecipe::stage3_135m(),
    ];
    for (stage, recipe) in (1..).zip(stages) {
        let config = recipe.train_config(STEPS);
        let peaks = config.optimizer.group_lrs();
        let (rates, shape) = reference.doubles(&format!("recipe.stage{stage}.rates"));
        assert_eq!(shape, [STEPS as usize + 2, 3]);
        for (step, theirs) in (0..).zip(rates.chunks(3)) {
            for (group, &theirs) in theirs.iter().enumerate() {
                let ours = config.schedule.rate(step, peaks[group]);
                assert!(
                    (ours - theirs).abs() <= 1e-12 * theirs.abs().max(1e-9),
                    "stage {stage}, step {step}, group {group}: {ours:e} vs {theirs:e}"
                );
            }
        }
    }
}

/// fVLM's precision: the LM's parameters in bf16, DINOv2 and the connectors in f32. A stage-1 run of the release variant on the fixture's batch stays in those
/// dtypes, and its loss falls as the f32 run's does.
#[test]
fn the_release_variant_trains_with_fvlms_bf16_lm() {
    let _alone = one_at_a_time();
    use burn::tensor::DType;
    use kiln_core::Policy;
    use kiln_foveated::{ClipBatch, FoveatedModel};
    use kiln_train::Optimization;

    type Ad = Autodiff<Flex>;
    let reference = Reference::open("release/references.safetensors");
    let batch = ClipBatch::<Ad>::new(reference.tensor("frames"))
        .with_frame_lengths(vec![3, 2])
        .with_target(reference.ids("input_ids"));
    let device = Default::default();
    let recipe = ReleaseRecipe {
        lr_connector: 1e-2,
        lr_dino: 1e-3,
        lr_llm: 1e-3,
        target_lr: Some(1e-3),
        ..ReleaseRecipe::stage1_135m()
    };
    let config = recipe.train_config(12);
    let mut losses = Vec::new();
    for bf16 in [false, true] {
        let release = FoveatedConfig {
            query_dim: 8,
            ..FoveatedConfig::release()
        };
        let mut model = tiny_model::<Ad>(release);
        if bf16 {
            model = model.with_lm_policy(&FoveatedModel::<Ad>::fvlm_lm_policy());
        }
        let mut optimization = Optimization::fresh(&config, &model, &device);
        let mut run = Vec::new();
        for step in 0..12 {
            let (next, report) = optimization.step(model, step, || batch.clone()).unwrap();
            model = next;
            run.push(report.loss);
        }
        let embeddings = model.lm.output_embeddings();
        let expected = if bf16 { DType::BF16 } else { DType::F32 };
        assert_eq!(embeddings.dtype(), expected);
        assert_eq!(
            model.connectors.dino_to_llm.weight.val().dtype(),
            DType::F32
        );
        use kiln_vision::Tower;
        assert_eq!(model.dino.settings().policy, Policy::full());
        assert!(run[11] < 0.8 * run[0], "bf16 LM {bf16}: {run:?}");
        losses.push(run);
    }
    // bf16 rounding moves the start little.
    assert!(
        (losses[1][0] - losses[0][0]).abs() < 0.02 * losses[0][0],
        "{losses:?}"
    );
}

/// fVLM's conversations (`tokenization.py`'s `tokenize_stage1` and `tokenize_sft`, run on
/// kiln-text's tiny Llama tokenizer and its chat template): the same ids, stage 1 scoring every
/// token, stage 2 the answer's.
#[test]
fn conversations_are_tokenised_as_fvlm_tokenises_them() {
    use kiln_foveated::{CaptionTokenizer, FVLM_CAPTION_PROMPT};

    let reference = Reference::open("release/references.safetensors");
    let lm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../kiln-text/tests/fixtures/llama"
    );
    let tokens = CaptionTokenizer::chat_from_lm_dir(lm, FVLM_CAPTION_PROMPT).unwrap();
    let caption = "A dog runs after a red ball, then drops it.";
    let ids = |key: &str| reference.table(key).remove(0);
    let as_ids = |ids: Vec<i64>| ids.into_iter().map(|id| id as u32).collect::<Vec<_>>();
    let stage1 = tokens.caption(caption).unwrap();
    assert_eq!(stage1, as_ids(ids("chat.stage1.ids")));
    assert!(ids("chat.stage1.loss_mask").iter().all(|&m| m == 1));
    let conversation = tokens.conversation(FVLM_CAPTION_PROMPT, caption).unwrap();
    assert_eq!(conversation.ids, as_ids(ids("chat.sft.ids")));
    let mask: Vec<i64> = conversation
        .answer_mask()
        .into_iter()
        .map(i64::from)
        .collect();
    assert_eq!(mask, ids("chat.sft.loss_mask"));
    assert!(tokens.prompt().is_empty());
    let plain = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/lm");
    assert!(CaptionTokenizer::chat_from_lm_dir(plain, FVLM_CAPTION_PROMPT).is_err());
}

/// Stage 3 on kiln-train: `PreferenceTraining` steps against a reference run on the inner
/// backend. The first step's loss is fVLM's (ln 2: the policy starts as the reference) with no
/// reward yet; AdamW steps on the pair then make the policy prefer the chosen answer, while the
/// reference's numbers stay as they were.
#[test]
fn dpo_training_steps_prefer_the_chosen_answer() {
    type Ad = Autodiff<Flex>;
    let _alone = one_at_a_time();
    let reference = references();
    let (chosen, rejected) = dpo_pair::<Ad>(&reference);
    let frozen = load::<Flex>(Readout::Deep, 0.0);
    let pair = PreferenceBatch::new(chosen, rejected, &frozen).unwrap();
    let before = pair.reference.chosen.clone().into_data();
    let mut training = PreferenceTraining {
        policy: load::<Ad>(Readout::Deep, 0.0),
    };
    // fVLM's stage-3 recipe at a rate a few steps can show (its own is 1e-6).
    let recipe = ReleaseRecipe {
        lr_connector: 1e-3,
        lr_dino: 1e-3,
        lr_llm: 1e-3,
        ..ReleaseRecipe::stage3_135m()
    };
    let config = recipe.train_config(8);
    let device = Default::default();
    let mut optimization = Optimization::fresh(&config, &training, &device);
    let mut reports = Vec::new();
    for step in 0..8 {
        let (trained, report) = optimization.step(training, step, || pair.clone()).unwrap();
        training = trained;
        reports.push(report);
    }
    let part =
        |report: &StepReport, name: &str| report.parts.iter().find(|(n, _)| n == name).unwrap().1;
    let theirs = reference.floats("dpo.loss").0[0] as f64;
    assert!(
        (reports[0].loss - theirs).abs() <= 1e-6,
        "{} vs {theirs}",
        reports[0].loss
    );
    assert!((theirs - std::f64::consts::LN_2).abs() <= 1e-6);
    assert!(part(&reports[0], "chosen_reward").abs() <= 1e-6);
    let last = reports.last().unwrap();
    assert!(
        last.loss < 0.6 * theirs,
        "the loss went from {theirs} to {}",
        last.loss
    );
    assert_eq!(part(last, "reward_accuracy"), 1.0);
    assert!(part(last, "chosen_reward") > part(last, "rejected_reward"));
    let again = PreferenceBatch::new(pair.chosen.clone(), pair.rejected.clone(), &frozen).unwrap();
    again.reference.chosen.into_data().assert_eq(&before, true);
}

/// fVLM's truncation (`tokenization.py`'s `truncation=True`): a clip's conversation keeps its
/// first 512 tokens in stage 1 and 1 024 after, a text-only one 1 024, the rest counted; where
/// the answer alone is scored, a conversation whose question fills them is refused by number.
#[test]
fn long_conversations_are_truncated_as_fvlm_truncates_them() {
    use kiln_foveated::{Caption, CaptionTokenizer, ReleaseStage};

    let lm = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../kiln-text/tests/fixtures/llama"
    );
    let long = vec!["square"; 1200].join(" ");
    let line = Caption {
        video: "clip".into(),
        caption: long.clone(),
        user: Some("hi".into()),
        source: None,
    };
    let tokens = |stage| (CaptionTokenizer::chat_from_lm_dir(lm, "").unwrap()).for_stage(stage);
    let whole = tokens(ReleaseStage::Alignment)
        .conversation("hi", &long)
        .unwrap();
    assert!(whole.ids.len() > 1200);
    for (stage, kept) in [
        (ReleaseStage::Alignment, 512),
        (ReleaseStage::Instruction, 1024),
    ] {
        let text = tokens(stage).clip_text(&line).unwrap();
        assert_eq!(text.ids, whole.ids[..kept], "{stage}");
        assert_eq!(text.cut, whole.ids.len() - kept);
        assert_eq!(text.answer_start, whole.answer_start);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.jsonl");
    let answer = format!("{{\"user\": \"hi\", \"assistant\": \"{long}\"}}\n");
    std::fs::write(&file, &answer).unwrap();
    let texts = tokens(ReleaseStage::Alignment)
        .read_text_samples(&file)
        .unwrap();
    assert_eq!(texts[0].ids, whole.ids[..1024]);
    let question = format!("{{\"user\": \"{long}\", \"assistant\": \"red\"}}\n");
    std::fs::write(&file, format!("{answer}{question}")).unwrap();
    assert_eq!(
        (tokens(ReleaseStage::Alignment).read_text_samples(&file))
            .map(|t| t.len())
            .unwrap(),
        2
    );
    let refused = tokens(ReleaseStage::Instruction).read_text_samples(&file);
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("text 2: its question fills the 1024 tokens fVLM's stage 2 keeps"),
        "{message}"
    );
}
