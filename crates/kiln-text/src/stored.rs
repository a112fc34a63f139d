//! A GGUF file's quantized matrices kept as the file stores them, or any model's matrices
//! rounded to bf16: read once into memory, their parameters left lazy (decoded to f32 only if
//! something asks for their values: a GPU backend, training, [`CausalLm::input_embeddings`]),
//! and the host products and the embedding lookup reading the kept matrices
//! ([`StoredWeights`]).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorData};
use kiln_core::gguf::{GgmlType, GgufFile, GgufTensor, dequantize_blocks};
use kiln_core::{Policy, Precision, is_host_backend, read_tensors, weight_files};
use kiln_kernels::gemm::is_mixed_bf16;
use kiln_kernels::gemm::quantized::{HALVES, QuantMatrix, STORED};
use kiln_kernels::host;
use kiln_transformer::StoredWeights;

use crate::TextError;
use crate::config::TextConfig;
use crate::gguf::{permuted_heads, stored_row_order, transformers_name};
use crate::llama::CausalLm;

/// How a model's weights are held once loaded.
///
/// The first two keep the projections' and the embeddings' matrices (those whose rows are whole
/// blocks of 32 values) in fewer bytes than f32, for the CPU's products under a policy with f32
/// parameters computing in f32 (or mixed bf16): decoding a token is bound by the bytes its
/// weights take. Every other tensor is f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weights {
    /// A GGUF file's matrices as it stores them: the quantized ones (Q8_0, Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q4_K, Q5_K, Q6_K) multiplied in their blocks, the activations quantized per block
    /// of 32 to 8 bits; F16 and BF16 ones multiplied with f32 activations, widened as they are
    /// read. Other types (Q2_K, Q3_K, F32) are decoded to f32.
    #[default]
    AsStored,
    /// The matrices rounded to bf16 (from whatever a file stores them in), multiplied with f32
    /// activations: half of f32's bytes, for a Hugging Face checkpoint too
    /// ([`CausalLm::from_hf_dir_with`]).
    Bf16,
    /// Every tensor in the policy's parameter dtype (decoded from a GGUF file's blocks as it is
    /// loaded).
    F32,
}

impl Weights {
    /// Its name on a command line (`as-stored`, `bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            Weights::AsStored => "as-stored",
            Weights::Bf16 => "bf16",
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
            "bf16" => Ok(Weights::Bf16),
            "f32" => Ok(Weights::F32),
            other => Err(format!("weights `{other}`: as-stored, bf16 or f32")),
        }
    }
}

/// Refuses a device or policy the products with kept matrices do not serve (for the model read
/// from `origin`).
pub(crate) fn check_kept_matrices_serve<B: Backend>(
    origin: &str,
    device: &B::Device,
    policy: &Policy,
) -> Result<(), TextError> {
    if !is_host_backend::<B>(device) {
        return Err(TextError::Config(format!(
            "{origin}: weights kept as stored or in bf16 are multiplied on the CPU; on {} \
             use f32 weights",
            B::name(device)
        )));
    }
    if policy.param != Precision::F32
        || !(policy.compute == Precision::F32 || is_mixed_bf16(policy))
    {
        return Err(TextError::Config(format!(
            "{origin}: weights kept as stored or in bf16 are multiplied with f32 activations: \
             use the full or mixed-bf16 policy, or f32 weights for this one",
        )));
    }
    Ok(())
}

/// Whether the model's parameter at `path` is a matrix kept as stored or in bf16: a
/// projection's, the output head's or the token embeddings'.
fn is_kept_matrix(path: &str) -> bool {
    path.ends_with("_proj.weight")
        || path == "lm_head.weight"
        || path == "model.embed_tokens.weight"
}

/// The tensors of `file` to keep as `weights` says (none for [`Weights::F32`]): the
/// projections' and embeddings' matrices, of the types multiplied as stored or, for
/// [`Weights::Bf16`], of any type. Refuses a device or policy their products do not serve.
pub(crate) fn kept_tensors<B: Backend>(
    file: &GgufFile,
    device: &B::Device,
    policy: &Policy,
    weights: Weights,
) -> Result<Vec<GgufTensor>, TextError> {
    if weights == Weights::F32 {
        return Ok(Vec::new());
    }
    check_kept_matrices_serve::<B>(&file.path().display().to_string(), device, policy)?;
    let kept_type = |kind| match weights {
        Weights::AsStored => STORED.contains(&kind) || HALVES.contains(&kind),
        _ => true,
    };
    Ok((file.tensors().iter())
        .filter(|tensor| {
            kept_type(tensor.kind)
                && tensor.shape.len() == 2
                && transformers_name(&tensor.name).is_some_and(|name| is_kept_matrix(&name))
        })
        .cloned()
        .collect())
}

/// The kept matrices, by the model's path to the parameter each stands for.
pub(crate) struct StoredMatrices(HashMap<String, Arc<QuantMatrix>>);

impl StoredMatrices {
    /// Each of `kept` (tensors of `file`) as `weights` says: its blocks, or its values rounded
    /// to bf16; a Llama's q and k rows put back in transformers' order.
    pub(crate) fn read(
        file: &GgufFile,
        config: &TextConfig,
        kept: &[GgufTensor],
        weights: Weights,
    ) -> Result<Self, TextError> {
        let mut matrices = HashMap::new();
        for tensor in kept {
            let name = transformers_name(&tensor.name).expect("kept tensors have a model name");
            let bytes = file.bytes(tensor)?.into_owned();
            let [rows, columns] = [tensor.shape[0], tensor.shape[1]];
            let in_tensor = |e: String| {
                TextError::Config(format!(
                    "{}: tensor `{}`: {e}",
                    file.path().display(),
                    tensor.name
                ))
            };
            let matrix = match weights {
                Weights::Bf16 if tensor.kind != GgmlType::BF16 => {
                    let values = dequantize_blocks(tensor.kind, &bytes).ok_or_else(|| {
                        in_tensor(format!("{} values are not decoded", tensor.kind.name()))
                    })?;
                    QuantMatrix::bf16(rows, columns, &values)
                }
                _ => QuantMatrix::new(tensor.kind, rows, columns, bytes).map_err(in_tensor)?,
            };
            let matrix = match permuted_heads(config, &name) {
                Some(heads) => matrix.with_rows_from(&stored_row_order(rows, heads)),
                None => matrix,
            };
            matrices.insert(name, Arc::new(matrix));
        }
        Ok(StoredMatrices(matrices))
    }

    /// The projections', output head's and token embeddings' matrices of the Hugging Face
    /// checkpoint `dir` (those `config` uses), each read alone and rounded to bf16 (bf16 ones kept
    /// as they are); with the names they have there.
    pub(crate) fn read_bf16(dir: &Path, config: &TextConfig) -> Result<Self, TextError> {
        let mut matrices = HashMap::new();
        for file in weight_files(dir)? {
            let wanted = |name: &str, shape: &[usize]| {
                let tied_head = config.tie_word_embeddings && name == "lm_head.weight";
                shape.len() == 2 && is_kept_matrix(name) && !tied_head
            };
            read_tensors(&file, wanted, |name, data| {
                let [rows, columns] = [data.shape[0], data.shape[1]];
                let matrix = match data.dtype {
                    DType::BF16 => {
                        QuantMatrix::new(GgmlType::BF16, rows, columns, data.bytes.to_vec())
                    }
                    _ => {
                        let values = data.convert::<f32>().into_vec::<f32>();
                        values
                            .map(|values| QuantMatrix::bf16(rows, columns, &values))
                            .map_err(|e| format!("{e:?}"))
                    }
                }
                .map_err(|e| {
                    TextError::Config(format!("{}: tensor `{name}`: {e}", file.display()))
                })?;
                matrices.insert(name, Arc::new(matrix));
                Ok::<_, TextError>(())
            })?;
        }
        Ok(StoredMatrices(matrices))
    }

    /// The names of the kept matrices.
    pub(crate) fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// `model` with each kept matrix's parameter made lazy and read as stored.
    pub(crate) fn put_into<B: Backend>(self, model: CausalLm<B>) -> CausalLm<B> {
        Keep::new(self.0).run(model)
    }
}

/// Replaces the kept matrices' parameters with lazy ones that decode the kept values if read.
struct Keep {
    /// The field names entered, innermost last.
    path: Vec<String>,
    /// The containers entered (`Struct:Linear`, …), innermost last.
    containers: Vec<String>,
    by_path: HashMap<String, Arc<QuantMatrix>>,
    by_id: HashMap<ParamId, Arc<QuantMatrix>>,
}

impl Keep {
    fn new(by_path: HashMap<String, Arc<QuantMatrix>>) -> Self {
        Keep {
            path: Vec::new(),
            containers: Vec::new(),
            by_path,
            by_id: HashMap::new(),
        }
    }

    /// `model` with the kept matrices read in place of their parameters.
    fn run<B: Backend>(mut self, model: CausalLm<B>) -> CausalLm<B> {
        let model = model.map(&mut self);
        model.with_stored(StoredWeights::new(self.by_id))
    }
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
        // burn's Linear holds its weight as [in, out], the transpose of the file's [out, in].
        let linear = self.containers.last().is_some_and(|c| c == "Struct:Linear");
        let Some(matrix) = self.by_path.get(&self.path.join(".")).cloned() else {
            return param;
        };
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
