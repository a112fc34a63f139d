//! PaiNN energies, forces and stresses on every compiled backend against schnetpack's, in f32 on
//! kiln-forcefield's committed fixtures (molecules, periodic cells, an isolated atom): the same
//! model code, graph batching and scatter-adds on Flex, NdArray, wgpu and CUDA.

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use kiln::forcefield::{Painn, Predictions, read_extxyz};
use kiln::precision::{DeviceJob, DeviceSpec};

#[macro_use]
mod common;

use common::{forcefield_fixtures as fixtures, max_abs_diff};

/// Both fixture potentials over every fixture structure, as one batch each.
struct Predict;

impl DeviceJob for Predict {
    type Output = Vec<(&'static str, Predictions)>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let text = std::fs::read_to_string(fixtures().join("structures.extxyz")).unwrap();
        let structures: Vec<_> = read_extxyz(&text)
            .unwrap()
            .into_iter()
            .map(|frame| frame.structure)
            .collect();
        ["painn_gaussian", "painn_bessel_shared"]
            .into_iter()
            .map(|name| {
                let model = Painn::<Autodiff<B>>::from_dir(fixtures().join(name), device).unwrap();
                (name, model.predict(&structures, device).unwrap())
            })
            .collect()
    }
}

/// f64 values of `key` in a schnetpack reference file.
fn reference(name: &str, key: &str) -> Vec<f64> {
    common::read_f64(&fixtures().join(format!("{name}.safetensors")), key)
}

fn check(device: DeviceSpec) {
    for (name, predictions) in device.run(Predict).unwrap() {
        let energy = max_abs_diff(&predictions.energies, &reference(name, "energy_f64"));
        let forces: Vec<f64> = predictions.forces.iter().flatten().copied().collect();
        let force = max_abs_diff(&forces, &reference(name, "forces_f64"));
        let stresses: Vec<f64> = predictions
            .stresses
            .iter()
            .flatten()
            .flat_map(|s| s.iter().flatten().copied())
            .collect();
        let stress = max_abs_diff(&stresses, &reference(name, "stress_f64"));
        common::say(&format!(
            "{device} {name}: |ΔE| {energy:.1e} eV, |ΔF| {force:.1e} eV/Å, |Δσ| {stress:.1e} eV/Å³"
        ));
        let slack = common::tf32_slack(device);
        assert!(
            energy <= 1e-4 * slack,
            "{device} {name}: energies off by {energy:e}"
        );
        assert!(
            force <= 1e-4 * slack,
            "{device} {name}: forces off by {force:e}"
        );
        assert!(
            stress <= 1e-6 * slack,
            "{device} {name}: stresses off by {stress:e}"
        );
    }
}

backend_tests!("force-field parity test"; cpu, ndarray, wgpu, cuda);
