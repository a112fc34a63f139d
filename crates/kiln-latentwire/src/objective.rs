//! LatentWire's training loss (train.py's defaults at 220ce571), every term read from one forward
//! of each language model over `[template, soft prompt, template, answer]`:
//!
//! - teacher-forced cross-entropy of the answer and its end token;
//! - first-token cross-entropy (weight 0.5, raised by `min(first / tf, 8)` while the first token
//!   is the harder: train.py's `--first_token_autoscale`);
//! - K-token cross-entropy over the first `K = 4` answer tokens (weight 0.5; the mean over the
//!   steps of each step's mean over the answers that long), from the same logits: LatentWire ran
//!   one forward per step;
//! - distillation (weight 1, `τ = 2`, times `τ²`) of the same model's logits given the text
//!   (no gradient) into its logits given the soft prompt, at the same first `K` answer tokens;
//! - `0.05 · Σ (scale − 1)²` over the adapters' output scales.
//!
//! The terms are averaged over the language models, the scale penalty added once.

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use kiln_kernels::{distillation, weighted_cross_entropy};

use crate::reader::Contents;
use crate::{ByteBatch, LatentWire, LatentWireError, Reader};

/// The loss's weights (train.py's flags in brackets).
#[derive(Config, Debug)]
pub struct Objective {
    /// The first answer token's cross-entropy (`--first_token_ce_weight`).
    #[config(default = 0.5)]
    pub first_token: f64,
    /// Raise the first-token weight by `min(first / tf, 8)` when above 1
    /// (`--first_token_autoscale`).
    #[config(default = true)]
    pub first_token_autoscale: bool,
    /// The answer tokens the K-token and distillation terms read (`--K`).
    #[config(default = 4)]
    pub k: usize,
    /// The K-token cross-entropy (`--k_ce_weight`).
    #[config(default = 0.5)]
    pub k_token: f64,
    /// The distillation from the text prompt (`--kd_first_k_weight`).
    #[config(default = 1.0)]
    pub distillation: f64,
    /// The distillation's temperature (`--kd_tau`).
    #[config(default = 2.0)]
    pub temperature: f64,
    /// The adapters' scale penalty (`--scale_l2`).
    #[config(default = 0.05)]
    pub scale_l2: f64,
}

/// Training items as each language model reads them.
#[derive(Debug, Clone)]
pub struct QaBatch {
    /// The texts the encoder reads.
    pub bytes: ByteBatch,
    /// Per reader, in the model's order.
    pub readers: Vec<ReaderBatch>,
}

/// The items' token ids for one language model.
#[derive(Debug, Clone)]
pub struct ReaderBatch {
    /// Each text's ids (the distillation's teacher reads them).
    pub texts: Vec<Vec<u32>>,
    /// Each gold answer's ids, without the end id; none empty.
    pub answers: Vec<Vec<u32>>,
}

/// One language model's terms, as values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossTerms {
    /// Teacher-forced cross-entropy per answer token (end included).
    pub teacher_forced: f32,
    /// The first answer token's cross-entropy.
    pub first_token: f32,
    /// The first `K` answer tokens' cross-entropy.
    pub k_token: f32,
    /// The distillation term (times `τ²`).
    pub distillation: f32,
}

/// A training step's loss and its parts.
#[derive(Debug)]
pub struct TrainingLoss<B: AutodiffBackend> {
    /// What is differentiated.
    pub loss: Tensor<B, 1>,
    /// Each language model's terms.
    pub terms: Vec<LossTerms>,
    /// `Σ (scale − 1)²` over the adapters.
    pub scale_penalty: f32,
}

/// Per-row weights of the logits `[rows · window]` for each term, and the targets.
struct Rows {
    targets: Vec<i64>,
    teacher_forced: Vec<f32>,
    first_token: Vec<f32>,
    first_k: Vec<f32>,
}

impl Rows {
    /// Row `r · window + j` predicts answer token `j` of row `r` (its end id last).
    fn new(answers: &[Vec<u32>], end: u32, window: usize, k: usize) -> Rows {
        let rows = answers.len() * window;
        let mut rows_of = Rows {
            targets: vec![-1; rows],
            teacher_forced: vec![0.0; rows],
            first_token: vec![0.0; rows],
            first_k: vec![0.0; rows],
        };
        let scored: usize = answers.iter().map(|a| a.len() + 1).sum();
        let longest = answers.iter().map(Vec::len).max().unwrap_or(0);
        // Step t of the K-token term averages the answers at least t + 1 long; the steps that
        // have any are averaged.
        let counts: Vec<usize> = (0..k.min(longest))
            .map(|t| answers.iter().filter(|a| a.len() > t).count())
            .collect();
        for (r, answer) in answers.iter().enumerate() {
            let tokens = answer.iter().chain([&end]);
            for (j, &token) in tokens.enumerate() {
                let row = r * window + j;
                rows_of.targets[row] = i64::from(token);
                rows_of.teacher_forced[row] = 1.0 / scored as f32;
                if j == 0 {
                    rows_of.first_token[row] = 1.0 / answers.len() as f32;
                }
                if j < counts.len() && j < answer.len() {
                    rows_of.first_k[row] = 1.0 / (counts[j] * counts.len()) as f32;
                }
            }
        }
        rows_of
    }
}

impl Objective {
    /// The loss of `batch` for `model` read by `readers`.
    pub fn loss<B: AutodiffBackend>(
        &self,
        model: &LatentWire<B>,
        readers: &[Reader<B>],
        batch: &QaBatch,
    ) -> Result<TrainingLoss<B>, LatentWireError> {
        if batch.readers.len() != readers.len() {
            return Err(LatentWireError::Input(format!(
                "the batch is tokenized for {} language models, and {} read it",
                batch.readers.len(),
                readers.len()
            )));
        }
        let prefixes = model.prefixes(model.latents(batch, readers)?, readers);
        let mut total = None;
        let mut terms = Vec::new();
        for ((prefix, reader), items) in prefixes.into_iter().zip(readers).zip(&batch.readers) {
            let (loss, values) = self.reader_loss(prefix, reader, items)?;
            total = Some(total.map_or(loss.clone(), |t| t + loss));
            terms.push(values);
        }
        let mut loss = total.expect("at least one language model") / readers.len() as f64;
        let mut scale_penalty = 0.0;
        for adapter in &model.adapters {
            let gap = adapter.scale.val() - 1.0;
            let penalty = gap.powi_scalar(2).sum();
            scale_penalty += value(&penalty);
            loss = loss + penalty * self.scale_l2;
        }
        Ok(TrainingLoss {
            loss,
            terms,
            scale_penalty,
        })
    }

    /// One language model's weighted terms and their values.
    fn reader_loss<B: AutodiffBackend>(
        &self,
        prefix: Tensor<B, 3>,
        reader: &Reader<B>,
        items: &ReaderBatch,
    ) -> Result<(Tensor<B, 1>, LossTerms), LatentWireError> {
        if let Some(row) = items.answers.iter().position(Vec::is_empty) {
            return Err(LatentWireError::Input(format!(
                "item {} of the batch has an empty answer for {}",
                row + 1,
                reader.name()
            )));
        }
        let end = reader.template().end;
        let composed = reader.compose(Contents::Embeddings(prefix), &items.answers_with(end));
        let window = composed.window;
        let logits = reader.forward(composed)?.logits;
        let [batch, _, vocab] = logits.dims();
        let logits = logits.reshape([batch * window, vocab]);
        let rows = Rows::new(&items.answers, end, window, self.k);
        let ce = |weights: &[f32]| weighted_cross_entropy(logits.clone(), &rows.targets, weights);
        let teacher_forced = ce(&rows.teacher_forced);
        let first_token = ce(&rows.first_token);
        let k_token = ce(&rows.first_k);
        let mut terms = LossTerms {
            teacher_forced: value(&teacher_forced),
            first_token: value(&first_token),
            k_token: value(&k_token),
            distillation: 0.0,
        };
        let mut first_weight = self.first_token;
        let ratio = terms.first_token / terms.teacher_forced.max(1e-4);
        if self.first_token_autoscale && ratio > 1.0 {
            first_weight *= f64::from(ratio.min(8.0));
        }
        let mut loss = teacher_forced + first_token * first_weight + k_token * self.k_token;
        if self.distillation > 0.0 {
            let teacher = self.teacher_logits(reader, items, batch * window, vocab)?;
            let temperature = self.temperature as f32;
            let kd = distillation(logits, teacher, temperature, &rows.first_k);
            terms.distillation = value(&kd);
            loss = loss + kd * self.distillation;
        }
        Ok((loss, terms))
    }

    /// The language model's logits `[rows, vocab]` given the text, laid out as the soft prompt's,
    /// computed without autodiff.
    fn teacher_logits<B: AutodiffBackend>(
        &self,
        reader: &Reader<B>,
        items: &ReaderBatch,
        rows: usize,
        vocab: usize,
    ) -> Result<Tensor<B, 2>, LatentWireError> {
        let answers = items.answers_with(reader.template().end);
        let composed = reader.template().compose_tokens(&items.texts, &answers);
        let logits = reader.forward_with(&reader.lm().valid(), composed)?.logits;
        Ok(Tensor::from_inner(logits).reshape([rows, vocab]))
    }
}

impl ReaderBatch {
    /// Each answer followed by `end`.
    fn answers_with(&self, end: u32) -> Vec<Vec<u32>> {
        (self.answers.iter())
            .map(|answer| [answer.as_slice(), &[end]].concat())
            .collect()
    }
}

/// A one-element tensor's value.
fn value<B: AutodiffBackend>(x: &Tensor<B, 1>) -> f32 {
    x.clone().into_scalar().elem()
}

#[cfg(test)]
mod tests {
    use super::Rows;

    /// Two answers of 3 and 1 tokens (window 4 with the end id): the teacher-forced term scores
    /// 4 + 2 tokens, the first-token term each answer's first, the K = 2 term step 0 over both
    /// answers and step 1 over the longer only, each step weighing ½.
    #[test]
    fn the_terms_weigh_their_rows_as_latentwires_means() {
        let rows = Rows::new(&[vec![7, 8, 9], vec![5]], 2, 4, 2);
        assert_eq!(rows.targets, [7, 8, 9, 2, 5, 2, -1, -1]);
        let sixth = 1.0 / 6.0;
        let tf = [sixth, sixth, sixth, sixth, sixth, sixth, 0.0, 0.0];
        assert_eq!(rows.teacher_forced, tf);
        assert_eq!(rows.first_token, [0.5, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0]);
        assert_eq!(rows.first_k, [0.25, 0.5, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0]);
    }
}
