//! What the parity tests share: the fixtures, their reference tensors and the tolerance check.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_core::Policy;
use kiln_foveated::{FoveatedConfig, FoveatedModel};

/// The tests that run a backward pass or a training step take turns. The backend's generator is
/// global, and kiln-train reseeds it every step, so a training test starts from the same weights
/// and trains the same way only alone. And two backward passes at once can deadlock: burn's
/// autodiff holds its graph lock through a backward whose host operations wait on rayon, while a
/// rayon worker, idle inside that wait, steals another test's training step (kiln-train runs
/// steps on rayon's threads) and blocks on the same lock in its own backward.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A model of `config` on the tiny DINOv2 and LM fixtures, its connectors newly initialised.
pub fn tiny_model<B: Backend>(config: FoveatedConfig) -> FoveatedModel<B> {
    let dir = fixtures();
    let (dino, lm) = (dir.join("dino"), dir.join("lm"));
    FoveatedModel::<B>::from_dirs(dino, lm, config, &Default::default(), &Policy::full()).unwrap()
}

/// The PyTorch implementation's tensors.
pub struct Reference(Vec<u8>);

impl Reference {
    /// The tensors of `name` under the fixtures.
    pub fn open(name: &str) -> Self {
        Self::open_path(&fixtures().join(name))
    }

    /// The tensors of the safetensors file `path`.
    pub fn open_path(path: &Path) -> Self {
        Reference(std::fs::read(path).unwrap())
    }

    /// The names that start with `prefix`, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let mut keys: Vec<String> = (tensors.names().into_iter())
            .filter(|name| name.starts_with(prefix))
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    }

    pub fn bytes(&self, key: &str) -> (Vec<u8>, Vec<usize>) {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = tensors.tensor(key).unwrap();
        (view.data().to_vec(), view.shape().to_vec())
    }

    pub fn floats(&self, key: &str) -> (Vec<f32>, Vec<usize>) {
        let (bytes, shape) = self.bytes(key);
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (values, shape)
    }

    pub fn tensor<B: Backend, const D: usize>(&self, key: &str) -> Tensor<B, D> {
        let (values, shape) = self.floats(key);
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }

    /// f64 values and their shape.
    #[cfg(feature = "train")]
    pub fn doubles(&self, key: &str) -> (Vec<f64>, Vec<usize>) {
        let (bytes, shape) = self.bytes(key);
        let values = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (values, shape)
    }

    /// A u8 table `[rows][columns]`, widened.
    pub fn table_u8(&self, key: &str) -> Vec<Vec<i64>> {
        let (bytes, shape) = self.bytes(key);
        let values: Vec<i64> = bytes.into_iter().map(i64::from).collect();
        values.chunks(shape[1]).map(<[i64]>::to_vec).collect()
    }

    /// An i64 table `[rows][columns]`.
    pub fn table(&self, key: &str) -> Vec<Vec<i64>> {
        let (bytes, shape) = self.bytes(key);
        let values: Vec<i64> = bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        values.chunks(shape[1]).map(<[i64]>::to_vec).collect()
    }

    /// The file's metadata entry `key`.
    #[cfg(feature = "train")]
    pub fn metadata(&self, key: &str) -> String {
        let (_, metadata) = safetensors::SafeTensors::read_metadata(&self.0).unwrap();
        let entries = metadata.metadata().as_ref().expect("metadata");
        entries
            .get(key)
            .unwrap_or_else(|| panic!("no {key}"))
            .clone()
    }

    pub fn ids(&self, key: &str) -> Vec<Vec<u32>> {
        let to_ids = |row: Vec<i64>| row.into_iter().map(|id| id as u32).collect();
        self.table(key).into_iter().map(to_ids).collect()
    }
}

/// max |ours − theirs| / max |theirs|, after checking the shapes agree.
pub fn relative_error<B: Backend, const D: usize>(
    ours: Tensor<B, D>,
    theirs: &Reference,
    key: &str,
) -> f32 {
    let shape = ours.dims().to_vec();
    let ours = ours.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    relative_error_of((ours, shape), theirs.floats(key), key)
}

/// max |ours − theirs| / max |theirs| of two `(values, shape)`, after checking the shapes agree.
pub fn relative_error_of(
    (ours, our_shape): (Vec<f32>, Vec<usize>),
    (theirs, shape): (Vec<f32>, Vec<usize>),
    key: &str,
) -> f32 {
    assert_eq!(our_shape, shape, "{key}: shapes");
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let scale = theirs.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(scale > 0.0, "{key}: an all-zero reference proves nothing");
    worst / scale
}

pub fn assert_close<B: Backend, const D: usize>(ours: Tensor<B, D>, theirs: &Reference, key: &str) {
    let error = relative_error(ours, theirs, key);
    assert!(error <= 1e-4, "{key}: relative error {error:.2e}");
}
