//! Bad input gets a clear error, never a panic: an unknown model type, a checkpoint missing
//! tensors, a prompt longer than the positions, token ids outside the vocabulary, empty prompts,
//! ragged batches.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_core::Policy;
use kiln_text::{CausalLm, GenerationConfig, KvCache, Sampling, TextInput, generate};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load(dir: &Path) -> Result<CausalLm<Flex>, kiln_text::TextError> {
    CausalLm::from_hf_dir(dir, &Default::default(), &Policy::full())
}

/// The llama fixture's files in a temporary directory, its config.json edited by `edit`.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("llama")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

#[test]
fn an_unknown_model_type_is_refused() {
    let dir = edited(|c| c["model_type"] = "mistral".into());
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model_type `mistral` is not supported"),
        "{err}"
    );
    assert!(err.contains("llama, qwen2"), "{err}");
}

#[test]
fn missing_tensors_are_named() {
    let dir = edited(|c| c["num_hidden_layers"] = 4.into());
    let err = load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.3.self_attn.q_proj.weight"),
        "{err}"
    );
    assert!(err.contains("model.layers.3.mlp.down_proj.weight"), "{err}");
}

#[test]
fn bad_prompts_are_refused() {
    let model = load(&fixture("llama")).unwrap();
    let err = |input| model.forward(input).unwrap_err().to_string();
    let long = TextInput::ids(vec![vec![5; 65]]);
    assert!(err(long).contains("max_position_embeddings = 64"));
    let vocab = model.config().vocab_size as u32;
    let outside = TextInput::ids(vec![vec![1, 2], vec![3, vocab]]);
    let message = err(outside);
    assert!(message.contains("sequence 2, token 2"), "{message}");
    assert!(message.contains("vocabulary size"), "{message}");
    assert!(err(TextInput::ids(vec![vec![]])).contains("empty prompt"));
    assert!(err(TextInput::ids(vec![vec![1, 2], vec![3]])).contains("pad them"));
    let padding_only = TextInput::ids(vec![vec![1, 2]]).with_attention_mask(vec![vec![false; 2]]);
    assert!(err(padding_only).contains("all padding"));
    let empty = generate(
        &model,
        &[vec![1], vec![]],
        &GenerationConfig::greedy(2),
        |_| {},
    );
    assert!(empty.unwrap_err().to_string().contains("prompt 2 is empty"));
    let mut hot = GenerationConfig::greedy(2);
    hot.sampling = Sampling::Sample {
        temperature: -1.0,
        top_p: 0.9,
        seed: 0,
    };
    assert!(generate(&model, &[vec![1]], &hot, |_| {}).is_err());
}

/// A refused input leaves the cache as it was: decoding goes on.
#[test]
fn a_refused_step_keeps_the_cache() {
    let model = load(&fixture("llama")).unwrap();
    let mut cache = KvCache::new();
    model
        .forward_cached(TextInput::ids(vec![vec![1, 2, 3]]), &mut cache)
        .unwrap();
    let vocab = model.config().vocab_size as u32;
    assert!(
        model
            .forward_cached(TextInput::ids(vec![vec![vocab]]), &mut cache)
            .is_err()
    );
    assert!(
        model
            .forward_cached(TextInput::ids(vec![vec![4], vec![5]]), &mut cache)
            .is_err()
    );
    assert_eq!(cache.len(), 3);
    model
        .forward_cached(TextInput::ids(vec![vec![4]]), &mut cache)
        .unwrap();
    assert_eq!(cache.len(), 4);
}

/// Logits that are NaN or infinite (here a final norm whose finite scale overflows f32) stop
/// generation with an error naming the token, never a silent empty continuation.
#[test]
fn non_finite_logits_are_an_error() {
    let dir = edited(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let huge: Vec<u8> = f32::MAX.to_le_bytes().repeat(48);
    let tensors: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            if name != "model.norm.weight" {
                return (name, view);
            }
            let view = safetensors::tensor::TensorView::new(view.dtype(), vec![48], &huge);
            (name, view.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(tensors, None, &path).unwrap();
    let model = load(dir.path()).unwrap();
    let err = generate(&model, &[vec![1, 5]], &GenerationConfig::greedy(3), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("new token 1 of prompt 1: ") && err.contains("NaN or infinite"),
        "{err}"
    );
}
