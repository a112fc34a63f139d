//! The force-matching loss and its gradient with respect to every parameter against PyTorch's
//! double backward through schnetpack (scripts/fixtures/painn_gradients.py): both fixture
//! models, all fixture structures in one batch (molecules, periodic cells with stress labels, an
//! isolated atom), energy, force, cosine and stress terms with unequal weights. Both ways kiln
//! computes it: `force_loss` on Flex runs the host kernel's tangent pass and reverse by hand,
//! `force_loss_tensors` the tensor operations of `dual.rs` under burn's autodiff.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::Precision;
use kiln_forcefield::{Labels, LossWeights, Painn};

use crate::support;

use support::{B, fixtures, names, read, structures};

/// The gradient of every parameter by its state-dict key (PyTorch's layout: linear weights
/// `[out, in]`).
struct Gradients<'a> {
    gradients: &'a <B as AutodiffBackend>::Gradients,
    path: Vec<String>,
    found: BTreeMap<String, Vec<f64>>,
}

impl ModuleVisitor<B> for Gradients<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(gradient) = param.val().grad(self.gradients) else {
            return; // the radial basis's and the cutoff's constants
        };
        let key = self.path.join(".");
        let linear_weight = D == 2 && key.ends_with(".weight") && !key.contains("embedding");
        let gradient = if linear_weight {
            gradient.transpose()
        } else {
            gradient
        };
        let values = gradient.into_data().convert::<f64>().to_vec().unwrap();
        self.found.insert(key, values);
    }
}

/// The fixture's labels: perturbed schnetpack outputs, stresses on the periodic structures.
fn labels(file: &str) -> Vec<Labels> {
    let (energy, forces) = (read(file, "target_energy"), read(file, "target_forces"));
    let stress = read(file, "target_stress");
    let (mut atom, mut cell) = (0, 0);
    structures()
        .iter()
        .enumerate()
        .map(|(s, structure)| {
            let forces = (atom..atom + structure.len())
                .map(|a| std::array::from_fn(|k| forces[3 * a + k]))
                .collect();
            atom += structure.len();
            let stress = structure.volume().map(|_| {
                cell += 1;
                std::array::from_fn(|a| std::array::from_fn(|b| stress[9 * (cell - 1) + 3 * a + b]))
            });
            Labels {
                energy: energy[s],
                forces,
                stress,
            }
        })
        .collect()
}

/// `key` with a shared block's index replaced by 0: shared interaction and mixing blocks are one
/// module in schnetpack (one gradient, summed over the blocks), copies in kiln.
fn canonical(key: &str, shared: bool) -> String {
    if !shared {
        return key.to_string();
    }
    let mut parts: Vec<String> = key.split('.').map(String::from).collect();
    for k in 1..parts.len().saturating_sub(1) {
        if matches!(parts[k].as_str(), "interactions" | "mixing") {
            parts[k + 1] = "0".into();
        }
    }
    parts.join(".")
}

/// How the loss's gradient is computed.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `force_loss` (the host kernel on Flex).
    Host,
    /// `force_loss_tensors`.
    Tensors,
}

/// Loss and gradients of fixture model `name` in `precision` against the reference `suffix`,
/// to `tolerance` relative to each tensor's largest reference gradient, both ways.
fn check(name: &str, precision: Precision, suffix: &str, tolerance: f64) {
    for path in [Path::Host, Path::Tensors] {
        check_path(name, precision, suffix, tolerance, path);
    }
}

fn check_path(name: &str, precision: Precision, suffix: &str, tolerance: f64, path: Path) {
    let device = Default::default();
    let model = Painn::<B>::from_dir(fixtures().join(name), &device)
        .unwrap()
        .with_precision(precision);
    let shared = model.config().shared_interactions;
    let file = format!("{name}_gradients.safetensors");
    let w = read(&file, "weights");
    let weights = LossWeights {
        energy: w[0],
        forces: w[1],
        cosine: w[2],
        stress: w[3],
    };
    let (structures, labels) = (structures(), labels(&file));
    let loss = match path {
        Path::Host => model.force_loss(&structures, &labels, &weights, &device),
        Path::Tensors => model.force_loss_tensors(&structures, &labels, &weights, &device),
    }
    .unwrap();
    // (into_scalar would give the backend's default float, f32.)
    let value = loss
        .loss
        .clone()
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .unwrap()[0];
    let expected = read(&file, &format!("loss_{suffix}"))[0];
    assert!(
        (value - expected).abs() <= tolerance * expected.abs(),
        "{name} {precision:?} {path:?}: loss {value} against schnetpack's {expected}"
    );
    let gradients = loss.loss.backward();
    let mut visitor = Gradients {
        gradients: &gradients,
        path: Vec::new(),
        found: BTreeMap::new(),
    };
    model.visit(&mut visitor);
    let mut summed: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (key, values) in visitor.found {
        let entry = summed
            .entry(canonical(&key, shared))
            .or_insert_with(|| vec![0.0; values.len()]);
        entry.iter_mut().zip(&values).for_each(|(a, b)| *a += b);
    }
    let prefix = format!("grad_{suffix}.");
    let reference: Vec<String> = names(&file)
        .into_iter()
        .filter_map(|n| n.strip_prefix(&prefix).map(String::from))
        .filter(|key| canonical(key, shared) == *key)
        .collect();
    assert_eq!(
        summed.keys().cloned().collect::<Vec<_>>(),
        {
            let mut keys = reference.clone();
            keys.sort();
            keys
        },
        "{name}: one gradient per trainable parameter"
    );
    for key in &reference {
        let expected = read(&file, &format!("{prefix}{key}"));
        let ours = &summed[key];
        let scale = expected.iter().fold(0.0_f64, |m, g| m.max(g.abs()));
        assert!(
            ours.iter().chain(&expected).all(|g| g.is_finite()),
            "{name} {precision:?} {path:?} {key}: a gradient is not finite"
        );
        let error = support::worst(ours, &expected);
        assert!(
            error <= tolerance * scale,
            "{name} {precision:?} {path:?} {key}: gradient off by {error:e} (largest {scale:e}, relative {:e})",
            error / scale
        );
    }
}

/// Measured: 4e-14 of a tensor's largest gradient, both paths.
#[test]
fn f64_gradients_match_schnetpacks_double_backward() {
    check("painn_gaussian", Precision::F64, "f64", 1e-8);
    check("painn_bessel_shared", Precision::F64, "f64", 1e-8);
}

/// Both sides round in f32 (unit roundoff 6e-8) through ~10 layers forward, the tangent and the
/// reverse pass, in different orders of summation; the force and stress terms then multiply
/// those errors by residuals `F − F*` a tenth the size of the forces. Measured worst: 2.5e-5 of
/// a tensor's largest gradient (1.8e-5 on both paths in a later run); the bound leaves 8× room.
#[test]
fn f32_gradients_match_schnetpacks_double_backward() {
    check("painn_gaussian", Precision::F32, "f32", 2e-4);
    check("painn_bessel_shared", Precision::F32, "f32", 2e-4);
}
