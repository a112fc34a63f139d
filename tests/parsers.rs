//! Parsers never panic, whatever their input (issue "hardening"): property tests over arbitrary
//! text and over valid inputs with random edits, for extxyz, `config.json` (vision towers,
//! PaiNN), `preprocessor_config.json`, precision policies, dropout specs and trial files. Each
//! either parses or returns an error; a panic fails the test.

use std::path::Path;

use kiln::forcefield::read_extxyz;
use kiln::mc::{Experiment, TrialStore};
use kiln::precision::PolicySpec;
use kiln::vision::{DropoutSites, VisionConfig};
use proptest::prelude::*;
use proptest::sample::Index;

mod common;

/// `valid` with up to eight characters replaced, inserted or removed at random places.
fn edited(valid: String) -> impl Strategy<Value = String> {
    prop::collection::vec((any::<Index>(), any::<char>(), 0..3u8), 0..8).prop_map(move |edits| {
        let mut chars: Vec<char> = valid.chars().collect();
        for (at, c, how) in edits {
            let i = at.index(chars.len() + 1);
            match how {
                0 if i < chars.len() => chars[i] = c,
                1 => chars.insert(i, c),
                _ if i < chars.len() => {
                    chars.remove(i);
                }
                _ => {}
            }
        }
        chars.into_iter().collect()
    })
}

/// Arbitrary text, or `valid` edited.
fn text_near(valid: String) -> impl Strategy<Value = String> {
    prop_oneof![".{0,300}", edited(valid)]
}

fn fixture(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn extxyz_never_panics(
        text in text_near(fixture(&common::forcefield_fixtures().join("structures.extxyz")))
    ) {
        let _ = read_extxyz(&text);
    }

    #[test]
    fn vision_configs_never_panic(
        text in text_near(fixture(&common::fixtures().join("clip_full/config.json")))
    ) {
        let _ = VisionConfig::from_hf_json(&text);
    }

    #[test]
    fn processor_configs_never_panic(
        text in text_near(fixture(&common::fixtures().join("clip_vision/preprocessor_config.json")))
    ) {
        let _ = kiln::cache::Preprocess::from_hf_json(&text);
    }

    #[test]
    fn policies_and_dropout_specs_never_panic(
        text in text_near("params=f32,compute=bf16,output=f32,accumulate=f64".into()),
        spec in text_near("attention_probs=0.1,mlp_hidden=0.2".into()),
    ) {
        let _ = text.parse::<PolicySpec>();
        let _ = spec.parse::<DropoutSites>();
    }
}

/// Trial files: a real one with a random byte flipped, or cut short and followed by junk, read
/// back through the store: an error or the very record saved (a flip in the header's padding
/// changes nothing), never a panic and never other numbers.
#[test]
fn trial_files_never_panic_and_damage_is_never_read_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let experiment = Experiment {
        models: vec!["m".into()],
        passes: vec![2],
        trials: 2,
        seed: 1,
        dropout: "0.1".into(),
        dataset: "d".into(),
        images: 1,
        weights: vec!["w".into()],
        precision: "full".into(),
    };
    let store = TrialStore::create_or_resume(dir.path(), &experiment).unwrap();
    let key = experiment.trial_keys()[0].clone();
    let stats =
        kiln::mc::EmbeddingStats::from_variances(2, vec![2], vec![1.0, 2.0], &[0.5, 0.25]).unwrap();
    let record = kiln::mc::TrialRecord {
        key: key.clone(),
        seed: 5,
        stats,
        timings: Default::default(),
    };
    store.save(&record, None).unwrap();
    let path = store.path_of(&key);
    let good = std::fs::read(&path).unwrap();
    let mut runner = proptest::test_runner::TestRunner::default();
    let damage = (
        any::<Index>(),
        1..=255u8,
        any::<Index>(),
        prop::collection::vec(any::<u8>(), 0..64),
    );
    runner
        .run(&damage, |(at, flip, cut, junk)| {
            let mut bad = good.clone();
            let at = at.index(bad.len());
            bad[at] ^= flip;
            std::fs::write(&path, &bad).unwrap();
            if let Ok(read) = store.load(&key) {
                prop_assert_eq!(&read, &record, "byte {} flipped", at);
            }
            let mut cut_short = good[..cut.index(good.len())].to_vec();
            cut_short.extend(&junk);
            std::fs::write(&path, &cut_short).unwrap();
            if let Ok(read) = store.load(&key) {
                prop_assert_eq!(&read, &record);
            }
            Ok(())
        })
        .unwrap();
}
