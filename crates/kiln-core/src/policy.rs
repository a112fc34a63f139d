//! Mixed-precision policies: which dtype parameters are stored in, which dtype computation runs in,
//! which dtype results are returned in, and which dtype statistics accumulate in.
//!
//! The grammar is DeepMind jmp's (`"params=f32,compute=bf16,output=f32"`, short keys `p`/`c`/`o`,
//! compute defaulting to params and output to compute, a bare dtype setting all three), with one
//! kiln key added: `accumulate` (`a`), the dtype of statistics, default f64 where the device
//! computes in f64 and f32 elsewhere.

use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::{Backend, DTypeUsage};
use burn::tensor::{DType, Tensor};

use crate::PrecisionError;
use crate::dtype::{DtypeSpec, Precision};

/// Named policies, as `--policy` accepts them.
pub const PRESETS: [(&str, &str); 4] = [
    ("full", "params=f32,compute=f32,output=f32"),
    ("mixed-f16", "params=f32,compute=f16,output=f32"),
    ("mixed-bf16", "params=f32,compute=bf16,output=f32"),
    ("pure-f16", "params=f16,compute=f16,output=f16"),
];

const KEYS: &str = "params (p), compute (c), output (o), accumulate (a)";

/// A policy as written by a user: dtypes may still be `half`, resolved per device by
/// [`PolicySpec::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicySpec {
    /// Storage dtype of the parameters.
    pub param: DtypeSpec,
    /// Dtype the forward pass computes in.
    pub compute: DtypeSpec,
    /// Dtype of what the model returns.
    pub output: DtypeSpec,
    /// Dtype of accumulated statistics; `None` is f64 where the device computes in f64, else f32.
    pub accumulate: Option<DtypeSpec>,
}

impl Default for PolicySpec {
    /// The `full` preset: everything in f32.
    fn default() -> Self {
        let f32 = DtypeSpec::Exact(Precision::F32);
        PolicySpec {
            param: f32,
            compute: f32,
            output: f32,
            accumulate: None,
        }
    }
}

impl FromStr for PolicySpec {
    type Err = PrecisionError;

    /// Parses a preset name (`full`, `mixed-f16`, `mixed-bf16`, `pure-f16`), a bare dtype, or a
    /// comma-separated `key=dtype` list.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some((_, expansion)) = PRESETS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
        {
            return expansion.parse();
        }
        if !s.contains('=') {
            let all = s
                .parse::<DtypeSpec>()
                .map_err(|_| PrecisionError::UnknownPolicy(s.to_string()))?;
            return Ok(PolicySpec {
                param: all,
                compute: all,
                output: all,
                accumulate: None,
            });
        }
        let (mut param, mut compute, mut output, mut accumulate) = (None, None, None, None);
        for item in s.split(',') {
            let (key, value) = item.split_once('=').ok_or_else(|| {
                PrecisionError::MalformedPolicy(s.to_string(), item.trim().to_string())
            })?;
            let slot = match key.trim().to_ascii_lowercase().as_str() {
                "params" | "param" | "p" => &mut param,
                "compute" | "c" => &mut compute,
                "output" | "o" => &mut output,
                "accumulate" | "accum" | "a" => &mut accumulate,
                other => return Err(PrecisionError::UnknownKey(other.to_string(), KEYS)),
            };
            if slot.replace(value.parse::<DtypeSpec>()?).is_some() {
                return Err(PrecisionError::RepeatedKey(key.trim().to_string()));
            }
        }
        let param = param.ok_or_else(|| PrecisionError::MissingParams(s.to_string()))?;
        let compute = compute.unwrap_or(param);
        let output = output.unwrap_or(compute);
        Ok(PolicySpec {
            param,
            compute,
            output,
            accumulate,
        })
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "params={},compute={},output={}",
            self.param, self.compute, self.output
        )?;
        match self.accumulate {
            Some(a) => write!(f, ",accumulate={a}"),
            None => Ok(()),
        }
    }
}

/// Whether `device` computes in `precision` (stores it and runs general arithmetic on it).
pub fn computes_in<B: Backend>(device: &B::Device, precision: Precision) -> bool {
    B::dtype_usage(device, precision.dtype()).is_superset(DTypeUsage::general())
}

/// The 16-bit type `half` stands for on `device`: bf16 where it computes in bf16, else f16, else
/// f32 (with a warning, since the caller asked for half precision and will not get it).
pub fn resolve_half<B: Backend>(device: &B::Device) -> Precision {
    let half = pick_half(|p| computes_in::<B>(device, p));
    if half == Precision::F32 {
        log::warn!(
            "{} computes in neither bf16 nor f16: `half` falls back to f32",
            B::name(device)
        );
    }
    half
}

/// bf16 if `computes(bf16)`, else f16 if `computes(f16)`, else f32.
pub(crate) fn pick_half(computes: impl Fn(Precision) -> bool) -> Precision {
    [Precision::BF16, Precision::F16]
        .into_iter()
        .find(|&p| computes(p))
        .unwrap_or(Precision::F32)
}

impl PolicySpec {
    /// Resolves `half` and the default accumulation dtype for `device`, and checks that the device
    /// computes in every dtype the policy names.
    pub fn resolve<B: Backend>(&self, device: &B::Device) -> Result<Policy, PrecisionError> {
        let resolve = |spec: DtypeSpec| -> Result<Precision, PrecisionError> {
            let precision = match spec {
                DtypeSpec::Exact(p) => p,
                DtypeSpec::Half => resolve_half::<B>(device),
            };
            if computes_in::<B>(device, precision) {
                Ok(precision)
            } else {
                Err(PrecisionError::UnsupportedOnDevice {
                    dtype: precision,
                    device: B::name(device),
                })
            }
        };
        let accumulate = match self.accumulate {
            Some(spec) => resolve(spec)?,
            None if computes_in::<B>(device, Precision::F64) => Precision::F64,
            None => Precision::F32,
        };
        Ok(Policy {
            param: resolve(self.param)?,
            compute: resolve(self.compute)?,
            output: resolve(self.output)?,
            accumulate,
        })
    }
}

/// A policy resolved for one device: every dtype is concrete and computable there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Storage dtype of the parameters.
    pub param: Precision,
    /// Dtype the forward pass computes in.
    pub compute: Precision,
    /// Dtype of what the model returns.
    pub output: Precision,
    /// Dtype of accumulated statistics.
    pub accumulate: Precision,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "params={},compute={},output={},accumulate={}",
            self.param, self.compute, self.output, self.accumulate
        )
    }
}

/// Casts every float parameter of a module to one dtype, keeping ids and `require_grad`.
struct CastParams(Precision);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0.float_dtype();
        // A cast of a tracked tensor is a node of its graph, not a leaf: it would never receive
        // a gradient. The cast parameter is a new leaf that tracks what the old one did.
        param.map(|tensor| {
            let tracked = tensor.is_require_grad();
            let cast = tensor.cast(dtype).detach();
            if tracked { cast.require_grad() } else { cast }
        })
    }
}

impl Policy {
    /// The policy that changes nothing: f32 everywhere, statistics in f64.
    pub fn full() -> Self {
        Policy {
            param: Precision::F32,
            compute: Precision::F32,
            output: Precision::F32,
            accumulate: Precision::F64,
        }
    }

    /// Converts a module's float parameters to the parameter dtype, once (a direct conversion of
    /// the stored tensors, not a wrapper applied on every call).
    pub fn cast_params<B: Backend, M: Module<B>>(&self, module: M) -> M {
        cast_module(module, self.param)
    }

    /// Casts a model input to the compute dtype.
    pub fn cast_input<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.compute)
    }

    /// Casts a parameter to the compute dtype where it is stored in another one (mixed policies
    /// keep f32 master weights and compute in half precision).
    pub fn cast_param<B: Backend, const D: usize>(&self, w: Tensor<B, D>) -> Tensor<B, D> {
        cast(w, self.compute)
    }

    /// Casts a model result to the output dtype.
    pub fn cast_output<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.output)
    }

    /// Casts a value to the accumulation dtype of statistics.
    pub fn cast_accumulate<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.accumulate)
    }

    /// Runs `op` in at least f32 and returns its result in the compute dtype: the keep-in-f32 set.
    ///
    /// Softmax, normalisation (layer/RMS norm statistics), reductions (sums, means, norms),
    /// scatter-adds and losses lose too much in f16/bf16 — PyTorch autocast's `float32` op list and
    /// jmp's advice agree — so model code routes them through this one helper:
    ///
    /// ```
    /// # use burn::backend::Flex;
    /// # use burn::tensor::{Tensor, activation::softmax};
    /// # use kiln_core::{PolicySpec, Precision};
    /// let device = Default::default();
    /// let policy = "mixed-f16".parse::<PolicySpec>()?.resolve::<Flex>(&device)?;
    /// let scores = policy.cast_input(Tensor::<Flex, 2>::from_floats([[1.0, 2.0, 3.0]], &device));
    /// let probs = policy.keep_f32(scores, |s| softmax(s, 1));
    /// assert_eq!(Precision::from_dtype(probs.dtype()), Some(Precision::F16));
    /// # Ok::<(), kiln_core::PrecisionError>(())
    /// ```
    pub fn keep_f32<B: Backend, const D: usize, const E: usize>(
        &self,
        x: Tensor<B, D>,
        op: impl FnOnce(Tensor<B, D>) -> Tensor<B, E>,
    ) -> Tensor<B, E> {
        cast(op(widen_to_f32(x)), self.compute)
    }
}

/// Converts every float parameter of `module` to `precision`, keeping ids and `require_grad`:
/// how a mixed policy gets a compute-dtype copy of f32 master weights for one forward pass.
pub fn cast_module<B: Backend, M: Module<B>>(module: M, precision: Precision) -> M {
    module.map(&mut CastParams(precision))
}

/// Casts to `precision` unless the tensor already has it (burn's cast is a no-op then as well, but
/// this keeps the intent readable at call sites).
pub fn cast<B: Backend, const D: usize>(x: Tensor<B, D>, precision: Precision) -> Tensor<B, D> {
    if Precision::from_dtype(x.dtype()) == Some(precision) {
        x
    } else {
        x.cast(precision.float_dtype())
    }
}

/// Widens 16-bit floats to f32 and leaves f32 and f64 as they are.
pub fn widen_to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.cast(Precision::F32.float_dtype()),
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(p: &str, c: &str, o: &str) -> PolicySpec {
        PolicySpec {
            param: p.parse().unwrap(),
            compute: c.parse().unwrap(),
            output: o.parse().unwrap(),
            accumulate: None,
        }
    }

    #[test]
    fn jmp_grammar() {
        let cases = [
            (
                "params=f32,compute=bf16,output=f32",
                spec("f32", "bf16", "f32"),
            ),
            ("p=f32,c=f16,o=f32", spec("f32", "f16", "f32")),
            ("params=float32,compute=half", spec("f32", "half", "half")),
            ("p=f16", spec("f16", "f16", "f16")),
            (" params = f32 , output = f16 ", spec("f32", "f32", "f16")),
            ("bf16", spec("bf16", "bf16", "bf16")),
            ("half", spec("half", "half", "half")),
            ("full", spec("f32", "f32", "f32")),
            ("mixed-f16", spec("f32", "f16", "f32")),
            ("Mixed-BF16", spec("f32", "bf16", "f32")),
            ("pure-f16", spec("f16", "f16", "f16")),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<PolicySpec>().unwrap(), want, "{text}");
        }
        let with_acc: PolicySpec = "p=f32,c=f16,a=f32".parse().unwrap();
        assert_eq!(with_acc.accumulate, Some(DtypeSpec::Exact(Precision::F32)));
    }

    #[test]
    fn cast_parameters_still_receive_gradients() {
        use burn::backend::{Autodiff, Flex};
        use burn::nn::{Linear, LinearConfig};
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let layer: Linear<Ad> = cast_module(LinearConfig::new(2, 1).init(&device), Precision::F64);
        assert_eq!(layer.weight.val().dtype(), DType::F64);
        let x = Tensor::<Ad, 2>::from_data([[3.0, -2.0]], (&device, DType::F64));
        let gradients = layer.forward(x).sum().backward();
        let weight = layer.weight.val().grad(&gradients).expect("a gradient");
        let values: Vec<f64> = weight.into_data().convert::<f64>().to_vec().unwrap();
        assert_eq!(values, [3.0, -2.0]);
    }

    #[test]
    fn display_parses_back() {
        for text in ["mixed-bf16", "p=f32,c=half,o=f32,a=f64", "f16"] {
            let spec: PolicySpec = text.parse().unwrap();
            assert_eq!(spec.to_string().parse::<PolicySpec>().unwrap(), spec);
        }
    }

    #[test]
    fn bad_policies_are_explained() {
        let err = |s: &str| s.parse::<PolicySpec>().unwrap_err().to_string();
        let e = err("mixed-f8");
        assert!(
            e.contains("mixed-f8") && e.contains("mixed-bf16") && e.contains("pure-f16"),
            "{e}"
        );
        let e = err("params=f32,compte=f16");
        assert!(e.contains("compte") && e.contains("compute (c)"), "{e}");
        let e = err("params=f32,compute=f12");
        assert!(e.contains("f12") && e.contains("bf16"), "{e}");
        let e = err("p=f32,p=f16");
        assert!(e.contains("more than once"), "{e}");
        let e = err("compute=f16");
        assert!(e.contains("params"), "{e}");
        let e = err("params=f32,f16");
        assert!(e.contains("key=dtype"), "{e}");
        assert!(err("").contains("full"));
    }
}
