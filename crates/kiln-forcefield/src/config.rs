//! The `config.json` next to a `model.safetensors`: schnetpack's PaiNN hyper-parameters in
//! kiln-forcefield's format.

use std::path::Path;

use kiln_core::{MAX_LAYERS, MAX_WIDTH, check_limits};

use serde::{Deserialize, Serialize};

use crate::ForceFieldError;

/// The radial basis the interatomic distances are expanded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RadialBasisKind {
    /// schnetpack `GaussianRBF`: `n_rbf` Gaussians centred from 0 to the cutoff, each as wide as
    /// the spacing of their centres.
    Gaussian,
    /// schnetpack `BesselRBF`: `sin(k π d / rc) / d`, k = 1 … n_rbf.
    Bessel,
}

/// The cutoff function that takes filters smoothly to 0 at the cutoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CutoffFn {
    /// schnetpack `CosineCutoff`: `½ (cos(π d / rc) + 1)` below rc, 0 beyond.
    Cosine,
}

/// A PaiNN potential: representation, readout and energy offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PainnConfig {
    /// Always `"painn"`.
    pub representation: String,
    /// Feature width F.
    pub n_atom_basis: usize,
    /// Interaction (and mixing) blocks.
    pub n_interactions: usize,
    /// Radial basis functions.
    pub n_rbf: usize,
    /// Cutoff radius in Å.
    pub cutoff: f64,
    /// Radial basis.
    pub radial_basis: RadialBasisKind,
    /// Cutoff function.
    pub cutoff_fn: CutoffFn,
    /// One set of interaction and mixing weights for every block.
    #[serde(default)]
    pub shared_interactions: bool,
    /// One filter network output for every block.
    #[serde(default)]
    pub shared_filters: bool,
    /// Rows of the element embedding: atomic numbers must be below it.
    #[serde(default = "default_max_z")]
    pub max_z: usize,
    /// Layers of the Atomwise readout MLP.
    #[serde(default = "default_readout_layers")]
    pub readout_n_layers: usize,
    /// Hidden width of the readout; `None` halves the width layer by layer (schnetpack's
    /// pyramid).
    #[serde(default)]
    pub readout_n_hidden: Option<usize>,
    /// Energy added per atom to the model's output.
    #[serde(default)]
    pub mean_per_atom: f64,
    /// Reference energy of each element in eV, indexed by atomic number (schnetpack's
    /// `atomref`, `max_z` values): added for every atom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atomref: Option<Vec<f64>>,
    /// The elements (atomic numbers, sorted) of the set a kiln-trained model was trained on:
    /// evaluating others is a warning. Absent for models trained elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_elements: Option<Vec<u32>>,
}

fn default_max_z() -> usize {
    100
}

fn default_readout_layers() -> usize {
    2
}

impl PainnConfig {
    /// Bytes each ordered neighbour pair takes while a structure is evaluated with forces,
    /// floats of `element` bytes: its filters and their gradients (3F a set of filters, one set
    /// a block unless `shared_filters`, for each unordered pair: 3F × sets floats an ordered
    /// pair), its radial basis and that basis's derivative and gradient, its geometry and
    /// gradients (40 floats), and its indices in the neighbour and pair lists (64 bytes).
    ///
    /// The host kernel's peak, measured from Python on dense hydrogen grids (8 000 atoms,
    /// 2.2–4.2 M pairs), is 645 B a pair (f32) and 1 231 B (f64) for F 16, 2 unshared sets, 7
    /// radial functions, where this gives 664 and 1 264; 379 and 656 B for F 12, shared, 5
    /// functions, where this gives 408 and 752. The tensor graph holds at least as much.
    pub fn bytes_per_pair(&self, element: usize) -> u64 {
        let sets = if self.shared_filters {
            1
        } else {
            self.n_interactions
        };
        let floats = 3 * self.n_atom_basis * sets + 2 * self.n_rbf + 40;
        (floats as u64)
            .saturating_mul(element as u64)
            .saturating_add(64)
    }

    /// Refuses structure `index` (0-based) when its `pairs` neighbour pairs need more than
    /// `available` bytes (see [`bytes_per_pair`](Self::bytes_per_pair)): atoms packed far closer
    /// than any real structure's, or one far too large for the machine, are said as such
    /// instead of ending the process in a failed allocation (from Python, the interpreter).
    pub fn check_pairs(
        &self,
        index: usize,
        pairs: usize,
        element: usize,
        available: Option<u64>,
    ) -> Result<(), ForceFieldError> {
        let needed = (pairs as u64).saturating_mul(self.bytes_per_pair(element));
        match available {
            Some(available) if needed > available => Err(ForceFieldError::Structure {
                index,
                reason: format!(
                    "its {pairs} neighbour pairs within {} Å need about {} for the model's \
                     filters (n_atom_basis {}, n_interactions {}), but {} is available: are its \
                     atoms this close, or its lengths in Å? Evaluate smaller pieces of it",
                    self.cutoff,
                    kiln_core::human_bytes(needed),
                    self.n_atom_basis,
                    self.n_interactions,
                    kiln_core::human_bytes(available)
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Reads `config.json` (or the model directory holding it) and checks it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ForceFieldError> {
        let (file, config): (_, PainnConfig) = kiln_core::read_config(path.as_ref())?;
        config
            .validate()
            .map_err(|e| ForceFieldError::Config(format!("{}: {e}", file.display())))?;
        Ok(config)
    }

    /// Checks the hyper-parameters describe a model kiln can build.
    pub fn validate(&self) -> Result<(), ForceFieldError> {
        let fail = |what: String| Err(ForceFieldError::Config(what));
        if self.representation != "painn" {
            return fail(format!(
                "representation `{}`: only `painn` is supported",
                self.representation
            ));
        }
        if self.n_atom_basis == 0 || self.n_interactions == 0 || self.n_rbf == 0 {
            return fail("n_atom_basis, n_interactions and n_rbf must be at least 1".into());
        }
        if !(self.cutoff > 0.0 && self.cutoff.is_finite()) {
            return fail(format!(
                "cutoff {}: must be a positive length in Å",
                self.cutoff
            ));
        }
        if self.readout_n_layers == 0 {
            return fail("readout_n_layers must be at least 1".into());
        }
        // Stated limits: blocks and layers are built before a checkpoint's shapes are read, and
        // the radial basis's centres are made at once.
        check_limits(&[
            ("n_interactions", self.n_interactions, MAX_LAYERS),
            ("readout_n_layers", self.readout_n_layers, MAX_LAYERS),
            ("n_rbf", self.n_rbf, 4096),
            ("n_atom_basis", self.n_atom_basis, MAX_WIDTH),
            (
                "readout_n_hidden",
                self.readout_n_hidden.unwrap_or(0),
                MAX_WIDTH,
            ),
            ("max_z", self.max_z, MAX_WIDTH),
        ])
        .map_err(|e| ForceFieldError::Config(e.to_string()))?;
        if let Some(atomref) = &self.atomref {
            if atomref.len() != self.max_z {
                return fail(format!(
                    "atomref has {} values: one per atomic number below max_z = {} expected",
                    atomref.len(),
                    self.max_z
                ));
            }
            if let Some(z) = atomref.iter().position(|e| !e.is_finite()) {
                return fail(format!("atomref[{z}] is not finite"));
            }
        }
        if let Some(z) = self
            .trained_elements
            .iter()
            .flatten()
            .find(|&&z| z as usize >= self.max_z)
        {
            return fail(format!(
                "trained_elements holds {z}, beyond max_z = {}",
                self.max_z
            ));
        }
        Ok(())
    }

    /// The elements of `structures` (sorted) this model was not trained on, when it records
    /// what it was trained on.
    pub fn unseen_elements(&self, structures: &[crate::Structure]) -> Vec<u32> {
        let Some(trained) = &self.trained_elements else {
            return Vec::new();
        };
        let mut unseen: Vec<u32> = structures
            .iter()
            .flat_map(|s| s.numbers.iter().copied())
            .filter(|z| trained.binary_search(z).is_err())
            .collect();
        unseen.sort_unstable();
        unseen.dedup();
        unseen
    }

    /// The widths of the readout MLP from input to the single output, as schnetpack's
    /// `build_mlp` makes them.
    pub fn readout_widths(&self) -> Vec<usize> {
        let layers = self.readout_n_layers;
        let mut widths = vec![self.n_atom_basis];
        match self.readout_n_hidden {
            Some(hidden) => widths.extend(std::iter::repeat_n(hidden, layers - 1)),
            None => {
                let mut width = self.n_atom_basis;
                for _ in 1..layers {
                    width = (width / 2).max(1);
                    widths.push(width);
                }
            }
        }
        widths.push(1);
        widths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Result<PainnConfig, String> {
        let config: PainnConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    const BASE: &str = r#""representation": "painn", "n_atom_basis": 128, "n_interactions": 3,
        "n_rbf": 20, "cutoff": 5.0, "radial_basis": "gaussian", "cutoff_fn": "cosine""#;

    #[test]
    fn unseen_elements_are_those_outside_the_training_set() {
        let mut config: PainnConfig = serde_json::from_str(&format!("{{{BASE}}}")).unwrap();
        let water = crate::Structure::molecule(vec![8, 1, 1], vec![[0.0; 3]; 3]);
        let ammonia = crate::Structure::molecule(vec![7, 1, 1, 1], vec![[0.0; 3]; 4]);
        let both = [water, ammonia];
        assert!(
            config.unseen_elements(&both).is_empty(),
            "nothing recorded, nothing unseen"
        );
        config.trained_elements = Some(vec![1, 6, 8]);
        assert_eq!(config.unseen_elements(&both), [7]);
        config.trained_elements = Some(vec![1, 200]);
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("trained_elements holds 200"), "{err}");
    }

    #[test]
    fn readout_widths_follow_build_mlp() {
        let pyramid = config(&format!("{{{BASE}}}")).unwrap();
        assert_eq!(pyramid.readout_widths(), vec![128, 64, 1]);
        let three = config(&format!("{{{BASE}, \"readout_n_layers\": 3}}")).unwrap();
        assert_eq!(three.readout_widths(), vec![128, 64, 32, 1]);
        let hidden = config(&format!(
            "{{{BASE}, \"readout_n_layers\": 3, \"readout_n_hidden\": 9}}"
        ))
        .unwrap();
        assert_eq!(hidden.readout_widths(), vec![128, 9, 9, 1]);
        assert_eq!(pyramid.max_z, 100);
    }

    #[test]
    fn bad_configs_are_explained() {
        let err = config(&format!(
            "{{{}}}",
            BASE.replace("\"cosine\"", "\"mollifier\"")
        ))
        .unwrap_err();
        assert!(err.contains("mollifier"), "{err}");
        let err = config(&format!("{{{}}}", BASE.replace("\"painn\"", "\"schnet\""))).unwrap_err();
        assert!(err.contains("schnet"), "{err}");
        let err = config(&format!("{{{}}}", BASE.replace("5.0", "-1"))).unwrap_err();
        assert!(err.contains("positive"), "{err}");
        let err = config(&format!(
            "{{{BASE}, \"max_z\": 3, \"atomref\": [0, -13.6]}}"
        ))
        .unwrap_err();
        assert!(err.contains("atomref has 2 values"), "{err}");
    }

    /// The issue's case: 64 000 atoms 0.9 Å apart have ~720 neighbours each within 5 Å, 46
    /// million pairs: a seed-size model's filters alone take over 200 GB. Refused from the
    /// count, naming the structure; a molecule's pairs pass.
    #[test]
    fn pairs_beyond_the_memory_are_refused_before_allocating() {
        let config = config(&format!("{{{BASE}}}")).unwrap();
        // 3 · 128 · 3 filters, 2 · 20 radial and 40 geometry floats of 4 bytes, 64 of indices.
        assert_eq!(
            config.bytes_per_pair(4),
            (3 * 128 * 3 + 2 * 20 + 40) * 4 + 64
        );
        let dense = 64_000 * 720;
        let err = config
            .check_pairs(4, dense, 4, Some(24_000_000_000))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("structure 5")
                && err.contains("46080000 neighbour pairs")
                && err.contains("230.0 GB")
                && err.contains("24.0 GB is available"),
            "{err}"
        );
        config.check_pairs(0, 3 * 2, 4, Some(1_000_000)).unwrap();
        // Where the memory cannot be read, nothing is refused.
        config.check_pairs(0, dense, 4, None).unwrap();
    }

    /// The estimate covers the host kernel's peak as measured from Python (dense hydrogen
    /// grids, energy and forces; see `bytes_per_pair`), exceeding it by at most a fifth.
    #[test]
    fn the_pair_estimate_covers_the_measured_peaks() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        for (model, f32_peak, f64_peak) in [
            ("painn_gaussian", 645, 1231),
            ("painn_bessel_shared", 379, 656),
        ] {
            let config = PainnConfig::from_file(format!("{fixtures}/{model}")).unwrap();
            for (element, peak) in [(4, f32_peak), (8, f64_peak)] {
                let estimate = config.bytes_per_pair(element);
                assert!(
                    (peak..=peak * 6 / 5).contains(&estimate),
                    "{model}, {element}-byte floats: {estimate} B a pair for a {peak} B peak"
                );
            }
        }
    }
}
