//! Held-out evaluation: for each language model and each prompt kind (the text itself, the
//! latent prefix, and the token budget: the text cut to its first `M` tokens, the fair baseline
//! at the prefix's length), the gold answer's NLL per token and first-token accuracy (teacher
//! forced), and EM and F1 of a greedy answer (SQuAD's normalisation).
//!
//! Generation stops at the end of the assistant's turn or after `max_new_tokens`: LatentWire's
//! eval capped it at the longest gold answer of each chunk, which told the model its length.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_text::GenerationConfig;
use serde::{Deserialize, Serialize};

use crate::reader::Contents;
use crate::{ByteBatch, LatentWire, LatentWireError, QaBatch, QaItem, Reader, ReaderBatch};

/// One prompt kind's scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// The gold answer's negative log-likelihood per token (nats; its end not counted).
    pub nll: f64,
    /// How often the most likely first token is the gold answer's.
    pub first_token_accuracy: f64,
    /// Exact match of the greedy answer, SQuAD-normalised.
    pub em: f64,
    /// Token F1 of the greedy answer, SQuAD-normalised.
    pub f1: f64,
}

/// One language model's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReaderReport {
    /// The language model.
    pub name: String,
    /// Given the text (the upper bound).
    pub text: Scores,
    /// Given the latent prefix.
    pub latent: Scores,
    /// Given the text's first `M` tokens.
    pub token_budget: Scores,
    /// The text's tokens per latent, averaged over the items.
    pub compression: f64,
    /// The latents' size per text in bytes (`M × d_z` f32 values).
    pub payload_bytes: usize,
}

/// How evaluation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// Items per forward.
    pub batch: usize,
    /// The longest greedy answer, in tokens.
    pub max_new_tokens: usize,
}

impl Default for Evaluation {
    fn default() -> Self {
        Evaluation {
            batch: 16,
            max_new_tokens: 12,
        }
    }
}

/// Sums of one prompt kind's scores.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    nll: f64,
    tokens: usize,
    first_right: usize,
    em: f64,
    f1: f64,
    items: usize,
}

impl Tally {
    fn scores(&self) -> Scores {
        let per_item = |x: f64| x / self.items.max(1) as f64;
        Scores {
            nll: self.nll / self.tokens.max(1) as f64,
            first_token_accuracy: per_item(self.first_right as f64),
            em: per_item(self.em),
            f1: per_item(self.f1),
        }
    }
}

impl Evaluation {
    /// The scores of `model` read by `readers` on `items`.
    pub fn run<B: Backend>(
        &self,
        model: &LatentWire<B>,
        readers: &[Reader<B>],
        items: &[QaItem],
    ) -> Result<Vec<ReaderReport>, LatentWireError> {
        if items.is_empty() {
            return Err(LatentWireError::Input("no items to evaluate on".into()));
        }
        let mut tallies = vec![[Tally::default(); 3]; readers.len()];
        let mut text_tokens = vec![0usize; readers.len()];
        let [latents, width] = model.encoder.latent_shape();
        for chunk in items.chunks(self.batch.max(1)) {
            let sources: Vec<String> = chunk.iter().map(QaItem::source).collect();
            let batch = QaBatch {
                bytes: ByteBatch::new(&sources, model.encoder.max_bytes()),
                readers: (readers.iter())
                    .map(|reader| reader_batch(reader, &sources, chunk))
                    .collect::<Result<_, _>>()?,
            };
            let prefixes = model.prefixes(model.latents(&batch, readers)?, readers);
            let per_reader = readers.iter().zip(prefixes).zip(batch.readers);
            for (m, ((reader, prefix), ReaderBatch { texts, answers })) in per_reader.enumerate() {
                text_tokens[m] += texts.iter().map(Vec::len).sum::<usize>();
                let kinds = prompt_kinds(&texts, prefix, latents);
                for (tally, (_, contents)) in tallies[m].iter_mut().zip(kinds) {
                    self.score(reader, contents, &answers, chunk, tally)?;
                }
            }
        }
        let reports = readers.iter().zip(tallies).zip(text_tokens);
        Ok(reports
            .map(|((reader, [text, latent, budget]), tokens)| ReaderReport {
                name: reader.name().to_string(),
                text: text.scores(),
                latent: latent.scores(),
                token_budget: budget.scores(),
                compression: tokens as f64 / (items.len() * latents) as f64,
                payload_bytes: latents * width * 4,
            })
            .collect())
    }

    /// Adds one chunk's scores given `contents` to `tally`.
    fn score<B: Backend>(
        &self,
        reader: &Reader<B>,
        contents: Contents<B>,
        answers: &[Vec<u32>],
        items: &[QaItem],
        tally: &mut Tally,
    ) -> Result<(), LatentWireError> {
        let scored = teacher_forced(reader, contents.clone(), answers)?;
        tally.nll += scored.nll;
        tally.tokens += scored.tokens;
        tally.first_right += scored.first_right;
        let end = reader.template().end;
        let config = GenerationConfig {
            stop_tokens: vec![end],
            pad_token: end,
            ..GenerationConfig::greedy(self.max_new_tokens)
        };
        let generated = reader.generate(contents, &config)?;
        for (tokens, item) in generated.iter().zip(items) {
            let tokens: Vec<u32> = tokens.iter().copied().filter(|&t| t != end).collect();
            let predicted = reader.tokenizer().decode(&tokens, true)?;
            tally.em += exact_match(&predicted, &item.answer);
            tally.f1 += f1(&predicted, &item.answer);
        }
        tally.items += answers.len();
        Ok(())
    }
}

/// The three prompt kinds, named: the texts, the soft prompt `prefix`, and the texts cut to
/// their first `latents` tokens.
pub(crate) fn prompt_kinds<B: Backend>(
    texts: &[Vec<u32>],
    prefix: Tensor<B, 3>,
    latents: usize,
) -> [(&'static str, Contents<B>); 3] {
    let budget = texts
        .iter()
        .map(|t| t[..t.len().min(latents)].to_vec())
        .collect();
    [
        ("text", Contents::Tokens(texts.to_vec())),
        ("latent", Contents::Embeddings(prefix)),
        ("token_budget", Contents::Tokens(budget)),
    ]
}

/// A batch's teacher-forced scores: the answers' summed NLL, their tokens, and how many first
/// tokens are the most likely.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TeacherForced {
    pub nll: f64,
    pub tokens: usize,
    pub first_right: usize,
}

/// The teacher-forced scores of `answers` (none empty) after `contents`.
pub(crate) fn teacher_forced<B: Backend>(
    reader: &Reader<B>,
    contents: Contents<B>,
    answers: &[Vec<u32>],
) -> Result<TeacherForced, LatentWireError> {
    let composed = reader.compose(contents, answers);
    let logits = reader.forward(composed)?.logits;
    let [_, window, vocab] = logits.dims();
    let values = host_f32(logits);
    let mut scored = TeacherForced::default();
    for (row, answer) in answers.iter().enumerate() {
        let row_logits = |j: usize| &values[(row * window + j) * vocab..][..vocab];
        for (j, &token) in answer.iter().enumerate() {
            scored.nll += negative_log_softmax(row_logits(j), token as usize);
        }
        scored.tokens += answer.len();
        scored.first_right += usize::from(argmax(row_logits(0)) == answer[0] as usize);
    }
    Ok(scored)
}

/// `items`' texts (`sources`) and answers as `reader` reads them; an empty answer is an error.
fn reader_batch<B: Backend>(
    reader: &Reader<B>,
    sources: &[String],
    items: &[QaItem],
) -> Result<ReaderBatch, LatentWireError> {
    let texts = (sources.iter())
        .map(|source| reader.ids(source))
        .collect::<Result<Vec<_>, _>>()?;
    let answers = (items.iter())
        .map(|item| reader.answer_ids(&item.answer))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(row) = answers.iter().position(Vec::is_empty) {
        return Err(LatentWireError::Input(format!(
            "an item's answer is empty: {:?}",
            items[row].question
        )));
    }
    Ok(ReaderBatch { texts, answers })
}

/// A tensor's values on the host in f32.
fn host_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    let data = x.into_data().convert::<f32>();
    data.to_vec::<f32>().expect("converted to f32")
}

/// `−log softmax(row)[target]`, in f64.
fn negative_log_softmax(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    f64::from(max) + sum.ln() - f64::from(row[target])
}

/// The index of the largest value, the first among equals.
fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// SQuAD's normalisation: lower case, no punctuation, no articles, single spaces.
fn normalize(text: &str) -> Vec<String> {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    lowered
        .split_whitespace()
        .filter(|word| !matches!(*word, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

/// 1 when the normalised answers are equal.
fn exact_match(predicted: &str, gold: &str) -> f64 {
    f64::from(u8::from(normalize(predicted) == normalize(gold)))
}

/// SQuAD's token F1: the harmonic mean of precision and recall of the normalised tokens, shared
/// tokens counted with multiplicity (LatentWire's 220ce571 compared sets).
fn f1(predicted: &str, gold: &str) -> f64 {
    let (predicted, gold) = (normalize(predicted), normalize(gold));
    if predicted.is_empty() || gold.is_empty() {
        return f64::from(u8::from(predicted == gold));
    }
    let mut unmatched = gold.clone();
    let mut common = 0;
    for word in &predicted {
        if let Some(at) = unmatched.iter().position(|g| g == word) {
            unmatched.swap_remove(at);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / predicted.len() as f64;
    let recall = common as f64 / gold.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_normalised_as_squad_does() {
        assert_eq!(normalize("The  Red Kite!"), ["red", "kite"]);
        assert_eq!(exact_match("a red kite.", "Red kite"), 1.0);
        assert_eq!(exact_match("red", "red kite"), 0.0);
    }

    /// Shared tokens count with multiplicity: "kite kite" against "kite" is precision ½, recall
    /// 1 (a set would make it 1).
    #[test]
    fn f1_counts_shared_tokens_with_multiplicity() {
        assert!((f1("kite kite", "kite") - 2.0 / 3.0).abs() < 1e-12);
        assert!((f1("red kite", "blue kite") - 0.5).abs() < 1e-12);
        assert_eq!(f1("", ""), 1.0);
        assert_eq!(f1("the", "kite"), 0.0);
        assert_eq!(f1("Oslo", "oslo"), 1.0);
    }

    #[test]
    fn the_negative_log_likelihood_is_that_of_the_softmax() {
        let row = [0.0, (2.0f32).ln(), 0.0];
        assert!((negative_log_softmax(&row, 1) - 2f64.ln()).abs() < 1e-6);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
