//! One row per (model, T): the nested statistics of its K trials and where their time went.

use serde::{Deserialize, Serialize};

use crate::McError;
use crate::experiment::Experiment;
use crate::nested::NestedStats;
use crate::runner::Timings;
use crate::store::TrialRecord;

/// The nested statistics and timings of one (model, T).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// The model.
    pub model: String,
    /// Passes per trial T.
    pub passes: u32,
    /// Trials K.
    pub trials: usize,
    /// Sum over dimensions of the between-trial variance of the T-pass mean embedding, averaged
    /// over images ([`NestedStats::mean_variance`]).
    pub mean_variance: f64,
    /// Mean per-image uncertainty score (sum of the per-dimension variances).
    pub uncertainty: f64,
    /// Its between-trial standard deviation, averaged over images.
    pub uncertainty_spread: f64,
    /// Mean pairwise Spearman correlation of the uncertainty scores across trials.
    pub rank_stability: f64,
    /// The trials' timings, summed.
    pub timings: Timings,
    /// Forward time over wall time of the trials.
    pub forward_fraction: f64,
}

/// The rows of `experiment` from its finished `records` (every trial of a row must be there),
/// in the experiment's order.
pub fn summarize(
    experiment: &Experiment,
    records: &[TrialRecord],
) -> Result<Vec<SummaryRow>, McError> {
    let mut rows = Vec::new();
    for model in &experiment.models {
        for &passes in &experiment.passes {
            let mut trials: Vec<&TrialRecord> = records
                .iter()
                .filter(|r| r.key.model == *model && r.key.passes == passes)
                .collect();
            trials.sort_by_key(|r| r.key.trial);
            trials.dedup_by_key(|r| r.key.trial);
            if trials.len() != experiment.trials as usize {
                return Err(McError::Store(format!(
                    "{model} with T = {passes}: {} of {} trials finished",
                    trials.len(),
                    experiment.trials
                )));
            }
            let stats: Vec<_> = trials.iter().map(|r| r.stats.clone()).collect();
            let nested = NestedStats::new(&stats)?;
            let mut timings = Timings::default();
            for trial in &trials {
                timings += trial.timings;
            }
            rows.push(SummaryRow {
                model: model.clone(),
                passes,
                trials: nested.trials,
                mean_variance: nested.mean_variance,
                uncertainty: nested.uncertainty,
                uncertainty_spread: nested.uncertainty_spread,
                rank_stability: nested.rank_stability,
                forward_fraction: timings.forward_fraction(),
                timings,
            });
        }
    }
    Ok(rows)
}

/// The rows as CSV with a header line (timings in seconds).
pub fn to_csv(rows: &[SummaryRow]) -> String {
    let mut csv = String::from(
        "model,passes,trials,mean_variance,uncertainty,uncertainty_spread,rank_stability,\
         upload_s,forward_s,accumulate_s,readback_s,wall_s,forward_fraction\n",
    );
    for r in rows {
        let t = &r.timings;
        csv.push_str(&format!(
            "{},{},{},{:e},{:e},{:e},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4}\n",
            r.model,
            r.passes,
            r.trials,
            r.mean_variance,
            r.uncertainty,
            r.uncertainty_spread,
            r.rank_stability,
            t.upload,
            t.forward,
            t.accumulate,
            t.readback,
            t.wall,
            r.forward_fraction
        ));
    }
    csv
}
