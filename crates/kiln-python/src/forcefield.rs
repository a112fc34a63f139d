//! A PaiNN potential from Python: `Potential(model_dir, device, dtype).predict(structures)`,
//! what `kiln.forcefield.Calculator` (an ASE calculator) calls.

use std::path::PathBuf;
use std::sync::Mutex;

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_core::{DeviceJob, Precision};
use kiln_forcefield::{Doubt, ForceFieldError, Painn, Predictions, Predictor, Structure};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;

/// A loaded potential on its device, whichever backend that is.
trait Evaluate: Send {
    fn predict(&self, structures: &[Structure]) -> Result<Predictions, ForceFieldError>;
}

impl<B: AutodiffBackend> Evaluate for Predictor<B> {
    fn predict(&self, structures: &[Structure]) -> Result<Predictions, ForceFieldError> {
        Predictor::predict(self, structures)
    }
}

/// Loads the model directory on the job's backend, parameters in `precision`.
struct Load {
    dir: PathBuf,
    precision: Precision,
}

impl DeviceJob for Load {
    type Output = PyResult<(Box<dyn Evaluate>, usize, f64)>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let model = Painn::<Autodiff<B>>::from_dir(&self.dir, device)
            .map_err(|e| error(&e))?
            .with_precision(self.precision);
        let (max_z, cutoff) = (model.config().max_z, model.config().cutoff);
        Ok((Box::new(Predictor::new(model, device)), max_z, cutoff))
    }
}

/// One structure as Python gives it: atomic numbers `[n]`, positions `[n, 3]` (Å), cell `[3, 3]`
/// (rows are lattice vectors, Å) and periodicity along each lattice vector.
type StructureArrays<'py> = (
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray2<'py, f64>,
    PyReadonlyArray2<'py, f64>,
    [bool; 3],
);

/// What one structure gets: energy (eV), forces `[n, 3]` (eV/Å) and, for cells periodic along
/// all three vectors, the stress `[3, 3]` (eV/Å³, ASE's sign).
type StructureResult<'py> = (
    f64,
    Bound<'py, PyArray2<f64>>,
    Option<Bound<'py, PyArray2<f64>>>,
);

/// A PaiNN potential (a kiln-trained or schnetpack state dict with kiln's config.json) loaded
/// on one device.
#[pyclass(module = "kiln._kiln", frozen)]
pub struct Potential {
    model: Mutex<Box<dyn Evaluate>>,
    max_z: usize,
    cutoff: f64,
}

#[pymethods]
impl Potential {
    /// Loads `model_dir` (model.safetensors and config.json) on `device`, parameters in `dtype`
    /// (`float32` or `float64`).
    #[new]
    #[pyo3(signature = (model_dir, device = "cpu", dtype = "float32"))]
    fn new(py: Python<'_>, model_dir: PathBuf, device: &str, dtype: &str) -> PyResult<Self> {
        let precision = match dtype {
            "float32" | "f32" => Precision::F32,
            "float64" | "f64" => Precision::F64,
            other => {
                return Err(PyValueError::new_err(format!(
                    "dtype {other:?}: expected \"float32\" or \"float64\""
                )));
            }
        };
        let job = Load {
            dir: model_dir,
            precision,
        };
        let (model, max_z, cutoff) = crate::released(py, || crate::on_device(device, job))???;
        Ok(Potential {
            model: Mutex::new(model),
            max_z,
            cutoff,
        })
    }

    /// The model's cutoff radius, Å.
    #[getter]
    fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// One more than the largest atomic number the model embeds.
    #[getter]
    fn max_z(&self) -> usize {
        self.max_z
    }

    /// Energies, forces and stresses of `structures` (each `(numbers, positions, cell, pbc)`),
    /// evaluated together as one batch.
    fn predict<'py>(
        &self,
        py: Python<'py>,
        structures: Vec<StructureArrays<'py>>,
    ) -> PyResult<Vec<StructureResult<'py>>> {
        let structures = structures
            .iter()
            .enumerate()
            .map(|(index, arrays)| self.structure(index, arrays))
            .collect::<PyResult<Vec<_>>>()?;
        let predictions = crate::released(py, || {
            let model = self.model.lock().map_err(|_| crate::poisoned())?;
            model.predict(&structures).map_err(|e| error(&e))
        })??;
        results(py, &structures, &predictions)
    }
}

impl Potential {
    /// Structure `index` from its arrays, refused (1-based, with the reason) when the model
    /// cannot evaluate it.
    fn structure(&self, index: usize, arrays: &StructureArrays<'_>) -> PyResult<Structure> {
        let (numbers, positions, cell, pbc) = arrays;
        let fail =
            |reason: String| PyValueError::new_err(format!("structure {}: {reason}", index + 1));
        let (numbers, positions, cell) =
            (numbers.as_array(), positions.as_array(), cell.as_array());
        if positions.ncols() != 3 || positions.nrows() != numbers.len() {
            return Err(fail(format!(
                "positions are {:?} for {} atomic numbers: expected ({}, 3)",
                positions.shape(),
                numbers.len(),
                numbers.len()
            )));
        }
        if cell.shape() != [3, 3] {
            return Err(fail(format!(
                "the cell is {:?}, expected (3, 3)",
                cell.shape()
            )));
        }
        let numbers = numbers
            .iter()
            .enumerate()
            .map(|(atom, &z)| {
                u32::try_from(z)
                    .map_err(|_| fail(format!("atom {} has atomic number {z}", atom + 1)))
            })
            .collect::<PyResult<Vec<u32>>>()?;
        let positions = positions
            .rows()
            .into_iter()
            .map(|r| [r[0], r[1], r[2]])
            .collect();
        let cell = std::array::from_fn(|i| std::array::from_fn(|j| cell[[i, j]]));
        // The model checks the rest (elements, finite positions, overlaps) when it predicts.
        Ok(Structure::periodic(numbers, positions, cell, *pbc))
    }
}

/// Per-structure results as numpy arrays; a non-finite result is an error, an implausible one
/// a warning.
fn results<'py>(
    py: Python<'py>,
    structures: &[Structure],
    predictions: &Predictions,
) -> PyResult<Vec<StructureResult<'py>>> {
    let mut first = 0;
    let mut out = Vec::with_capacity(structures.len());
    for (s, structure) in structures.iter().enumerate() {
        let atoms = structure.len();
        match predictions.doubt(s, first, atoms) {
            Some(doubt @ Doubt::NonFinite { .. }) => {
                return Err(PyRuntimeError::new_err(format!(
                    "structure {}: {doubt}",
                    s + 1
                )));
            }
            Some(doubt) => {
                let message = format!("structure {}: {doubt}", s + 1);
                PyErr::warn(
                    py,
                    &py.get_type::<PyUserWarning>(),
                    &std::ffi::CString::new(message)?,
                    1,
                )?;
            }
            None => {}
        }
        let forces: Vec<f64> = predictions.forces[first..first + atoms]
            .iter()
            .flatten()
            .copied()
            .collect();
        let forces = Array2::from_shape_vec((atoms, 3), forces).expect("three per atom");
        let stress = predictions.stresses[s].map(|stress| {
            let values = stress.iter().flatten().copied().collect();
            Array2::from_shape_vec((3, 3), values)
                .expect("3 × 3")
                .into_pyarray(py)
        });
        out.push((predictions.energies[s], forces.into_pyarray(py), stress));
        first += atoms;
    }
    Ok(out)
}

/// A force-field error as the Python exception it is.
fn error(error: &ForceFieldError) -> PyErr {
    match error {
        ForceFieldError::Checkpoint(e) => crate::checkpoint_error(e),
        ForceFieldError::Config(_) | ForceFieldError::Structure { .. } => {
            PyValueError::new_err(error.to_string())
        }
    }
}
