//! What the vision tests share: the fixture directory and transformers' reference tensors.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{FloatDType, Tensor, TensorData};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The f32 tensors of a reference file.
pub struct Reference(Vec<u8>);

impl Reference {
    pub fn open(name: &str) -> Self {
        Reference(std::fs::read(fixtures().join(format!("{name}.safetensors"))).unwrap())
    }

    pub fn get(&self, key: &str) -> (Vec<f32>, Vec<usize>) {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = tensors.tensor(key).unwrap();
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (values, view.shape().to_vec())
    }

    pub fn input(&self, key: &str) -> Tensor<Flex, 4> {
        let (values, shape) = self.get(key);
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }
}

/// max |ours − expected| / max |expected|.
pub fn relative(ours: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(ours.len(), expected.len());
    let worst = ours
        .iter()
        .zip(expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    worst / expected.iter().fold(0.0, |m: f32, v| m.max(v.abs()))
}

/// max |ours − reference| / max |reference| (ours in any float dtype).
pub fn relative_error<const D: usize>(
    ours: Tensor<Flex, D>,
    reference: &Reference,
    key: &str,
) -> f32 {
    let (expected, shape) = reference.get(key);
    assert_eq!(ours.dims().to_vec(), shape, "{key}");
    let ours: Vec<f32> = ours.cast(FloatDType::F32).into_data().to_vec().unwrap();
    relative(&ours, &expected)
}
