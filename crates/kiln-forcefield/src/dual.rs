//! Tensors that carry a tangent: forward-mode differentiation written as ordinary tensor
//! operations. PaiNN's forward pass runs on these to give, beside the energy, its directional
//! derivative along a displacement of the atoms (and a strain of the cell) — the quantity whose
//! parameter gradient is the gradient of a force loss (see `loss.rs`). Because the tangent is
//! built from burn operations, burn's first-order autodiff differentiates it: no double
//! backward.
//!
//! A missing tangent is zero and costs nothing: a forward pass without one runs exactly the
//! operations of the plain model.

use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::backend::Backend;
use kiln_kernels::RowIndex;

/// A value and its tangent (`None`: zero), both `[rows, columns]`.
#[derive(Debug, Clone)]
pub(crate) struct Dual<B: Backend> {
    pub value: Tensor<B, 2>,
    pub tangent: Option<Tensor<B, 2>>,
}

/// The sum of two tangents, either of which may be zero.
fn plus<B: Backend>(a: Option<Tensor<B, 2>>, b: Option<Tensor<B, 2>>) -> Option<Tensor<B, 2>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

impl<B: Backend> Dual<B> {
    /// A value with zero tangent.
    pub fn constant(value: Tensor<B, 2>) -> Self {
        Dual {
            value,
            tangent: None,
        }
    }

    /// `self + other`.
    pub fn add(self, other: Self) -> Self {
        Dual {
            value: self.value + other.value,
            tangent: plus(self.tangent, other.tangent),
        }
    }

    /// `self ⊙ other` (product rule).
    pub fn mul(self, other: Self) -> Self {
        let tangent = plus(
            self.tangent.map(|t| t * other.value.clone()),
            other.tangent.map(|t| self.value.clone() * t),
        );
        Dual {
            value: self.value * other.value,
            tangent,
        }
    }

    /// The rows `index` names, of both.
    pub fn gather(self, index: &RowIndex<B>) -> Self {
        Dual {
            value: index.gather(self.value),
            tangent: self.tangent.map(|t| index.gather(t)),
        }
    }

    /// `self` with `rows` added into the rows `index` names (both linear).
    pub fn scatter_add(self, index: &RowIndex<B>, rows: Self) -> Self {
        let tangent = match (self.tangent, rows.tangent) {
            (base, Some(added)) => {
                let base = base.unwrap_or_else(|| self.value.zeros_like());
                Some(index.scatter_add(base, added))
            }
            (base, None) => base,
        };
        Dual {
            value: index.scatter_add(self.value, rows.value),
            tangent,
        }
    }

    /// `[a, b]` along columns.
    pub fn cat(self, other: Self) -> Self {
        let tangent = match (self.tangent, other.tangent) {
            (None, None) => None,
            (a, b) => {
                let a = a.unwrap_or_else(|| self.value.zeros_like());
                let b = b.unwrap_or_else(|| other.value.zeros_like());
                Some(Tensor::cat(vec![a, b], 1))
            }
        };
        Dual {
            value: Tensor::cat(vec![self.value, other.value], 1),
            tangent,
        }
    }

    /// `silu(x) = x σ(x)`, whose derivative is `σ(x) (1 + x − silu(x))`.
    pub fn silu(self) -> Self {
        match self.tangent {
            None => Dual::constant(silu(self.value)),
            Some(tangent) => {
                let s = sigmoid(self.value.clone());
                let value = self.value.clone() * s.clone();
                let slope = s * (self.value + 1.0 - value.clone());
                Dual {
                    value,
                    tangent: Some(tangent * slope),
                }
            }
        }
    }

    /// `layer(x)`; the bias does not reach the tangent.
    pub fn linear(self, layer: &Linear<B>) -> Self {
        Dual {
            value: layer.forward(self.value),
            tangent: self.tangent.map(|t| t.matmul(layer.weight.val())),
        }
    }

    /// `layer(x)` as `parts` equal column blocks of its output, each its own contiguous tensor: a
    /// product with a column block of the weight rather than a `narrow` of one output. burn-flex
    /// runs arithmetic on `narrow`ed (strided) operands, and its autodiff backward, one element
    /// at a time.
    pub fn linear_parts(self, layer: &Linear<B>, parts: usize) -> Vec<Self> {
        let weight = layer.weight.val();
        let width = weight.dims()[1] / parts;
        (0..parts)
            .map(|k| {
                let block = weight.clone().narrow(1, k * width, width);
                let y = self.value.clone().matmul(block.clone());
                let value = match &layer.bias {
                    Some(bias) => y + bias.val().narrow(0, k * width, width).unsqueeze_dim(0),
                    None => y,
                };
                Dual {
                    value,
                    tangent: self.tangent.clone().map(|t| t.matmul(block)),
                }
            })
            .collect()
    }
}
