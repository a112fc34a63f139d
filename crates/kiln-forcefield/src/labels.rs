//! Reference labels of training frames: the energy (a comment-line value), the forces (a
//! per-atom column) and optionally the stress, under configurable names. ASE writes a
//! `SinglePointCalculator`'s results as `energy=…` and a `forces:R:3` column (and reads them
//! back into one); other tools write `REF_energy`, `dft_forces` and the like.

use serde::{Deserialize, Serialize};

use crate::ForceFieldError;
use crate::extxyz::Frame;

/// Where a frame's labels are: the comment-line keys of the energy and the stress, the column
/// of the forces. The default is ASE's calculator names, without stress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelKeys {
    /// Comment-line key of the energy (eV).
    pub energy: String,
    /// Per-atom `R:3` column of the forces (eV/Å).
    pub forces: String,
    /// Comment-line key of the stress (eV/Å³: 9 values row-major, or ASE's Voigt order
    /// `xx yy zz yz xz xy`), if stress is trained on.
    pub stress: Option<String>,
}

impl Default for LabelKeys {
    fn default() -> Self {
        LabelKeys {
            energy: "energy".into(),
            forces: "forces".into(),
            stress: None,
        }
    }
}

/// A frame's reference values.
#[derive(Debug, Clone, PartialEq)]
pub struct Labels {
    /// Total energy.
    pub energy: f64,
    /// One force per atom.
    pub forces: Vec<[f64; 3]>,
    /// The stress tensor, when [`LabelKeys::stress`] names one.
    pub stress: Option<[[f64; 3]; 3]>,
}

impl LabelKeys {
    /// The labels of `frame`, the structure at 0-based `index` of its file: every named label
    /// present and finite, or an error naming the structure (1-based), its line and the key.
    pub fn read(&self, frame: &Frame, index: usize) -> Result<Labels, ForceFieldError> {
        let fail = |reason: String| ForceFieldError::Structure {
            index,
            reason: format!("line {}: {reason}", frame.line),
        };
        let energy = self.info(frame, &self.energy).map_err(fail)?;
        let [energy] = energy[..] else {
            return Err(fail(format!(
                "`{}` holds {} values, not one energy",
                self.energy,
                energy.len()
            )));
        };
        let forces = match frame.arrays.get(&self.forces) {
            Some((3, values)) => values,
            Some((width, _)) => {
                return Err(fail(format!(
                    "column `{}` has {width} value(s) per atom, not 3 (declare it {}:R:3)",
                    self.forces, self.forces
                )));
            }
            None => {
                return Err(fail(format!(
                    "no force column `{}` (columns: {})",
                    self.forces,
                    names(frame.arrays.keys())
                )));
            }
        };
        if let Some(atom) = forces
            .chunks_exact(3)
            .position(|f| !f.iter().all(|v| v.is_finite()))
        {
            return Err(fail(format!(
                "atom {}: force `{}` is not finite",
                atom + 1,
                self.forces
            )));
        }
        let forces = forces.chunks_exact(3).map(|f| [f[0], f[1], f[2]]).collect();
        let stress = match &self.stress {
            None => None,
            Some(key) => Some(match self.info(frame, key).map_err(fail)?[..] {
                [xx, xy, xz, yx, yy, yz, zx, zy, zz] => [[xx, xy, xz], [yx, yy, yz], [zx, zy, zz]],
                [xx, yy, zz, yz, xz, xy] => [[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]],
                ref values => {
                    return Err(fail(format!(
                        "`{key}` holds {} values: a stress has 9 (3 × 3) or 6 (Voigt)",
                        values.len()
                    )));
                }
            }),
        };
        Ok(Labels {
            energy,
            forces,
            stress,
        })
    }

    /// The finite numbers of comment-line value `key`.
    fn info(&self, frame: &Frame, key: &str) -> Result<Vec<f64>, String> {
        let text = frame.info.get(key).ok_or_else(|| {
            format!(
                "no `{key}` on its comment line (keys: {})",
                names(frame.info.keys())
            )
        })?;
        let values = text
            .split_whitespace()
            .map(|word| word.parse::<f64>().ok().filter(|v| v.is_finite()))
            .collect::<Option<Vec<f64>>>();
        values.ok_or_else(|| format!("`{key}={text}` is not finite numbers"))
    }
}

/// `a, b, c`, or `none`.
fn names<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = keys.map(String::as_str).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extxyz::read_extxyz;

    /// Written by ASE 3.29: a water with a SinglePointCalculator, a methane with `REF_` labels.
    const ASE: &str = "3
Properties=species:S:1:pos:R:3:forces:R:3 energy=-14.25 pbc=\"F F F\"
O        0.00000000       0.00000000       0.11926200       0.00000000       0.10000000       0.20000000
H        0.00000000       0.76323900      -0.47704700       0.30000000       0.40000000       0.50000000
H        0.00000000      -0.76323900      -0.47704700       0.60000000       0.70000000       0.80000000
5
Properties=species:S:1:pos:R:3:REF_forces:R:3 REF_energy=-3.5 pbc=\"F F F\"
C        0.00000000       0.00000000       0.00000000       0.25000000       0.25000000       0.25000000
H        0.62911800       0.62911800       0.62911800       0.25000000       0.25000000       0.25000000
H       -0.62911800      -0.62911800       0.62911800       0.25000000       0.25000000       0.25000000
H        0.62911800      -0.62911800      -0.62911800       0.25000000       0.25000000       0.25000000
H       -0.62911800       0.62911800      -0.62911800       0.25000000       0.25000000       0.25000000
";

    #[test]
    fn ase_calculator_results_and_renamed_labels_are_read() {
        let frames = read_extxyz(ASE).unwrap();
        let water = LabelKeys::default().read(&frames[0], 0).unwrap();
        assert_eq!(water.energy, -14.25);
        assert_eq!(water.forces[2], [0.6, 0.7, 0.8]);
        assert_eq!(water.stress, None);
        let renamed = LabelKeys {
            energy: "REF_energy".into(),
            forces: "REF_forces".into(),
            stress: None,
        };
        let methane = renamed.read(&frames[1], 1).unwrap();
        assert_eq!((methane.energy, methane.forces.len()), (-3.5, 5));
    }

    #[test]
    fn missing_or_bad_labels_name_the_structure_line_and_key() {
        let frames = read_extxyz(ASE).unwrap();
        let err = LabelKeys::default().read(&frames[1], 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "structure 2: line 6: no `energy` on its comment line (keys: REF_energy)"
        );
        let no_forces = LabelKeys {
            energy: "REF_energy".into(),
            ..LabelKeys::default()
        };
        let err = no_forces.read(&frames[1], 1).unwrap_err().to_string();
        assert!(
            err.ends_with("no force column `forces` (columns: REF_forces)"),
            "{err}"
        );

        let mut broken = frames[0].clone();
        broken.info.insert("energy".into(), "nan".into());
        let err = LabelKeys::default()
            .read(&broken, 0)
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("`energy=nan` is not finite numbers"), "{err}");
        broken.info.insert("energy".into(), "1 2".into());
        let err = LabelKeys::default()
            .read(&broken, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds 2 values, not one energy"), "{err}");

        let mut broken = frames[0].clone();
        broken.arrays.get_mut("forces").unwrap().1[4] = f64::INFINITY;
        let err = LabelKeys::default()
            .read(&broken, 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("atom 2: force `forces` is not finite"),
            "{err}"
        );
        broken.arrays.insert("forces".into(), (1, vec![0.0; 3]));
        let err = LabelKeys::default()
            .read(&broken, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 value(s) per atom, not 3"), "{err}");
    }

    #[test]
    fn stress_is_read_in_full_or_voigt_order() {
        let frames = read_extxyz(ASE).unwrap();
        let keys = LabelKeys {
            stress: Some("stress".into()),
            ..LabelKeys::default()
        };
        let mut frame = frames[0].clone();
        frame
            .info
            .insert("stress".into(), "1 6 5 6 2 4 5 4 3".into());
        let full = keys.read(&frame, 0).unwrap().stress.unwrap();
        frame.info.insert("stress".into(), "1 2 3 4 5 6".into());
        let voigt = keys.read(&frame, 0).unwrap().stress.unwrap();
        assert_eq!(full, voigt);
        assert_eq!(full, [[1.0, 6.0, 5.0], [6.0, 2.0, 4.0], [5.0, 4.0, 3.0]]);
        frame.info.insert("stress".into(), "1 2 3".into());
        let err = keys.read(&frame, 0).unwrap_err().to_string();
        assert!(err.contains("9 (3 × 3) or 6 (Voigt)"), "{err}");
    }
}
