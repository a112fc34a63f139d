//! Projection weights as the host products read them, prepared once per weight rather than once
//! per forward.
//!
//! A host product reads its weight packed into column panels ([`sgemm`]) or row-major (the
//! `gemm` crate), with self-attention's q, k and v side by side, LayerScale folded into the
//! columns and the patch kernel transposed. Making that from burn's tensors copied every weight
//! once or twice per forward: about 1 GB of memory traffic per CLIP-B/32 batch, 5–10% of its
//! forward at b = 32. A tower keeps what its forwards prepared in a [`PreparedWeights`], keyed by
//! the parameter and checked against the storage it was read from: a weight that changes (an
//! optimiser step, a load, a cast) is prepared anew, never served stale.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use burn::module::{Param, ParamId};
use burn::nn::Linear;
use burn::nn::conv::{Conv2d, ConvTranspose2d};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::{HostValues, StorageKey};

use kiln_kernels::gemm::quantized::QuantMatrix;
use kiln_kernels::gemm::sgemm;
use kiln_kernels::gemm::strided::View;
use kiln_kernels::gemm::{Products, bf16};
use kiln_kernels::host;
use kiln_kernels::host::winograd::{F2X2, F2X3, Minimal, Phase};

/// A projection's weight `[in, out]` and bias `[out]` as the host product reads them.
#[derive(Debug)]
pub struct HostWeight {
    /// The weight `[in, out]`.
    pub operand: Operand,
    /// The bias `[out]` (zeros for a projection without one).
    pub bias: Vec<f32>,
}

/// The weight itself.
#[derive(Debug)]
pub enum Operand {
    /// In [`sgemm`]'s column panels, where the CPU runs it.
    Packed(sgemm::Packed),
    /// Rounded to bf16 in [`bf16`]'s pair-row panels: a pass whose products read bf16 operands
    /// (the mixed-bf16 policy on a CPU with AMX or AVX512-BF16).
    Bf16(bf16::Packed),
    /// Row-major `[in, out]`, for the `gemm` crate.
    RowMajor(Vec<f32>),
    /// Where the parameters hold it, copied nowhere ([`PreparedWeights::in_place`]): row-major
    /// `[in, columns]` blocks whose columns lie side by side, for the `gemm` crate.
    InPlace(Vec<(HostValues, usize)>),
    /// A parameter `[out, in]` read in place as the weight `[in, out]` (its transpose).
    InPlaceTransposed(HostValues),
    /// Matrices `[out, in]` kept in a GGUF file's quantized blocks ([`StoredWeights`]), their
    /// outputs side by side, for [`kiln_kernels::gemm::quantized`]'s products.
    Quantized(Vec<Arc<QuantMatrix>>),
}

/// Weights kept as a GGUF file stores them, by the parameter that stands for each: a model
/// loaded with its quantized weights as stored holds these instead of f32 values, and its host
/// products read them ([`Operand::Quantized`]). The parameter stays lazy: decoded to f32 only
/// if something else reads it (a GPU backend, training).
#[derive(Debug, Clone, Default)]
pub struct StoredWeights(Arc<HashMap<ParamId, Arc<QuantMatrix>>>);

impl StoredWeights {
    /// The matrices, each under the parameter that stands for it.
    pub fn new(matrices: HashMap<ParamId, Arc<QuantMatrix>>) -> Self {
        StoredWeights(Arc::new(matrices))
    }

    /// The matrix parameter `id` stands for.
    pub fn get(&self, id: ParamId) -> Option<&Arc<QuantMatrix>> {
        self.0.get(&id)
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes they hold.
    pub fn stored_bytes(&self) -> usize {
        self.0.values().map(|m| m.stored_bytes()).sum()
    }

    /// How many matrices each type holds, by the type's name (`Q4_1`, `BF16`, …).
    pub fn types(&self) -> BTreeMap<&'static str, usize> {
        let mut types = BTreeMap::new();
        for matrix in self.0.values() {
            *types.entry(matrix.kind().name()).or_default() += 1;
        }
        types
    }
}

impl HostWeight {
    /// The weight whose columns are those of `blocks` side by side (each a row-major
    /// `[inputs, columns]` matrix with its column count), and its bias.
    pub fn new(inputs: usize, blocks: &[(&[f32], usize)], bias: Vec<f32>) -> HostWeight {
        let operand = if sgemm::supported() {
            Operand::Packed(sgemm::Packed::new(inputs, blocks))
        } else {
            let columns: usize = blocks.iter().map(|(_, columns)| columns).sum();
            let mut values = Vec::with_capacity(inputs * columns);
            for row in 0..inputs {
                for (block, columns) in blocks {
                    values.extend_from_slice(&block[row * columns..][..*columns]);
                }
            }
            Operand::RowMajor(values)
        };
        HostWeight { operand, bias }
    }

    /// [`HostWeight::new`], rounded to bf16 for [`bf16`]'s products where `products` says so.
    pub fn for_products(
        products: Products,
        inputs: usize,
        blocks: &[(&[f32], usize)],
        bias: Vec<f32>,
    ) -> HostWeight {
        match products {
            Products::Bf16 => HostWeight {
                operand: Operand::Bf16(bf16::Packed::new(inputs, blocks)),
                bias,
            },
            Products::F32 => HostWeight::new(inputs, blocks, bias),
        }
    }

    /// The output columns.
    pub fn columns(&self) -> usize {
        self.bias.len()
    }
}

/// A trained product's weight rounded to bf16 and packed both ways: `[in, out]` as the forward
/// product `x W` reads it, and `[out, in]` as the input's gradient `dy Wᵀ` reads it.
#[derive(Debug)]
pub struct TrainedWeight {
    /// `W` `[in, out]`.
    pub forward: bf16::Packed,
    /// `Wᵀ` `[out, in]`.
    pub transposed: bf16::Packed,
}

/// A kernel transformed for Winograd's minimal filtering ([`host::winograd`]): one product weight
/// `[in, out]` per point ξ of the tile, without bias, and the bias added to the outputs.
#[derive(Debug)]
pub struct WinogradKernel {
    /// `U_ξ`, ξ row-major over the tile.
    pub points: Vec<HostWeight>,
    /// The bias `[out]`.
    pub bias: Vec<f32>,
}

impl WinogradKernel {
    /// The kernel whose tap `(ty, tx)` from input `c` to output `o` is `tap(ty, tx, c, o)`,
    /// transformed by `minimal`.
    fn new(
        products: Products,
        minimal: &Minimal,
        [inputs, outputs]: [usize; 2],
        tap: impl Fn(usize, usize, usize, usize) -> f32 + Sync,
        bias: Vec<f32>,
    ) -> Self {
        let points = (minimal.kernel([inputs, outputs], tap).iter())
            .map(|u| {
                HostWeight::for_products(products, inputs, &[(u, outputs)], vec![0.0; outputs])
            })
            .collect();
        WinogradKernel { points, bias }
    }
}

/// A convolution's kernel as a product with every tap at once ([`host::conv::tap_kernel`]),
/// its outputs' bias apart: what [`host::conv::sum_taps`] adds up.
#[derive(Debug)]
pub struct TapKernel {
    /// `[in, taps · out]`, with no bias.
    pub taps: HostWeight,
    /// The bias `[out]`.
    pub bias: Vec<f32>,
}

/// The host weights a tower's forwards prepared, shared by its clones: each under the parameter
/// it was made from, with the storage it was read from ([`StorageKey`]s, held weakly: a cache
/// that kept the storage shared made the optimiser copy every trained weight before its in-place
/// step). A forward reuses a weight while its parameters read the same storage, and prepares it
/// anew otherwise. Backends whose values are copied rather than read in
/// place (NdArray) prepare every forward.
#[derive(Clone, Default)]
pub struct PreparedWeights {
    kept: Arc<Mutex<HashMap<Key, Prepared>>>,
    /// Weights are read where the parameters hold them ([`Self::in_place`]).
    in_place: bool,
    /// The operands the products read (weights kept apart per kind).
    products: Products,
    /// Weights kept as stored, read in place of their parameters.
    stored: StoredWeights,
}

/// What a preparation is kept under: the parameter, the operands and the kind of preparation
/// (a trained weight's packing beside its inference weight, neither replacing the other).
type Key = (ParamId, Products, TypeId);

/// One prepared weight and what it was made from.
struct Prepared {
    /// What each source read, held weakly: the cache must not keep a trained weight's storage
    /// shared, or the optimiser's in-place step copies it.
    sources: Vec<StorageKey>,
    /// A [`HostWeight`], or what else a layer prepared (a transposed convolution's phases).
    weight: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for PreparedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedWeights")
    }
}

impl PreparedWeights {
    /// Weights read where the parameters hold them, never copied (LayerScale and patch kernels
    /// aside, which language models do not have): a model whose memory is mostly its weights
    /// (a language model) keeps one copy of them, and its first forward prepares nothing. The
    /// products run on the `gemm` crate, reading the weights by strides.
    pub fn in_place() -> Self {
        PreparedWeights {
            kept: Arc::default(),
            in_place: true,
            products: Products::F32,
            stored: StoredWeights::default(),
        }
    }

    /// The same, reading `stored`'s matrices in place of their parameters.
    pub fn with_stored(self, stored: StoredWeights) -> Self {
        PreparedWeights { stored, ..self }
    }

    /// The weights read as stored.
    pub fn stored(&self) -> &StoredWeights {
        &self.stored
    }

    /// The stored matrices of `linears`, when every one is stored.
    fn stored_of<B: Backend>(&self, linears: &[&Linear<B>]) -> Option<Vec<Arc<QuantMatrix>>> {
        (linears.iter())
            .map(|linear| self.stored.get(linear.weight.id).cloned())
            .collect()
    }

    /// `linears`' stored matrices side by side, with their biases.
    fn quantized<B: Backend>(
        &self,
        linears: &[&Linear<B>],
        matrices: Vec<Arc<QuantMatrix>>,
    ) -> Arc<HostWeight> {
        let bias = (linears.iter().zip(&matrices))
            .flat_map(|(linear, matrix)| {
                let bias = linear.bias.as_ref().map(|b| HostValues::of(&b.val()));
                bias_of(bias.as_ref(), matrix.rows())
            })
            .collect();
        Arc::new(HostWeight {
            operand: Operand::Quantized(matrices),
            bias,
        })
    }

    /// The same kept weights, prepared for products that read `products` operands (bf16
    /// weights are rounded and packed even where f32 ones would be read in place).
    pub fn for_products(&self, products: Products) -> Self {
        PreparedWeights {
            products,
            ..self.clone()
        }
    }

    /// The operands the products read.
    pub fn products(&self) -> Products {
        self.products
    }

    /// Whether weights are read where the parameters hold them (f32 products only).
    fn reads_in_place(&self) -> bool {
        self.in_place && self.products == Products::F32
    }

    /// [`HostWeight::for_products`] with this kind of operand.
    fn weight(&self, inputs: usize, blocks: &[(&[f32], usize)], bias: Vec<f32>) -> HostWeight {
        HostWeight::for_products(self.products, inputs, blocks, bias)
    }

    /// `linear`'s weight and bias, the weight's columns and the bias scaled by `scale` when
    /// given (LayerScale folded in: `s ⊙ (x W + b) = x (W diag s) + s ⊙ b`).
    pub fn linear<B: Backend>(
        &self,
        linear: &Linear<B>,
        scale: Option<&Tensor<B, 1>>,
    ) -> Arc<HostWeight> {
        if scale.is_none()
            && let Some(matrices) = self.stored_of(&[linear])
        {
            return self.quantized(&[linear], matrices);
        }
        let [inputs, outputs] = linear.weight.dims();
        let mut sources = weight_and_bias(&linear.weight, linear.bias.as_ref());
        if self.reads_in_place() && scale.is_none() {
            return in_place(&[(linear, outputs)], sources);
        }
        sources.extend(scale.map(HostValues::of));
        self.get(linear.weight.id, sources, |sources| {
            let mut weight = Cow::Borrowed(sources[0].values());
            let mut bias = bias_of(linear.bias.is_some().then(|| &sources[1]), outputs);
            if scale.is_some() {
                let scale = sources.last().expect("the scale was read").values();
                for row in weight.to_mut().chunks_exact_mut(outputs) {
                    row.iter_mut().zip(scale).for_each(|(w, s)| *w *= s);
                }
                bias.iter_mut().zip(scale).for_each(|(b, s)| *b *= s);
            }
            self.weight(inputs, &[(&weight, outputs)], bias)
        })
    }

    /// The weights of `linears` side by side, their biases likewise (self-attention's q, k and
    /// v as one product).
    pub fn side_by_side<B: Backend>(&self, linears: &[&Linear<B>]) -> Arc<HostWeight> {
        if let Some(matrices) = self.stored_of(linears) {
            return self.quantized(linears, matrices);
        }
        let inputs = linears[0].weight.dims()[0];
        let sources: Vec<HostValues> = linears
            .iter()
            .flat_map(|linear| weight_and_bias(&linear.weight, linear.bias.as_ref()))
            .collect();
        if self.reads_in_place() {
            let blocks: Vec<_> = linears.iter().map(|l| (*l, l.weight.dims()[1])).collect();
            return in_place(&blocks, sources);
        }
        self.get(linears[0].weight.id, sources, |sources| {
            let mut read = sources.iter();
            let mut blocks = Vec::new();
            let mut bias = Vec::new();
            for linear in linears {
                let columns = linear.weight.dims()[1];
                let weight = read.next().expect("every weight was read");
                let own_bias = linear.bias.is_some().then(|| read.next()).flatten();
                blocks.push((weight.values(), columns));
                bias.extend(bias_of(own_bias, columns));
            }
            self.weight(inputs, &blocks, bias)
        })
    }

    /// A trained product's weight `matrix` packed for bf16 products both ways ([`TrainedWeight`]),
    /// `reads` saying how the forward product reads it as `[in, out]`: kept while the parameter
    /// holds the same storage (a frozen weight is packed once; a trained one once a step,
    /// however many forwards read it).
    pub fn trained<B: Backend>(
        &self,
        matrix: &Param<Tensor<B, 2>>,
        reads: View,
    ) -> Arc<TrainedWeight> {
        let sources = vec![HostValues::of(&matrix.val())];
        self.get(matrix.id, sources, |sources| {
            let values = sources[0].values();
            TrainedWeight {
                forward: bf16::Packed::of_view(values, reads),
                transposed: bf16::Packed::of_view(values, reads.transposed()),
            }
        })
    }

    /// A matrix `[out, in]` as the weight `[in, out]` of a product without bias (the embedding
    /// table as the output projection of a language model with tied embeddings).
    pub fn transposed<B: Backend>(&self, matrix: &Param<Tensor<B, 2>>) -> Arc<HostWeight> {
        if let Some(stored) = self.stored.get(matrix.id) {
            return Arc::new(HostWeight {
                operand: Operand::Quantized(vec![stored.clone()]),
                bias: vec![0.0; stored.rows()],
            });
        }
        let [outputs, inputs] = matrix.dims();
        let sources = vec![HostValues::of(&matrix.val())];
        if self.reads_in_place() {
            let [matrix] = <[HostValues; 1]>::try_from(sources).expect("one source");
            return Arc::new(HostWeight {
                operand: Operand::InPlaceTransposed(matrix),
                bias: vec![0.0; outputs],
            });
        }
        self.get(matrix.id, sources, |sources| {
            let weight = host::transposed(sources[0].values(), outputs, inputs);
            self.weight(inputs, &[(&weight, outputs)], vec![0.0; outputs])
        })
    }

    /// A convolution's kernel `[out, in, h, w]` as the weight `[in · h · w, out]` of a product
    /// with unfolded patches, and its bias.
    pub fn unfolded_kernel<B: Backend>(&self, conv: &Conv2d<B>) -> Arc<HostWeight> {
        let [outputs, channels, height, width] = conv.weight.dims();
        let depth = channels * height * width;
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let kernel = host::transposed(sources[0].values(), outputs, depth);
            let bias = bias_of(conv.bias.is_some().then(|| &sources[1]), outputs);
            self.weight(depth, &[(&kernel, outputs)], bias)
        })
    }

    /// A convolution's kernel `[out, in, kh, kw]` as the weight `[kh · kw · in, out]` of a
    /// product with NHWC rows unfolded tap by tap ([`host::conv::unfold`]), and its bias.
    pub fn conv_nhwc<B: Backend>(&self, conv: &Conv2d<B>) -> Arc<HostWeight> {
        let shape = conv.weight.dims();
        let [outputs, channels, height, width] = shape;
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let kernel = host::conv::conv_kernel(sources[0].values(), shape);
            let bias = bias_of(conv.bias.is_some().then(|| &sources[1]), outputs);
            self.weight(channels * height * width, &[(&kernel, outputs)], bias)
        })
    }

    /// A convolution's kernel `[out, in, kh, kw]` as the weight `[in, kh · kw · out]` of a
    /// product with the image's pixels ([`host::conv::tap_kernel`]), and its bias.
    pub fn conv_taps<B: Backend>(&self, conv: &Conv2d<B>) -> Arc<TapKernel> {
        let shape = conv.weight.dims();
        let [outputs, channels, height, width] = shape;
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let kernel = host::conv::tap_kernel(sources[0].values(), shape);
            let columns = height * width * outputs;
            TapKernel {
                taps: self.weight(channels, &[(&kernel, columns)], vec![0.0; columns]),
                bias: bias_of(conv.bias.is_some().then(|| &sources[1]), outputs),
            }
        })
    }

    /// A transposed convolution's kernel `[in, out, kh, kw]` as one weight per output phase
    /// (row-major over the stride), each `[taps · in, out]` with the bias, for products with
    /// the rows of [`host::conv::Windows::transposed_phase`].
    pub fn transposed_conv_phases<B: Backend>(
        &self,
        conv: &ConvTranspose2d<B>,
    ) -> Arc<Vec<HostWeight>> {
        let shape = conv.weight.dims();
        let outputs = shape[1];
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let kernels =
                host::conv::transposed_conv_kernels(sources[0].values(), shape, conv.stride);
            let bias = bias_of(conv.bias.is_some().then(|| &sources[1]), outputs);
            (kernels.iter())
                .map(|kernel| {
                    self.weight(kernel.len() / outputs, &[(kernel, outputs)], bias.clone())
                })
                .collect()
        })
    }

    /// A 3 × 3 convolution's kernel `[out, in, 3, 3]` transformed for F(2×2, 3×3)
    /// ([`host::winograd::F2X3`]), and its bias.
    pub fn conv_winograd<B: Backend>(&self, conv: &Conv2d<B>) -> Arc<WinogradKernel> {
        let [outputs, inputs, kh, kw] = conv.weight.dims();
        assert_eq!([kh, kw], [3, 3], "conv_winograd: a 3 × 3 kernel");
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let weight = sources[0].values();
            let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                weight[((o * inputs + c) * 3 + ty) * 3 + tx]
            };
            let bias = bias_of(conv.bias.is_some().then(|| &sources[1]), outputs);
            WinogradKernel::new(self.products, &F2X3, [inputs, outputs], tap, bias)
        })
    }

    /// A 4 × 4, stride-2 transposed convolution's kernel `[in, out, 4, 4]` transformed for
    /// F(2×2, 2×2) ([`host::winograd::F2X2`]), one per output phase of `phases`, with the bias.
    pub fn transposed_conv_winograd<B: Backend>(
        &self,
        conv: &ConvTranspose2d<B>,
        phases: &[Phase],
    ) -> Arc<Vec<WinogradKernel>> {
        let [inputs, outputs, kh, kw] = conv.weight.dims();
        assert_eq!([kh, kw], [4, 4], "transposed_conv_winograd: a 4 × 4 kernel");
        let sources = weight_and_bias(&conv.weight, conv.bias.as_ref());
        self.get(conv.weight.id, sources, |sources| {
            let weight = sources[0].values();
            let bias = bias_of(conv.bias.is_some().then(|| &sources[1]), outputs);
            (phases.iter())
                .map(|phase| {
                    let tap = |ty: usize, tx: usize, c: usize, o: usize| {
                        let [ky, kx] = phase.kernel_tap(ty, tx);
                        weight[((c * outputs + o) * 4 + ky) * 4 + kx]
                    };
                    WinogradKernel::new(self.products, &F2X2, [inputs, outputs], tap, bias.clone())
                })
                .collect()
        })
    }

    /// The weight kept under `id` when it was made from `sources`, else `prepare(sources)`, kept
    /// when every source was read in place. The lock is not held while preparing (packing runs
    /// on rayon's threads, which may start another forward of this tower).
    fn get<T: Any + Send + Sync>(
        &self,
        id: ParamId,
        sources: Vec<HostValues>,
        prepare: impl FnOnce(&[HostValues]) -> T,
    ) -> Arc<T> {
        let lock = || self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let key = (id, self.products, TypeId::of::<T>());
        if let Some(kept) = lock().get(&key)
            && kept.sources.len() == sources.len()
            && kept
                .sources
                .iter()
                .zip(&sources)
                .all(|(key, source)| key.reads(source))
            && let Ok(weight) = kept.weight.clone().downcast::<T>()
        {
            return weight;
        }
        let weight = Arc::new(prepare(&sources));
        if let Some(sources) = sources.iter().map(HostValues::storage_key).collect() {
            let kept = Prepared {
                sources,
                weight: weight.clone(),
            };
            lock().insert(key, kept);
        }
        weight
    }
}

/// The weights of `linears` (each with its columns) read in place side by side, with their
/// biases: `sources` holds each one's weight, then its bias when it has one.
fn in_place<B: Backend>(
    linears: &[(&Linear<B>, usize)],
    sources: Vec<HostValues>,
) -> Arc<HostWeight> {
    let mut sources = sources.into_iter();
    let mut blocks = Vec::new();
    let mut bias = Vec::new();
    for (linear, columns) in linears {
        blocks.push((sources.next().expect("every weight was read"), *columns));
        let own_bias = linear.bias.as_ref().and_then(|_| sources.next());
        bias.extend(bias_of(own_bias.as_ref(), *columns));
    }
    Arc::new(HostWeight {
        operand: Operand::InPlace(blocks),
        bias,
    })
}

/// The values of a weight and, when there is one, its bias.
fn weight_and_bias<B: Backend, const D: usize>(
    weight: &Param<Tensor<B, D>>,
    bias: Option<&Param<Tensor<B, 1>>>,
) -> Vec<HostValues> {
    let mut sources = vec![HostValues::of(&weight.val())];
    sources.extend(bias.map(|bias| HostValues::of(&bias.val())));
    sources
}

/// A bias of `width` values: the given one, zeros without one.
fn bias_of(bias: Option<&HostValues>, width: usize) -> Vec<f32> {
    bias.map_or_else(|| vec![0.0; width], |bias| bias.values().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::LinearConfig;

    /// A weight is prepared once while its parameters keep their storage, and anew when one of
    /// them changes, with the new values.
    /// A parameter in training (`Autodiff<Flex>`) is read in place, so its bf16 packing is kept
    /// while it holds the same storage and made anew once the optimiser's step replaces it; the
    /// inference preparation of the same parameter is kept beside it, not in its place.
    #[test]
    fn trained_weights_are_kept_until_the_parameter_changes() {
        use burn::backend::Autodiff;
        type Trained = Autodiff<Flex>;
        let device = Default::default();
        let linear = LinearConfig::new(3, 5).init::<Trained>(&device);
        let prepared = PreparedWeights::default().for_products(Products::Bf16);
        let reads = View::rows(0, 3, 5, 5);
        let first = prepared.trained(&linear.weight, reads);
        assert!(Arc::ptr_eq(
            &first,
            &prepared.trained(&linear.weight, reads)
        ));
        let for_inference = prepared.linear(&linear, None);
        assert!(Arc::ptr_eq(
            &first,
            &prepared.trained(&linear.weight, reads)
        ));
        assert_eq!(for_inference.columns(), 5);
        let stepped = linear.weight.clone().map(|w| w.add_scalar(1.0));
        assert_eq!(stepped.id, linear.weight.id);
        assert!(!Arc::ptr_eq(&first, &prepared.trained(&stepped, reads)));
    }

    #[test]
    fn kept_while_the_weight_is_unchanged() {
        let device = Default::default();
        let mut linear = LinearConfig::new(3, 5).init::<Flex>(&device);
        let prepared = PreparedWeights::default();
        let first = prepared.linear(&linear, None);
        assert!(Arc::ptr_eq(&first, &prepared.linear(&linear, None)));
        assert!(Arc::ptr_eq(&first, &prepared.clone().linear(&linear, None)));
        let bias = linear
            .bias
            .take()
            .expect("a bias")
            .map(|b| b.add_scalar(1.0));
        linear.bias = Some(bias);
        let second = prepared.linear(&linear, None);
        assert!(!Arc::ptr_eq(&first, &second));
        let added: Vec<f32> = first.bias.iter().map(|b| b + 1.0).collect();
        assert_eq!(second.bias, added);
        let scale = Tensor::<Flex, 1>::from_floats([1.0, 2.0, 3.0, 4.0, 5.0], &device);
        let scaled = prepared.linear(&linear, Some(&scale));
        assert!(!Arc::ptr_eq(&scaled, &second));
        let want: Vec<f32> = second
            .bias
            .iter()
            .zip(1..)
            .map(|(b, s)| b * s as f32)
            .collect();
        assert_eq!(scaled.bias, want);
    }
}
