//! Parsers never panic, whatever their input (issue "hardening"): property tests over arbitrary
//! text and over valid inputs with random edits, for extxyz, `config.json` (vision towers,
//! PaiNN), `preprocessor_config.json`, precision policies, dropout specs and trial files. Each
//! either parses or returns an error; a panic fails the test. Configs of every family (vision
//! towers, language models, PaiNN) also get structured mutations — one numeric setting set to
//! zero, a negative, a tiny or a huge value — and a norm epsilon or RoPE base outside its
//! domain must be refused naming the setting. The cargo-fuzz corpus
//! (`fuzz/corpus/`) is replayed here through the fuzz targets' own harness, so CI needs no nightly.

use std::path::{Path, PathBuf};

use kiln::core::PolicySpec;
use kiln::forcefield::read_extxyz;
use kiln::mc::TrialStore;
use kiln::vision::{DropoutSites, VisionConfig};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::common;
#[path = "../../fuzz/src/lib.rs"]
mod fuzz_harness;

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

/// The dotted paths of every number in `value`.
fn numbers(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                numbers(v, &path, out);
            }
        }
        serde_json::Value::Number(_) => out.push(prefix.to_string()),
        _ => {}
    }
}

/// The values a mutation sets a number to.
const MUTATIONS: [f64; 8] = [0.0, -1.0, -0.5, 1e-12, 3.7, 1e9, 1e300, 9.2e18];

/// `valid` (a JSON config) with one of its numbers set to one of [`MUTATIONS`]: the text, the
/// setting's dotted path and the value.
fn mutated(valid: String) -> impl Strategy<Value = (String, String, f64)> {
    let value: serde_json::Value = serde_json::from_str(&valid).unwrap();
    let mut paths = Vec::new();
    numbers(&value, "", &mut paths);
    (any::<Index>(), 0..MUTATIONS.len()).prop_map(move |(at, m)| {
        let path = &paths[at.index(paths.len())];
        let mut value = value.clone();
        let mut place = &mut value;
        for key in path.split('.') {
            place = &mut place[key];
        }
        let new = MUTATIONS[m];
        *place = if new.fract() == 0.0 && new.abs() < 9e15 {
            serde_json::json!(new as i64)
        } else {
            serde_json::json!(new)
        };
        (value.to_string(), path.clone(), new)
    })
}

/// A norm epsilon or RoPE base the model reads, set ≤ 0, is refused naming it.
fn domain_named<E: std::fmt::Display>(
    parsed: Result<(), E>,
    path: &str,
    value: f64,
) -> Result<(), TestCaseError> {
    let guarded = [
        "rms_norm_eps",
        "layer_norm_eps",
        "vision_config.layer_norm_eps",
        "rope_theta",
        "rope_parameters.rope_theta",
    ];
    let key = path.rsplit('.').next().unwrap_or(path);
    if guarded.contains(&path) && value <= 0.0 {
        match parsed {
            Ok(()) => prop_assert!(false, "{key} = {value} accepted"),
            Err(e) => prop_assert!(e.to_string().contains(key), "{key} = {value}: {e}"),
        }
    }
    Ok(())
}

fn fixture(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn text_fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-text/tests/fixtures")
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
    fn vision_configs_of_every_family_refuse_settings_out_of_their_domain(
        (text, key, value) in prop_oneof![
            mutated(fixture(&common::fixtures().join("clip_full/config.json"))),
            mutated(fixture(&common::fixtures().join("siglip_full/config.json"))),
            mutated(fixture(&common::fixtures().join("dinov2/config.json"))),
        ]
    ) {
        domain_named(VisionConfig::from_hf_json(&text).map(drop), &key, value)?;
    }

    #[test]
    fn text_configs_of_every_family_refuse_settings_out_of_their_domain(
        (text, key, value) in prop_oneof![
            mutated(fixture(&text_fixtures().join("llama/config.json"))),
            mutated(fixture(&text_fixtures().join("qwen2/config.json"))),
        ]
    ) {
        domain_named(kiln::text::TextConfig::from_hf_json(&text).map(drop), &key, value)?;
    }

    #[test]
    fn painn_configs_never_panic(
        (text, _key, _value) in mutated(fixture(
            &common::forcefield_fixtures().join("painn_gaussian/config.json")
        ))
    ) {
        if let Ok(config) = serde_json::from_str::<kiln::forcefield::PainnConfig>(&text) {
            let _ = config.validate();
        }
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

/// A copy of the checkpoint directory `from` with `config` as its `config.json`.
fn with_config(from: &Path, config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    dir
}

/// A load from a config whose setting `key` was set to `value` either succeeds (the mutation
/// left every tensor's shape alone) or is refused naming the setting or the tensors it
/// mis-sizes. That the test process lives on shows nothing was allocated for the sizes asked:
/// the sizes are checked against the checkpoint's headers and stated limits first.
fn loads_or_names<T, E: std::fmt::Display>(
    loaded: Result<T, E>,
    key: &str,
    value: f64,
) -> Result<(), TestCaseError> {
    if let Err(e) = loaded {
        let e = e.to_string();
        let leaf = key.rsplit('.').next().unwrap_or(key);
        let named = e.contains(leaf)
            || e.contains("the checkpoint has")
            || e.contains("not in the checkpoint");
        prop_assert!(named, "{key} = {value}: {e}");
    }
    Ok(())
}

/// A fixture checkpoint of each family (text, vision, force field) and how it is loaded.
type Load = fn(&Path) -> Result<(), String>;

fn checkpoints() -> [(PathBuf, Load); 3] {
    use kiln::burn::backend::Flex;
    use kiln::core::Policy;
    [
        (text_fixtures().join("llama"), |dir| {
            kiln::text::CausalLm::<Flex>::from_hf_dir(dir, &Default::default(), &Policy::full())
                .map(drop)
                .map_err(|e| e.to_string())
        }),
        (common::fixtures().join("dinov2"), |dir| {
            kiln::vision::VisionModel::<Flex>::from_hf_dir(
                dir,
                &Default::default(),
                &Policy::full(),
            )
            .map(drop)
            .map_err(|e| e.to_string())
        }),
        (
            common::forcefield_fixtures().join("painn_gaussian"),
            |dir| {
                kiln::forcefield::Painn::<Flex>::from_dir(dir, &Default::default())
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn checkpoints_of_every_family_take_only_configs_they_fit(
        (family, (text, key, value)) in prop_oneof![
            mutated(fixture(&checkpoints()[0].0.join("config.json"))).prop_map(|m| (0, m)),
            mutated(fixture(&checkpoints()[1].0.join("config.json"))).prop_map(|m| (1, m)),
            mutated(fixture(&checkpoints()[2].0.join("config.json"))).prop_map(|m| (2, m)),
        ]
    ) {
        let (source, load) = &checkpoints()[family];
        let dir = with_config(source, &text);
        loads_or_names(load(dir.path()), &key, value)?;
    }
}

/// Trial files: a real one with a random byte flipped, or cut short and followed by junk, read
/// back through the store: an error or the very record saved (a flip in the header's padding
/// changes nothing), never a panic and never other numbers.
#[test]
fn trial_files_never_panic_and_damage_is_never_read_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let (store, record, good) = saved_trial(dir.path());
    let (key, path) = (record.key.clone(), store.path_of(&record.key));
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

fn corpus_dir(target: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Every committed fuzz input through its target's harness: none may panic (a panic names the
/// file). Each target has a corpus, so a lost directory fails too.
#[test]
fn fuzz_corpus_replays_without_panics() {
    for (target, harness) in fuzz_harness::TARGETS {
        let mut inputs: Vec<_> = std::fs::read_dir(corpus_dir(target))
            .unwrap_or_else(|e| panic!("fuzz/corpus/{target}: {e}"))
            .map(|entry| entry.unwrap().path())
            .collect();
        inputs.sort();
        assert!(
            inputs.len() >= 3,
            "fuzz/corpus/{target} holds {} inputs",
            inputs.len()
        );
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            let outcome = std::panic::catch_unwind(|| harness(&data));
            assert!(outcome.is_ok(), "{target} panicked on {}", input.display());
        }
    }
}

/// Writes the corpus's seeds: valid files of every kind, and the damaged ones the hostile-input
/// tests use. Run after a file format changes (`cargo test --test parsers -- --ignored`); fuzzing
/// adds the rest.
#[test]
#[ignore = "writes fuzz/corpus seeds"]
fn write_fuzz_seeds() {
    let write = |target: &str, name: &str, data: &[u8]| {
        std::fs::create_dir_all(corpus_dir(target)).unwrap();
        std::fs::write(corpus_dir(target).join(name), data).unwrap();
    };
    let extxyz = std::fs::read(common::forcefield_fixtures().join("structures.extxyz")).unwrap();
    write("extxyz", "seed-fixture", &extxyz);
    write("extxyz", "seed-truncated", &extxyz[..extxyz.len() / 2]);
    write(
        "extxyz",
        "seed-tiny-cell",
        b"1\nLattice=\"0.01 0 0 0 0.01 0 0 0 0.01\" pbc=\"T T T\" \
          Properties=species:S:1:pos:R:3\nH 0 0 0\n",
    );
    write(
        "extxyz",
        "seed-count-too-large",
        b"5\nProperties=species:S:1:pos:R:3\nH 0 0 0\n",
    );

    for (dir, files) in [
        (
            "clip_full",
            &["config.json", "preprocessor_config.json"][..],
        ),
        ("siglip_full", &["config.json", "preprocessor_config.json"]),
        ("dinov2", &["config.json", "preprocessor_config.json"]),
        ("siglip2_naflex", &["config.json"]),
    ] {
        for file in files {
            let text = std::fs::read(common::fixtures().join(dir).join(file)).unwrap();
            write("config", &format!("seed-{dir}-{file}"), &text);
        }
    }
    let painn = common::forcefield_fixtures().join("painn_gaussian/config.json");
    write(
        "config",
        "seed-painn-config.json",
        &std::fs::read(painn).unwrap(),
    );
    for (name, text) in [
        (
            "policy",
            "params=f32,compute=bf16,output=f32,accumulate=f64",
        ),
        ("preset", "mixed-f16"),
        ("device", "cuda:18446744073709551616"),
        ("dropout", "attention_probs=0.1,mlp_hidden=0.2"),
    ] {
        write("config", &format!("seed-{name}"), text.as_bytes());
    }

    // kiln-core's GGUF fixture (every dequantized type, every value type), cut short, with
    // its first tensor's type and offset made impossible.
    let gguf = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/kiln-core/tests/fixtures/gguf/quants.gguf"),
    )
    .unwrap();
    write("gguf", "seed-fixture", &gguf);
    write("gguf", "seed-cut", &gguf[..gguf.len() / 3]);
    let mut header = gguf[..1216].to_vec();
    header[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    write("gguf", "seed-tensor-count", &header);
    let model = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/kiln-text/tests/fixtures/gguf/qwen2.gguf"),
    )
    .unwrap();
    write("gguf", "seed-model", &model);
    write("gguf", "seed-model-cut", &model[..model.len() / 2]);

    // A trial file of the harness's experiment, whole, cut short and with a byte flipped.
    let dir = tempfile::tempdir().unwrap();
    let (_, _, good) = saved_trial(dir.path());
    write("trial_file", "seed-whole", &good);
    write("trial_file", "seed-cut", &good[..good.len() - 9]);
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    write("trial_file", "seed-flipped", &flipped);

    // A real manifest, and ones that claim impossible sizes or files outside the entry.
    let images = tempfile::tempdir().unwrap();
    image::RgbImage::from_fn(9, 7, |x, y| image::Rgb([x as u8 * 20, y as u8 * 30, 100]))
        .save(images.path().join("a.png"))
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    kiln::cache::ImageCache::new(cache.path())
        .load(
            &kiln::cache::ImageSource::Folder(images.path().into()),
            &kiln::cache::Preprocess::siglip(8),
        )
        .unwrap();
    let manifest = walk(cache.path())
        .into_iter()
        .find(|p| p.ends_with("manifest.json"))
        .expect("the entry's manifest");
    let text = std::fs::read_to_string(manifest).unwrap();
    write("cache_manifest", "seed-whole", text.as_bytes());
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["frames"] = 4_000_000_000u32.into();
    value["height"] = 4_000_000_000u32.into();
    write(
        "cache_manifest",
        "seed-huge-items",
        value.to_string().as_bytes(),
    );
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["shards"][0]["file"] = "../../etc/passwd".into();
    write(
        "cache_manifest",
        "seed-outside",
        value.to_string().as_bytes(),
    );
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["shards"][0]["items"] = u64::MAX.into();
    write(
        "cache_manifest",
        "seed-items-overflow",
        value.to_string().as_bytes(),
    );
}

/// A store in `dir` for the fuzz harness's experiment, holding one saved trial of two images:
/// the store, the record and the file's bytes.
fn saved_trial(dir: &Path) -> (TrialStore, kiln::mc::TrialRecord, Vec<u8>) {
    let experiment = fuzz_harness::trial_experiment();
    let store = TrialStore::create_or_resume(dir, &experiment).unwrap();
    let stats = kiln::mc::EmbeddingStats::from_variances(
        2,
        vec![2, 2],
        vec![1.0, 2.0, -0.5, 0.25],
        &[0.5, 0.25, 1.0, 2.0],
    )
    .unwrap();
    let record = kiln::mc::TrialRecord {
        key: experiment.trial_keys()[0].clone(),
        seed: 5,
        stats,
        timings: Default::default(),
    };
    store.save(&record, None).unwrap();
    let bytes = std::fs::read(store.path_of(&record.key)).unwrap();
    (store, record, bytes)
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}
