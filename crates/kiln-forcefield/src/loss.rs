//! Force matching: the loss of a batch against reference labels, with its exact gradient with
//! respect to the parameters on every backend — without double backward, which burn lacks.
//!
//! Forces are `F = −∂E/∂R` and stresses `σ = sym(∂E/∂ε) / V`, so with `u = ∂ℓ/∂F` and
//! `v = ∂ℓ/∂σ` the chain rule gives
//!
//! ```text
//! dℓ/dθ = Σ_s ∂ℓ/∂E_s ∂E_s/∂θ + ∂/∂θ [ Σ_i u_i · F_i + Σ_s v_s : σ_s ]   (u, v held fixed)
//!       = Σ_s ∂ℓ/∂E_s ∂E_s/∂θ + ∂/∂θ Ė,
//! ```
//!
//! where `Ė` is the derivative of the total energy along the tangent `−u` on the positions and
//! `sym(v_s) / V_s` on each cell's strain. kiln computes the forces first (the fused host kernel
//! on CPU, `predict_tensors` elsewhere) and forms `u` and `v` on the host. On the CPU backends
//! the host kernel then runs PaiNN's forward pass carrying that tangent and its reverse pass by
//! hand (`host/tangent.rs`), structures in parallel; elsewhere one forward pass carries it as
//! tensor operations (`dual.rs`: PaiNN's operations and their derivatives) and burn's ordinary
//! reverse pass goes through it.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorData};
use kiln_core::is_host_backend;
use serde::{Deserialize, Serialize};

use crate::ForceFieldError;
use crate::host::{self, LossSeeds};
use crate::labels::Labels;
use crate::painn::{Painn, Predictions, Tangent};
use crate::structure::Structure;

/// Below this norm (eV/Å) a force's direction is undefined: the cosine term divides by it
/// instead (as `torch.nn.functional.cosine_similarity` does with its `eps`).
pub const COSINE_EPS: f64 = 1e-8;

/// Weights of the force-matching loss
/// `w_E MSE(E) + w_F MSE(F) + w_C mean(1 − cos(F, F*)) + w_S MSE(σ)`: the energy error over
/// structures (total energies, eV²), the force error over every Cartesian component (eV²/Å²),
/// the cosine over atoms and the stress error over the nine components of every periodic
/// structure's stress (eV²/Å⁶; stress labels of other structures are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossWeights {
    /// `w_E`.
    pub energy: f64,
    /// `w_F`.
    pub forces: f64,
    /// `w_C`.
    pub cosine: f64,
    /// `w_S` (needs stress labels on the periodic structures when non-zero).
    pub stress: f64,
}

impl LossWeights {
    /// MLFF-Distiller's: `1·MSE(E) + 100·MSE(F) + 10·mean(1 − cos)`, no stress.
    pub fn mlff_distiller() -> Self {
        LossWeights {
            energy: 1.0,
            forces: 100.0,
            cosine: 10.0,
            stress: 0.0,
        }
    }
}

impl Default for LossWeights {
    fn default() -> Self {
        Self::mlff_distiller()
    }
}

/// A batch's loss and its unweighted terms, each `[1]`.
#[derive(Debug, Clone)]
pub struct ForceLoss<B: AutodiffBackend> {
    /// The weighted loss: its value is the loss, its gradient (one `backward()`) the exact
    /// gradient with respect to the parameters.
    pub loss: Tensor<B, 1>,
    /// Mean squared energy error, eV².
    pub energy_mse: Tensor<B, 1>,
    /// Mean squared force error per component, eV²/Å².
    pub force_mse: Tensor<B, 1>,
    /// Mean `1 − cos(F, F*)` over atoms.
    pub cosine_distance: Tensor<B, 1>,
    /// Mean squared stress error per component (0 without stress), eV²/Å⁶.
    pub stress_mse: Tensor<B, 1>,
}

/// The loss's terms, evaluated on the host from predictions, and the force and stress terms'
/// gradients.
struct HostTerms {
    energy_mse: f64,
    force_mse: f64,
    cosine_distance: f64,
    stress_mse: f64,
    /// `∂(weighted terms)/∂F`, per atom.
    force_gradient: Vec<f64>,
    /// `sym(∂(weighted terms)/∂σ_s) / V_s` per structure (zero for those without stress), when
    /// any structure has a stress term.
    strain_tangent: Option<Vec<f64>>,
}

impl<B: AutodiffBackend> Painn<B> {
    /// The loss of `structures` against their `labels` (one each, in order) under `weights`,
    /// as one tensor to call `backward()` on. Errors name the structure (1-based) whose labels
    /// do not fit it. On the CPU backends (Flex, NdArray) with f32 or f64 parameters the
    /// gradient comes from the host kernel (`host/tangent.rs`: the tangent pass and its reverse
    /// by hand, structures in parallel); elsewhere this is
    /// [`force_loss_tensors`](Self::force_loss_tensors). Both compute the same gradient.
    pub fn force_loss(
        &self,
        structures: &[Structure],
        labels: &[Labels],
        weights: &LossWeights,
        device: &B::Device,
    ) -> Result<ForceLoss<B>, ForceFieldError> {
        let (predicted, terms) = self.loss_terms(structures, labels, weights, device)?;
        let Some(surrogate) =
            self.host_surrogate(structures, labels, weights, &predicted, &terms, device)?
        else {
            return self.tensor_loss(structures, labels, weights, &terms, device);
        };
        let dtype = surrogate.dtype();
        let scalar = |value: f64| {
            Tensor::<B, 1>::from_data(TensorData::new(vec![value], [1]), (device, dtype))
        };
        // θ·g − (θ·g).detach(): zero in value, the loss's gradient in backward.
        let loss = surrogate.clone() - surrogate.detach() + scalar(weighted(weights, &terms));
        Ok(ForceLoss {
            loss,
            energy_mse: scalar(terms.energy_mse),
            force_mse: scalar(terms.force_mse),
            cosine_distance: scalar(terms.cosine_distance),
            stress_mse: scalar(terms.stress_mse),
        })
    }

    /// [`force_loss`](Self::force_loss) through tensor operations on the device: the forces
    /// from [`predict`](Self::predict), then one forward pass of PaiNN carrying the tangent
    /// (`dual.rs`) and burn's reverse pass through it. Any backend, any dtype.
    pub fn force_loss_tensors(
        &self,
        structures: &[Structure],
        labels: &[Labels],
        weights: &LossWeights,
        device: &B::Device,
    ) -> Result<ForceLoss<B>, ForceFieldError> {
        let (_, terms) = self.loss_terms(structures, labels, weights, device)?;
        self.tensor_loss(structures, labels, weights, &terms, device)
    }

    /// The labels checked, the predictions and the loss's terms with their force and stress
    /// gradients.
    fn loss_terms(
        &self,
        structures: &[Structure],
        labels: &[Labels],
        weights: &LossWeights,
        device: &B::Device,
    ) -> Result<(Predictions, HostTerms), ForceFieldError> {
        check_labels(structures, labels, weights)?;
        let predicted = self.predict(structures, device)?;
        let terms = host_terms(structures, labels, weights, &predicted);
        Ok((predicted, terms))
    }

    /// The tangent pass and its loss as tensors (see `force_loss_tensors`).
    fn tensor_loss(
        &self,
        structures: &[Structure],
        labels: &[Labels],
        weights: &LossWeights,
        terms: &HostTerms,
        device: &B::Device,
    ) -> Result<ForceLoss<B>, ForceFieldError> {
        let graph = self.graph(structures, device)?;
        let dtype = graph.positions.dtype();
        let atoms = terms.force_gradient.len() / 3;
        let tangent = Tangent {
            positions: Tensor::<B, 2>::from_data(
                TensorData::new(
                    terms.force_gradient.iter().map(|g| -g).collect::<Vec<_>>(),
                    [atoms, 3],
                ),
                (device, dtype),
            ),
            strain: terms.strain_tangent.clone().map(|values| {
                Tensor::<B, 3>::from_data(
                    TensorData::new(values, [structures.len(), 3, 3]),
                    (device, dtype),
                )
            }),
        };
        let (energies, along_tangent) = self.energies_with_tangent(&graph, &tangent);
        let targets: Vec<f64> = labels.iter().map(|l| l.energy).collect();
        let targets = Tensor::<B, 1>::from_data(
            TensorData::new(targets, [structures.len()]),
            (device, dtype),
        );
        let energy_mse = (energies - targets).powi_scalar(2).mean();
        let scalar = |value: f64| {
            Tensor::<B, 1>::from_data(TensorData::new(vec![value], [1]), (device, dtype))
        };
        let host_loss = force_terms(weights, terms);
        // Ė − Ė.detach(): zero in value, the force and stress terms' gradient in backward.
        let loss = energy_mse.clone() * weights.energy + along_tangent.clone()
            - along_tangent.detach()
            + scalar(host_loss);
        Ok(ForceLoss {
            loss,
            energy_mse: energy_mse.detach(),
            force_mse: scalar(terms.force_mse),
            cosine_distance: scalar(terms.cosine_distance),
            stress_mse: scalar(terms.stress_mse),
        })
    }
}

impl<B: AutodiffBackend> Painn<B> {
    /// On the CPU backends with f32 or f64 parameters, `Σ_θ θ · ∂ℓ/∂θ` with the gradient
    /// computed by the host kernel (`host/tangent.rs`) and held constant; elsewhere `None`.
    fn host_surrogate(
        &self,
        structures: &[Structure],
        labels: &[Labels],
        weights: &LossWeights,
        predicted: &Predictions,
        terms: &HostTerms,
        device: &B::Device,
    ) -> Result<Option<Tensor<B, 1>>, ForceFieldError> {
        if !is_host_backend::<B>(device) {
            return Ok(None);
        }
        // ∂(w_E MSE(E))/∂E_s.
        let energy_seeds: Vec<f64> = predicted
            .energies
            .iter()
            .zip(labels)
            .map(|(e, l)| weights.energy * 2.0 * (e - l.energy) / labels.len() as f64)
            .collect();
        let seeds = LossSeeds {
            energy_seeds: &energy_seeds,
            force_gradient: &terms.force_gradient,
            strain_tangent: terms.strain_tangent.as_deref(),
        };
        Ok(match self.representation.filter_net.weight.val().dtype() {
            DType::F32 => Some(host::loss_surrogate::<f32, B>(self, structures, &seeds)?),
            DType::F64 => Some(host::loss_surrogate::<f64, B>(self, structures, &seeds)?),
            _ => None,
        })
    }
}

/// The weighted loss `w_E MSE(E) + w_F MSE(F) + w_C mean(1 − cos) + w_S MSE(σ)` of `terms`.
fn weighted(weights: &LossWeights, terms: &HostTerms) -> f64 {
    weights.energy * terms.energy_mse + force_terms(weights, terms)
}

/// The weighted loss's force and stress terms.
fn force_terms(weights: &LossWeights, terms: &HostTerms) -> f64 {
    weights.forces * terms.force_mse
        + weights.cosine * terms.cosine_distance
        + weights.stress * terms.stress_mse
}

/// One label per structure, forces for every atom, stress where the weights need it.
fn check_labels(
    structures: &[Structure],
    labels: &[Labels],
    weights: &LossWeights,
) -> Result<(), ForceFieldError> {
    if structures.is_empty() {
        return Err(ForceFieldError::Config("an empty batch has no loss".into()));
    }
    if structures.len() != labels.len() {
        return Err(ForceFieldError::Config(format!(
            "{} structures but {} labels",
            structures.len(),
            labels.len()
        )));
    }
    for (index, (structure, label)) in structures.iter().zip(labels).enumerate() {
        check_forces(index, structure, label)?;
        if weights.stress != 0.0 && structure.volume().is_some() && label.stress.is_none() {
            return Err(ForceFieldError::Structure {
                index,
                reason: "periodic, but no stress label (the stress weight is not 0)".into(),
            });
        }
    }
    Ok(())
}

/// One force label per atom of the structure at 0-based `index`.
pub(crate) fn check_forces(
    index: usize,
    structure: &Structure,
    label: &Labels,
) -> Result<(), ForceFieldError> {
    if label.forces.len() == structure.len() {
        return Ok(());
    }
    Err(ForceFieldError::Structure {
        index,
        reason: format!(
            "{} force labels for {} atoms",
            label.forces.len(),
            structure.len()
        ),
    })
}

/// `F·F* / (max(|F|, ε) max(|F*|, ε))` with `|F|` and the denominator (for its gradient).
pub(crate) fn cosine(f: &[f64; 3], t: &[f64; 3]) -> (f64, f64, f64) {
    let dot = |a: &[f64; 3], b: &[f64; 3]| a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    let (f_norm, t_norm) = (dot(f, f).sqrt(), dot(t, t).sqrt());
    let denominator = f_norm.max(COSINE_EPS) * t_norm.max(COSINE_EPS);
    (dot(f, t) / denominator, f_norm, denominator)
}

/// The loss's value for `predicted` (energies, forces, stresses of `structures`) against
/// `labels`, on the host: what [`Painn::force_loss`] computes, without a gradient (evaluation).
#[cfg(feature = "train")]
pub(crate) fn loss_value(
    structures: &[Structure],
    labels: &[Labels],
    weights: &LossWeights,
    predicted: &Predictions,
) -> Result<f64, ForceFieldError> {
    check_labels(structures, labels, weights)?;
    Ok(weighted(
        weights,
        &host_terms(structures, labels, weights, predicted),
    ))
}

/// The loss's terms from predicted energies, forces and stresses, with the force and stress
/// terms' gradients.
fn host_terms(
    structures: &[Structure],
    labels: &[Labels],
    weights: &LossWeights,
    predicted: &Predictions,
) -> HostTerms {
    let (forces, stresses) = (&predicted.forces, &predicted.stresses);
    let energy_mse = predicted
        .energies
        .iter()
        .zip(labels)
        .map(|(e, l)| (e - l.energy).powi(2))
        .sum::<f64>()
        / labels.len().max(1) as f64;
    let atoms = forces.len();
    let targets = labels.iter().flat_map(|l| &l.forces);
    let (mut squared, mut cosine_distance) = (0.0, 0.0);
    let mut force_gradient = Vec::with_capacity(3 * atoms);
    for (f, t) in forces.iter().zip(targets) {
        let (cosine, f_norm, denominator) = cosine(f, t);
        cosine_distance += 1.0 - cosine;
        for a in 0..3 {
            let residual = f[a] - t[a];
            squared += residual * residual;
            // ∂cos/∂F = F*/(|F| |F*|) − cos F/|F|² (the second term vanishes where |F| is clamped).
            let mut cosine_slope = t[a] / denominator;
            if f_norm > COSINE_EPS {
                cosine_slope -= cosine * f[a] / (f_norm * f_norm);
            }
            force_gradient.push(
                weights.forces * 2.0 * residual / (3 * atoms) as f64
                    - weights.cosine * cosine_slope / atoms as f64,
            );
        }
    }
    let stressed: Vec<usize> = (0..structures.len())
        .filter(|&s| weights.stress != 0.0 && stresses[s].is_some() && labels[s].stress.is_some())
        .collect();
    let mut stress_squared = 0.0;
    let strain_tangent = (!stressed.is_empty()).then(|| {
        let mut tangent = vec![0.0; 9 * structures.len()];
        let components = (9 * stressed.len()) as f64;
        for &s in &stressed {
            let (predicted, target) = (
                stresses[s].unwrap_or_default(),
                labels[s].stress.unwrap_or_default(),
            );
            let volume = structures[s].volume().unwrap_or(1.0);
            let residual: [[f64; 3]; 3] =
                std::array::from_fn(|a| std::array::from_fn(|b| predicted[a][b] - target[a][b]));
            for a in 0..3 {
                for b in 0..3 {
                    stress_squared += residual[a][b] * residual[a][b];
                    let symmetric = 0.5 * (residual[a][b] + residual[b][a]);
                    tangent[9 * s + 3 * a + b] =
                        weights.stress * 2.0 * symmetric / components / volume;
                }
            }
        }
        tangent
    });
    HostTerms {
        energy_mse,
        force_mse: squared / (3 * atoms).max(1) as f64,
        cosine_distance: cosine_distance / atoms.max(1) as f64,
        stress_mse: if stressed.is_empty() {
            0.0
        } else {
            stress_squared / (9 * stressed.len()) as f64
        },
        force_gradient,
        strain_tangent,
    }
}
