//! What a nested Monte-Carlo experiment runs: models × pass counts × trials from one master seed,
//! and how the trials split across processes or machines.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::McError;
use crate::seeds::trial_seed;

/// The experiment: every model runs `trials` trials of each pass count over the same images.
/// Results of runs of one experiment (resumed, or shards) combine; the fields identify it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Experiment {
    /// Model names (they enter the trial seeds).
    pub models: Vec<String>,
    /// Pass counts T.
    pub passes: Vec<u32>,
    /// Trials K per (model, T).
    pub trials: u32,
    /// The master seed.
    pub seed: u64,
    /// The Monte-Carlo dropout sites, as kiln-vision's `DropoutSites` prints them.
    pub dropout: String,
    /// What identifies the images (kiln-cache's entry key).
    pub dataset: String,
    /// Images in the dataset.
    pub images: usize,
    /// What identifies each model's weights (a checkpoint, or a random initialisation's seed).
    pub weights: Vec<String>,
    /// The precision policy the trials compute under, as kiln-core prints it (results
    /// directories from before it was recorded read as empty, so they differ from any run).
    #[serde(default)]
    pub precision: String,
}

impl Experiment {
    /// Checks the experiment can run and be summarised: at least one model, each named once,
    /// pass counts of at least 2 (the per-image variance needs two passes), each given once, and
    /// at least two trials (between-trial statistics need two).
    pub fn validate(&self) -> Result<(), McError> {
        if self.models.is_empty() {
            return Err(McError::Plan("no models".into()));
        }
        if let Some(name) = self.models.iter().find(|name| !is_file_name_safe(name)) {
            return Err(McError::Plan(format!(
                "model name `{name}`: use letters, digits, `-`, `_` and `.` only"
            )));
        }
        if self.passes.is_empty() || self.passes.iter().any(|&t| t < 2) {
            return Err(McError::Plan(format!(
                "pass counts {:?}: give at least one, each at least 2 (a variance over one pass \
                 is undefined)",
                self.passes
            )));
        }
        if let Some(t) = repeated(&self.passes) {
            return Err(McError::Plan(format!(
                "pass counts {:?}: {t} is given twice",
                self.passes
            )));
        }
        if let Some(name) = repeated(&self.models) {
            return Err(McError::Plan(format!("model name `{name}` is given twice")));
        }
        if self.trials < 2 {
            return Err(McError::Plan(format!(
                "{} trial(s): between-trial statistics need at least 2",
                self.trials
            )));
        }
        if self.images == 0 {
            return Err(McError::Plan("no images".into()));
        }
        if self.weights.len() != self.models.len() {
            return Err(McError::Plan(format!(
                "{} weight identities for {} models",
                self.weights.len(),
                self.models.len()
            )));
        }
        Ok(())
    }

    /// Every trial, model by model, then pass count, then trial.
    pub fn trial_keys(&self) -> Vec<TrialKey> {
        let mut keys = Vec::new();
        for model in &self.models {
            for &passes in &self.passes {
                for trial in 0..self.trials {
                    keys.push(TrialKey {
                        model: model.clone(),
                        passes,
                        trial,
                    });
                }
            }
        }
        keys
    }

    /// The seed of trial `key`.
    pub fn seed_of(&self, key: &TrialKey) -> u64 {
        trial_seed(self.seed, &key.model, key.passes, key.trial)
    }

    /// Fields in which `other` differs from this experiment (empty when they are the same).
    pub fn differences(&self, other: &Experiment) -> Vec<&'static str> {
        [
            ("models", self.models != other.models),
            ("passes", self.passes != other.passes),
            ("trials", self.trials != other.trials),
            ("seed", self.seed != other.seed),
            ("dropout", self.dropout != other.dropout),
            ("dataset", self.dataset != other.dataset),
            ("images", self.images != other.images),
            ("weights", self.weights != other.weights),
            ("precision", self.precision != other.precision),
        ]
        .into_iter()
        .filter_map(|(field, differs)| differs.then_some(field))
        .collect()
    }
}

/// The first value of `values` that occurs again later.
fn repeated<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find(|(i, v)| values[i + 1..].contains(v))
        .map(|(_, v)| v)
}

fn is_file_name_safe(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One trial: the `trial`-th run of `passes` passes of `model`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TrialKey {
    /// The model's name.
    pub model: String,
    /// Passes T.
    pub passes: u32,
    /// Trial index k, from 0.
    pub trial: u32,
}

impl fmt::Display for TrialKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_T{}_k{}", self.model, self.passes, self.trial)
    }
}

/// Shard `index` of `count` (`--shard 2/4` is the second of four): trials are dealt round-robin
/// in [`Experiment::trial_keys`] order, so every shard gets a similar share of every (model, T).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which shard, from 1.
    pub index: usize,
    /// Shards in all.
    pub count: usize,
}

impl Shard {
    /// The whole experiment.
    pub const ALL: Shard = Shard { index: 1, count: 1 };

    /// This shard's trials among `keys`.
    pub fn select(&self, keys: Vec<TrialKey>) -> Vec<TrialKey> {
        keys.into_iter()
            .enumerate()
            .filter(|(i, _)| i % self.count == self.index - 1)
            .map(|(_, key)| key)
            .collect()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = McError;

    fn from_str(s: &str) -> Result<Self, McError> {
        let bad = || {
            McError::Plan(format!(
                "shard `{s}`: expected i/n with 1 ≤ i ≤ n, e.g. 1/4"
            ))
        };
        let (index, count) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = index.trim().parse().map_err(|_| bad())?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment() -> Experiment {
        Experiment {
            models: vec!["a".into(), "b".into()],
            passes: vec![4, 8],
            trials: 3,
            seed: 1,
            dropout: "0.1".into(),
            dataset: "x".into(),
            images: 5,
            weights: vec!["w".into(); 2],
            precision: "params=f32,compute=f32,output=f32,accumulate=f64".into(),
        }
    }

    #[test]
    fn shards_partition_the_trials() {
        let keys = experiment().trial_keys();
        assert_eq!(keys.len(), 12);
        let mut dealt: Vec<TrialKey> = (1..=5)
            .flat_map(|i| Shard { index: i, count: 5 }.select(keys.clone()))
            .collect();
        dealt.sort();
        let mut all = keys.clone();
        all.sort();
        assert_eq!(dealt, all);
        assert_eq!(Shard::ALL.select(keys.clone()), keys);
    }

    #[test]
    fn bad_plans_and_shards_are_explained() {
        let err = |e: Experiment| e.validate().unwrap_err().to_string();
        for passes in [vec![4, 0], vec![1, 8]] {
            let e = err(Experiment {
                passes,
                ..experiment()
            });
            assert!(e.contains("each at least 2"), "{e}");
        }
        let e = err(Experiment {
            passes: vec![4, 8, 4],
            ..experiment()
        });
        assert!(e.contains("4 is given twice"), "{e}");
        let e = err(Experiment {
            models: vec!["a".into(), "a".into()],
            ..experiment()
        });
        assert!(e.contains("`a` is given twice"), "{e}");
        assert!(
            err(Experiment {
                trials: 1,
                ..experiment()
            })
            .contains("at least 2")
        );
        assert!(
            err(Experiment {
                models: vec!["../x".into()],
                ..experiment()
            })
            .contains("../x")
        );
        assert_eq!(
            "2/4".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 4 }
        );
        for bad in ["0/4", "5/4", "x", "1/"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        let other = Experiment {
            seed: 2,
            precision: "params=f16,compute=f16,output=f16,accumulate=f32".into(),
            ..experiment()
        };
        assert_eq!(experiment().differences(&other), vec!["seed", "precision"]);
        // A results directory from before the precision was recorded is another experiment.
        let mut old = serde_json::to_value(experiment()).unwrap();
        old.as_object_mut().unwrap().remove("precision");
        let old: Experiment = serde_json::from_value(old).unwrap();
        assert_eq!(old.differences(&experiment()), vec!["precision"]);
    }
}
