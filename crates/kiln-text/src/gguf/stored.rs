//! A GGUF file's quantized matrices kept as the file stores them: read once into memory, their
//! parameters left lazy (decoded to f32 only if something asks for their values: a GPU backend,
//! training, [`CausalLm::input_embeddings`]), and the host products and the embedding lookup
//! reading the blocks ([`StoredWeights`]).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor, TensorData};
use kiln_core::gguf::{GgufFile, GgufTensor};
use kiln_core::{Policy, Precision, is_host_backend};
use kiln_kernels::gemm::is_mixed_bf16;
use kiln_kernels::gemm::quantized::{QuantMatrix, STORED};
use kiln_kernels::host;
use kiln_transformer::StoredWeights;

use super::{permuted_heads, stored_row_order, transformers_name};
use crate::TextError;
use crate::config::TextConfig;
use crate::llama::CausalLm;

/// How a GGUF file's weights are held once loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weights {
    /// The projections' and the embeddings' quantized matrices (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q4_K, Q5_K, Q6_K) kept in their blocks and multiplied as stored, the activations
    /// quantized per block of 32 to 8 bits, on the CPU under a policy that computes in f32 (or
    /// mixed bf16); every other tensor decoded to f32.
    #[default]
    AsStored,
    /// Every tensor decoded to the policy's parameter dtype as it is loaded.
    F32,
}

impl Weights {
    /// Its name on a command line (`as-stored`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            Weights::AsStored => "as-stored",
            Weights::F32 => "f32",
        }
    }
}

impl fmt::Display for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Weights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "as-stored" => Ok(Weights::AsStored),
            "f32" => Ok(Weights::F32),
            other => Err(format!("weights `{other}`: as-stored or f32")),
        }
    }
}

/// The tensors of `file` to keep as stored: the projections' and embeddings' matrices of the
/// types multiplied as stored. Refuses a device or policy the stored products do not serve.
pub(super) fn kept_tensors<B: Backend>(
    file: &GgufFile,
    device: &B::Device,
    policy: &Policy,
) -> Result<Vec<GgufTensor>, TextError> {
    if !is_host_backend::<B>(device) {
        return Err(TextError::Config(format!(
            "{}: weights as stored are multiplied on the CPU; on {} decode them (weights f32)",
            file.path().display(),
            B::name(device)
        )));
    }
    if policy.param != Precision::F32
        || !(policy.compute == Precision::F32 || is_mixed_bf16(policy))
    {
        return Err(TextError::Config(format!(
            "{}: weights as stored are multiplied with f32 activations: use the full or \
             mixed-bf16 policy, or decode the weights (weights f32) for this one",
            file.path().display()
        )));
    }
    Ok((file.tensors().iter())
        .filter(|tensor| STORED.contains(&tensor.kind) && tensor.shape.len() == 2)
        .filter(|tensor| {
            transformers_name(&tensor.name).is_some_and(|name| {
                name.ends_with("_proj.weight")
                    || name == "lm_head.weight"
                    || name == "model.embed_tokens.weight"
            })
        })
        .cloned()
        .collect())
}

/// The kept matrices, by the model's path to the parameter each stands for.
pub(super) struct StoredMatrices(HashMap<String, Arc<QuantMatrix>>);

impl StoredMatrices {
    /// The blocks of each of `kept` (tensors of `file`), a Llama's q and k rows put back in
    /// transformers' order.
    pub(super) fn read(
        file: &GgufFile,
        config: &TextConfig,
        kept: &[GgufTensor],
    ) -> Result<Self, TextError> {
        let mut matrices = HashMap::new();
        for tensor in kept {
            let name = transformers_name(&tensor.name).expect("kept tensors have a model name");
            let bytes = file.bytes(tensor)?.into_owned();
            let [rows, columns] = [tensor.shape[0], tensor.shape[1]];
            let matrix = QuantMatrix::new(tensor.kind, rows, columns, bytes).map_err(|e| {
                TextError::Config(format!(
                    "{}: tensor `{}`: {e}",
                    file.path().display(),
                    tensor.name
                ))
            })?;
            let matrix = match permuted_heads(config, &name) {
                Some(heads) => matrix.with_rows_from(&stored_row_order(rows, heads)),
                None => matrix,
            };
            matrices.insert(name, Arc::new(matrix));
        }
        Ok(StoredMatrices(matrices))
    }

    /// `model` with each kept matrix's parameter made lazy and read as stored.
    pub(super) fn put_into<B: Backend>(self, model: CausalLm<B>) -> CausalLm<B> {
        let mut keep = Keep {
            path: Vec::new(),
            containers: Vec::new(),
            by_path: self.0,
            by_id: HashMap::new(),
        };
        let model = model.map(&mut keep);
        model.with_stored(StoredWeights::new(keep.by_id))
    }
}

/// Replaces the kept matrices' parameters with lazy ones that decode the blocks if read.
struct Keep {
    /// The field names entered, innermost last.
    path: Vec<String>,
    /// The containers entered (`Struct:Linear`, …), innermost last.
    containers: Vec<String>,
    by_path: HashMap<String, Arc<QuantMatrix>>,
    by_id: HashMap<ParamId, Arc<QuantMatrix>>,
}

impl<B: Backend> ModuleMapper<B> for Keep {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.push(name.to_string());
        self.containers.push(container_type.to_string());
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
        self.containers.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(matrix) = self.by_path.get(&self.path.join(".")) else {
            return param;
        };
        // burn's Linear holds its weight as [in, out], the transpose of the file's [out, in].
        let linear = self.containers.last().is_some_and(|c| c == "Struct:Linear");
        let [rows, columns] = [matrix.rows(), matrix.columns()];
        let shape = if linear {
            [columns, rows]
        } else {
            [rows, columns]
        };
        let decode = matrix.clone();
        let init = move |device: &B::Device, _: bool| {
            let values = decode.dequantize();
            let values = match linear {
                true => host::transposed(&values, rows, columns),
                false => values,
            };
            Tensor::<B, D>::from_data(TensorData::new(values, shape), device)
        };
        self.by_id.insert(param.id, matrix.clone());
        Param::uninitialized(
            param.id,
            init,
            param.lazy_device(),
            false,
            Shape::from(shape),
        )
    }
}
