//! The fuzz harness: one function per cargo-fuzz target, each feeding arbitrary bytes to a parser
//! that reads files users hand kiln. Any outcome but a panic, an abort or a hang is a pass. The
//! targets in `fuzz_targets/` call these; the root package's `tests/integration/parsers.rs` includes this file
//! and replays `corpus/` through them in every `cargo test`.

use std::path::PathBuf;
use std::sync::OnceLock;

use kiln::mc::{Experiment, TrialKey, TrialStore};

/// Cutoff of the neighbour lists built from parsed structures (Å, a typical PaiNN value).
const CUTOFF: f64 = 5.0;
/// Structures up to this many atoms also get a neighbour list (larger ones only cost time).
const NEIGHBOR_ATOMS: usize = 64;

/// extxyz text: parsed, each frame validated and its training labels read (energy, forces and
/// stress under ASE's names), and the small valid ones given a neighbour list (which must
/// refuse a cell too small for the cutoff rather than allocate without bound).
pub fn extxyz(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(frames) = kiln::forcefield::read_extxyz(text) else {
        return;
    };
    let labels = kiln::forcefield::LabelKeys {
        stress: Some("stress".into()),
        ..Default::default()
    };
    for (i, frame) in frames.iter().enumerate() {
        let _ = labels.read(frame, i);
        if frame.validate(i, 118).is_ok() && frame.structure.len() <= NEIGHBOR_ATOMS {
            let _ = kiln::forcefield::neighbor_list(&frame.structure, CUTOFF);
        }
    }
}

/// An image-cache `manifest.json`.
pub fn cache_manifest(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln::cache::Manifest::from_json(text);
    }
}

/// A store holding one experiment, and the key whose file the trial harness overwrites.
struct TrialFixture {
    _dir: tempfile::TempDir,
    store: TrialStore,
    key: TrialKey,
}

/// The experiment the trial-file corpus was written for (its files carry this key).
pub fn trial_experiment() -> Experiment {
    Experiment {
        models: vec!["m".into()],
        passes: vec![2],
        trials: 1,
        seed: 1,
        dropout: "0.1".into(),
        dataset: "d".into(),
        images: 2,
        weights: vec!["w".into()],
        precision: "full".into(),
    }
}

fn trial_fixture() -> &'static TrialFixture {
    static FIXTURE: OnceLock<TrialFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let experiment = trial_experiment();
        let store = TrialStore::create_or_resume(dir.path(), &experiment).expect("a new store");
        let key = experiment.trial_keys().remove(0);
        TrialFixture {
            _dir: dir,
            store,
            key,
        }
    })
}

/// Where the trial harness reads its file from (to write seeds for the corpus).
pub fn trial_path() -> PathBuf {
    let fixture = trial_fixture();
    fixture.store.path_of(&fixture.key)
}

/// A trial file, read back through the results store.
pub fn trial_file(data: &[u8]) {
    let fixture = trial_fixture();
    if std::fs::write(trial_path(), data).is_ok() {
        let _ = fixture.store.load(&fixture.key);
    }
}

/// Configuration text: a vision `config.json`, a `preprocessor_config.json`, a PaiNN
/// `config.json`, and the flag values that name precision policies, dtypes, devices and dropout
/// sites. Every parser reads every input.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = kiln::vision::VisionConfig::from_hf_json(text);
    let _ = kiln::cache::Preprocess::from_hf_json(text);
    if let Ok(painn) = serde_json::from_str::<kiln::forcefield::PainnConfig>(text) {
        let _ = painn.validate();
    }
    let _ = text.parse::<kiln::core::PolicySpec>();
    let _ = text.parse::<kiln::core::DtypeSpec>();
    let _ = text.parse::<kiln::core::DeviceSpec>();
    let _ = text.parse::<kiln::vision::DropoutSites>();
    let _ = text.parse::<kiln::cache::Residency>();
}

/// A GGUF file: parsed, every metadata value looked at (arrays are held as compactly as the
/// input, so they are bounded by it), every tensor dequantized (its bytes lie inside the input
/// and no two overlap, so the floats are bounded by it), a language model's configuration and
/// tokenizer read from its metadata, and its chat template rendered (within its budget).
pub fn gguf(data: &[u8]) {
    let Ok(file) = kiln::core::gguf::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for (_, value) in file.metadata() {
        let _ = (value.as_u64(), value.as_f64(), value.as_str());
        if let Some(array) = value.as_array() {
            let _ = (
                array.len(),
                array.integers(),
                array.arrays().map(<[_]>::len),
            );
            let _ = array.strings().map(|strings| strings.iter().count());
        }
    }
    for tensor in file.tensors() {
        let _ = file.dequantize(tensor);
    }
    let _ = kiln::text::TextConfig::from_gguf(&file);
    if let Ok(tokenizer) = kiln::text::TextTokenizer::from_gguf(&file) {
        let chat = [kiln::text::Message::new("user", "Hi!")];
        let _ = tokenizer.apply_chat_template(&chat, true);
    }
}

/// A harness: arbitrary bytes in, any outcome but a panic.
pub type Harness = fn(&[u8]);

/// The targets by name, as `corpus/` names its directories.
pub const TARGETS: [(&str, Harness); 5] = [
    ("extxyz", extxyz),
    ("cache_manifest", cache_manifest),
    ("trial_file", trial_file),
    ("config", config),
    ("gguf", gguf),
];
