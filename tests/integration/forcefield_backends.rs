//! PaiNN energies, forces and stresses on every compiled backend against schnetpack's, in f32 on
//! kiln-forcefield's committed fixtures (molecules, periodic cells, an isolated atom): the same
//! model code, graph batching and scatter-adds on Flex, NdArray, wgpu and CUDA. And the message
//! passing under it ([`RowIndex`]'s gather and scatter-add, values and gradients) against sums
//! written out by hand, with a count that shows burn's GPU backends take kiln's segment-sum
//! kernel, forward and backward.

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln::core::{DeviceJob, DeviceSpec};
use kiln::forcefield::{Painn, Predictions, read_extxyz};
use kiln::kernels::{RowIndex, segment_sum_launches};

use crate::common;

use common::{forcefield_fixtures as fixtures, max_abs_diff};

/// Both fixture potentials over every fixture structure, as one batch each.
struct Predict;

impl DeviceJob for Predict {
    /// Each potential's predictions, and the segment sums launched for them.
    type Output = (Vec<(&'static str, Predictions)>, u64);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let launches = segment_sum_launches();
        let text = std::fs::read_to_string(fixtures().join("structures.extxyz")).unwrap();
        let structures: Vec<_> = read_extxyz(&text)
            .unwrap()
            .into_iter()
            .map(|frame| frame.structure)
            .collect();
        let predictions = ["painn_gaussian", "painn_bessel_shared"]
            .into_iter()
            .map(|name| {
                let model = Painn::<Autodiff<B>>::from_dir(fixtures().join(name), device).unwrap();
                (name, model.predict(&structures, device).unwrap())
            })
            .collect();
        (predictions, segment_sum_launches() - launches)
    }
}

/// Gathered rows scaled and summed into other rows, differentiated:
/// `out = dest + scatter_s(gather_g(x) ⊙ w)`, `loss = Σ out ⊙ v`.
struct MessagePassing;

/// `x` `[4, 3]`: rows gathered by `GATHER` (row 2 never), summed into `[5, 3]` by `SCATTER`
/// (row 3 receives nothing, row 1 three times).
const GATHER: [i64; 6] = [3, 0, 1, 3, 0, 0];
const SCATTER: [i64; 6] = [1, 4, 1, 0, 1, 2];

/// Deterministic values for element `i` of a tensor numbered `k`.
fn value(k: usize, i: usize) -> f32 {
    ((k * 31 + i) as f32 * 0.37).sin()
}

fn values(k: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| value(k, i)).collect()
}

/// `out`, `∂loss/∂x` and `∂loss/∂dest` summed by hand in f64.
fn by_hand() -> [Vec<f64>; 3] {
    let (x, w, dest, v) = (values(0, 12), values(1, 18), values(2, 15), values(3, 15));
    let mut out: Vec<f64> = dest.iter().map(|&d| f64::from(d)).collect();
    let mut grad_x = vec![0.0; 12];
    for p in 0..6 {
        let (g, s) = (GATHER[p] as usize, SCATTER[p] as usize);
        for c in 0..3 {
            out[3 * s + c] += f64::from(x[3 * g + c]) * f64::from(w[3 * p + c]);
            grad_x[3 * g + c] += f64::from(v[3 * s + c]) * f64::from(w[3 * p + c]);
        }
    }
    [out, grad_x, v.iter().map(|&v| f64::from(v)).collect()]
}

impl DeviceJob for MessagePassing {
    /// `out`, the two gradients, and the segment sums launched for them.
    type Output = ([Vec<f64>; 3], u64);

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        type A<B> = Autodiff<B>;
        let launches = segment_sum_launches();
        let tensor = |k: usize, dims: [usize; 2]| {
            let data = TensorData::new(values(k, dims[0] * dims[1]), dims);
            Tensor::<A<B>, 2>::from_data(data, device)
        };
        let x = tensor(0, [4, 3]).require_grad();
        let dest = tensor(2, [5, 3]).require_grad();
        let gather = RowIndex::<A<B>>::new(&GATHER, 4, device).unwrap();
        let scatter = RowIndex::<A<B>>::new(&SCATTER, 5, device).unwrap();
        let out = scatter.scatter_add(dest.clone(), gather.gather(x.clone()) * tensor(1, [6, 3]));
        let grads = (out.clone() * tensor(3, [5, 3])).sum().backward();
        let read = |t: Tensor<B, 2>| t.into_data().convert::<f64>().to_vec::<f64>().unwrap();
        let results = [
            read(out.inner()),
            read(x.grad(&grads).unwrap()),
            read(dest.grad(&grads).unwrap()),
        ];
        (results, segment_sum_launches() - launches)
    }
}

/// f64 values of `key` in a schnetpack reference file.
fn reference(name: &str, key: &str) -> Vec<f64> {
    common::read_f64(&fixtures().join(format!("{name}.safetensors")), key)
}

/// Whether `device` is one of burn's GPU backends, where the segment sum is kiln's kernel.
fn on_gpu(device: DeviceSpec) -> bool {
    !matches!(device, DeviceSpec::Flex | DeviceSpec::NdArray)
}

fn check(device: DeviceSpec) {
    let (results, launches) = device.run(MessagePassing).unwrap();
    for ((name, got), want) in ["out", "∂/∂x", "∂/∂dest"]
        .iter()
        .zip(&results)
        .zip(by_hand())
    {
        let diff = max_abs_diff(got, &want);
        assert!(
            diff <= 1e-5,
            "{device} message passing: {name} off by {diff:e}"
        );
    }
    // The sum into rows forward, the gather's backward; the sum's backward is a gather.
    assert_eq!(launches, if on_gpu(device) { 2 } else { 0 }, "{device}");

    let (potentials, launches) = device.run(Predict).unwrap();
    assert_eq!(
        on_gpu(device),
        launches > 0,
        "{device}: {launches} segment sums"
    );
    for (name, predictions) in potentials {
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
