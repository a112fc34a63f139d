//! Held-out evaluation. For each language model and each prompt kind ([`PROMPT_KINDS`]): the
//! gold answer's NLL per token and first-token accuracy (teacher forced), the accuracy on the
//! answer's first *content* token (the first that is not whitespace alone: SmolLM2's tokenizer
//! starts every date with a bare space token), and EM and F1 of a greedy answer (SQuAD's
//! normalisation), with LatentWire's `clean_pred` beside them; each with its standard error,
//! over all items and per relation.
//!
//! The prompt kinds are the text itself (the upper bound), the latent prefix, the token budget
//! (the text's first `M` tokens) and three baselines that can show what the latent does *not*
//! carry: the question alone, the question first then the context cut to `M` tokens (a budget
//! that knows the question), and each item read with another item's latent (one asking about
//! the same relation: a latent that carried only the kind of question scores as its own, one
//! that carries the answer falls to chance).
//!
//! How far the latents and each model's prefix differ between items ([`Spread`]) shows
//! directly whether the encoder reads its input at all.
//!
//! Generation stops at the end of the assistant's turn or after `max_new_tokens`: LatentWire's
//! eval capped it at the longest gold answer of each chunk, which told the model its length.

use std::collections::BTreeMap;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_text::GenerationConfig;
use serde::{Deserialize, Serialize};

use crate::reader::Contents;
use crate::{
    ByteBatch, LatentWire, LatentWireError, QaBatch, QaItem, Reader, ReaderBatch, Relation,
};

/// The prompt kinds every language model is scored on, in the order reports list them.
pub const PROMPT_KINDS: [&str; 6] = [
    "text",
    "latent",
    "token_budget",
    "question_only",
    "token_budget_question",
    "shuffled_latent",
];

/// One prompt kind's scores over a set of items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// The gold answer's negative log-likelihood per token (nats; its end not counted).
    pub nll: f64,
    /// How often the most likely first token is the gold answer's.
    pub first_token_accuracy: f64,
    /// How often the most likely token at the answer's first content token (the first that is
    /// not whitespace alone), the tokens before it given, is the gold one.
    pub first_content_token_accuracy: f64,
    /// Exact match of the greedy answer, SQuAD-normalised.
    pub em: f64,
    /// Token F1 of the greedy answer, SQuAD-normalised.
    pub f1: f64,
    /// EM as LatentWire's eval scores it: at least one token generated, the first non-empty
    /// line kept (its `clean_pred`), then SQuAD-normalised.
    pub em_clean: f64,
    /// F1 as LatentWire's eval scores it (see `em_clean`).
    pub f1_clean: f64,
    /// The items scored.
    pub items: usize,
    /// One standard error of each score (over items; the NLL's as a ratio of sums).
    pub standard_errors: StandardErrors,
}

/// One standard error of each of [`Scores`]' measures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StandardErrors {
    /// Of `nll`.
    pub nll: f64,
    /// Of `first_token_accuracy`.
    pub first_token_accuracy: f64,
    /// Of `first_content_token_accuracy`.
    pub first_content_token_accuracy: f64,
    /// Of `em`.
    pub em: f64,
    /// Of `f1`.
    pub f1: f64,
}

/// One relation's items and scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelationReport {
    /// Its held-out items.
    pub items: usize,
    /// How many of its answers start with each token (the vocabulary's spelling), most common
    /// first where read in order of count.
    pub answer_first_tokens: BTreeMap<String, usize>,
    /// How many of its answers start with each content token.
    pub answer_first_content_tokens: BTreeMap<String, usize>,
    /// Each prompt kind's scores on its items, by [`PROMPT_KINDS`]' names.
    #[serde(flatten)]
    pub kinds: BTreeMap<String, Scores>,
}

/// How much vectors given to each item differ between items: a root-mean-square distance
/// from a mean, relative to the vectors' root-mean-square size. 0: every item gets the same
/// vectors (an encoder that ignores its input); `between_items² = between_relations² +
/// within_relations²`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Each item's vectors from their mean over all items.
    pub between_items: f64,
    /// Each relation's mean from the mean over all items, weighted by its items: the part of
    /// the spread that the kind of question explains.
    pub between_relations: f64,
    /// Each item's vectors from their relation's mean: what differs between items asking
    /// about the same relation.
    pub within_relations: f64,
}

impl Spread {
    /// The spread of `vectors` (one per item, all one length), grouped by `relations`.
    pub fn of(vectors: &[Vec<f32>], relations: &[Relation]) -> Spread {
        assert_eq!(vectors.len(), relations.len(), "one relation per item");
        let n = vectors.len();
        let Some(dim) = vectors.first().map(Vec::len) else {
            return Spread::default();
        };
        let mean = |rows: &[usize]| -> Vec<f64> {
            let mut sum = vec![0.0; dim];
            for &i in rows {
                for (s, &x) in sum.iter_mut().zip(&vectors[i]) {
                    *s += f64::from(x);
                }
            }
            sum.iter().map(|s| s / rows.len() as f64).collect()
        };
        let distance2 = |a: &[f64], b: &[f32]| -> f64 {
            a.iter()
                .zip(b)
                .map(|(a, &b)| (a - f64::from(b)).powi(2))
                .sum()
        };
        let all: Vec<usize> = (0..n).collect();
        let overall = mean(&all);
        let size2: f64 = (vectors.iter())
            .map(|v| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>())
            .sum::<f64>()
            / n as f64;
        let total2 = all
            .iter()
            .map(|&i| distance2(&overall, &vectors[i]))
            .sum::<f64>();
        let (mut between2, mut within2) = (0.0, 0.0);
        for relation in Relation::ALL {
            let rows: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| relations[i] == relation)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let centre = mean(&rows);
            let offset: f64 = centre
                .iter()
                .zip(&overall)
                .map(|(c, o)| (c - o).powi(2))
                .sum();
            between2 += rows.len() as f64 * offset;
            within2 += rows
                .iter()
                .map(|&i| distance2(&centre, &vectors[i]))
                .sum::<f64>();
        }
        let relative = |sum2: f64| {
            if size2 > 0.0 {
                (sum2 / n as f64 / size2).sqrt()
            } else {
                0.0
            }
        };
        Spread {
            between_items: relative(total2),
            between_relations: relative(between2),
            within_relations: relative(within2),
        }
    }
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
    /// Given the question alone (`"Question: …\n"`), no context.
    pub question_only: Scores,
    /// Given `M` tokens of the question first, then the context (`"Question: …\nContext: …"`
    /// cut to `M`): a budget that knows the question.
    pub token_budget_question: Scores,
    /// Given another item's latent prefix: the next held-out item asking about the same
    /// relation (a different person, and nearly always another answer).
    pub shuffled_latent: Scores,
    /// Every kind's scores per relation, by [`Relation::name`].
    pub by_relation: BTreeMap<String, RelationReport>,
    /// The text's tokens per latent, averaged over the items (the content alone).
    pub compression: f64,
    /// LatentWire's compression: the whole text prompt's tokens (template, text and anchor)
    /// per latent, averaged over the items.
    pub prompt_compression: f64,
    /// The latents' size per text in bytes (`M × d_z` f32 values).
    pub payload_bytes: usize,
    /// How much this model's soft prompt differs between items.
    pub prefix_spread: Spread,
}

impl ReaderReport {
    /// The scores of the prompt kind `kind` (one of [`PROMPT_KINDS`]).
    pub fn kind(&self, kind: &str) -> Option<&Scores> {
        Some(match kind {
            "text" => &self.text,
            "latent" => &self.latent,
            "token_budget" => &self.token_budget,
            "question_only" => &self.question_only,
            "token_budget_question" => &self.token_budget_question,
            "shuffled_latent" => &self.shuffled_latent,
            _ => return None,
        })
    }
}

/// LatentWire's two-model scores of the latent prefix: each item's two greedy answers (each
/// model's own, as `clean_pred` keeps it), rescored by the sum of both models'
/// log-likelihoods of each given their own prefix (the higher kept; an empty answer is never
/// kept), how often the two agree, and the better of the two per item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct JointScores {
    /// EM of the jointly rescored answer.
    pub rescored_em: f64,
    /// F1 of the jointly rescored answer.
    pub rescored_f1: f64,
    /// How often the two models' answers are equal, SQuAD-normalised.
    pub agreement: f64,
    /// EM of the better of the two answers, per item.
    pub oracle_em: f64,
    /// F1 of the better of the two answers, per item.
    pub oracle_f1: f64,
}

/// An evaluation's results: per language model, and jointly for the first two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Per language model, in the readers' order.
    pub readers: Vec<ReaderReport>,
    /// With two or more models, the first two's joint scores of their latent-prefix answers
    /// (LatentWire's, which scores those alone).
    pub joint: Option<JointScores>,
    /// How much the encoder's latents differ between items.
    pub latent_spread: Spread,
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

/// One item's scores under one prompt kind.
#[derive(Debug, Clone, Default)]
struct Outcome {
    scored: TeacherForced,
    em: f64,
    f1: f64,
    /// The greedy answer as LatentWire keeps it (`clean_pred`).
    clean: String,
    em_clean: f64,
    f1_clean: f64,
}

impl Evaluation {
    /// The scores of `model` read by `readers` on `items` (at least two: the shuffled latent
    /// reads another item's).
    pub fn run<B: Backend>(
        &self,
        model: &LatentWire<B>,
        readers: &[Reader<B>],
        items: &[QaItem],
    ) -> Result<Report, LatentWireError> {
        self.run_with_progress(model, readers, items, &mut |_| {})
    }

    /// [`Evaluation::run`], telling `progress` how many items each batch finished (every
    /// prompt kind, every model), for a progress bar.
    pub fn run_with_progress<B: Backend>(
        &self,
        model: &LatentWire<B>,
        readers: &[Reader<B>],
        items: &[QaItem],
        progress: &mut dyn FnMut(usize),
    ) -> Result<Report, LatentWireError> {
        if items.is_empty() {
            return Err(LatentWireError::Input("no items to evaluate on".into()));
        }
        if items.len() < 2 {
            return Err(LatentWireError::Input(
                "one item to evaluate on: the shuffled-latent baseline reads each item with \
                 another item's latent, so evaluation needs at least two"
                    .into(),
            ));
        }
        let donors = donors(items);
        // outcomes[reader][kind][item]
        let mut outcomes = vec![vec![Vec::new(); PROMPT_KINDS.len()]; readers.len()];
        let mut content_tokens = vec![0usize; readers.len()];
        let mut prompt_tokens = vec![0usize; readers.len()];
        let [latents, width] = model.encoder.latent_shape();
        let mut rescored = Vec::with_capacity(items.len());
        // Each item's latents, and each model's prefix, flattened.
        let mut latent_vectors = Vec::with_capacity(items.len());
        let mut prefix_vectors = vec![Vec::with_capacity(items.len()); readers.len()];
        let mut first = 0;
        for chunk in items.chunks(self.batch.max(1)) {
            let own = first..first + chunk.len();
            first += chunk.len();
            let donated: Vec<QaItem> = own.map(|i| items[donors[i]].clone()).collect();
            let batch = qa_batch(model, readers, chunk)?;
            let encoded = model.latents(&batch, readers)?;
            latent_vectors.extend(per_item(encoded.clone()));
            let prefixes = model.prefixes(encoded, readers);
            for (vectors, prefix) in prefix_vectors.iter_mut().zip(&prefixes) {
                vectors.extend(per_item(prefix.clone()));
            }
            let donated_batch = qa_batch(model, readers, &donated)?;
            let shuffled = model.prefixes(model.latents(&donated_batch, readers)?, readers);
            let own_prefixes = prefixes.clone();
            let per_reader = readers.iter().zip(prefixes.into_iter().zip(shuffled));
            for (m, (reader, (prefix, shuffled))) in per_reader.enumerate() {
                let ReaderBatch { texts, answers } = &batch.readers[m];
                content_tokens[m] += texts.iter().map(Vec::len).sum::<usize>();
                let around = reader.template().before.len() + reader.template().after.len();
                prompt_tokens[m] += texts.iter().map(|t| t.len() + around).sum::<usize>();
                let kinds = prompt_kinds(reader, chunk, texts, prefix, shuffled, latents)?;
                for (kind, contents) in kinds.into_iter().enumerate() {
                    let scored = self.score(reader, contents, answers, chunk)?;
                    outcomes[m][kind].extend(scored);
                }
            }
            if let ([a, b, ..], [pa, pb, ..]) = (readers, own_prefixes.as_slice()) {
                let at = first - chunk.len()..first;
                let answers = [&outcomes[0][1][at.clone()], &outcomes[1][1][at]];
                rescored.extend(rescore([a, b], [pa, pb], answers, chunk)?);
            }
            progress(chunk.len());
        }
        let all: Vec<usize> = (0..items.len()).collect();
        let relations: Vec<Relation> = items.iter().map(|item| item.relation).collect();
        let reports = readers.iter().enumerate().map(|(m, reader)| {
            let per_kind = &outcomes[m];
            let kind = |k: usize| scores(&per_kind[k], &all);
            Ok(ReaderReport {
                name: reader.name().to_string(),
                text: kind(0),
                latent: kind(1),
                token_budget: kind(2),
                question_only: kind(3),
                token_budget_question: kind(4),
                shuffled_latent: kind(5),
                by_relation: by_relation(reader, items, per_kind)?,
                compression: content_tokens[m] as f64 / (items.len() * latents) as f64,
                prompt_compression: prompt_tokens[m] as f64 / (items.len() * latents) as f64,
                payload_bytes: latents * width * 4,
                prefix_spread: Spread::of(&prefix_vectors[m], &relations),
            })
        });
        let reports = reports.collect::<Result<Vec<_>, LatentWireError>>()?;
        let joint = (readers.len() >= 2).then(|| joint_scores(&rescored));
        Ok(Report {
            readers: reports,
            joint,
            latent_spread: Spread::of(&latent_vectors, &relations),
        })
    }

    /// Each row's outcome given `contents`: teacher-forced scores, then a greedy answer (LatentWire's
    /// at least one token where the prompt is a latent prefix, as its eval generates those).
    fn score<B: Backend>(
        &self,
        reader: &Reader<B>,
        contents: Contents<B>,
        answers: &[Vec<u32>],
        items: &[QaItem],
    ) -> Result<Vec<Outcome>, LatentWireError> {
        let scored = teacher_forced(reader, contents.clone(), answers)?;
        let end = reader.template().end;
        let config = GenerationConfig {
            stop_tokens: vec![end],
            pad_token: end,
            ..GenerationConfig::greedy(self.max_new_tokens)
        };
        let mut generated = reader.generate(contents.clone(), &config)?;
        let said = |tokens: &[u32]| {
            let tokens: Vec<u32> = tokens.iter().copied().filter(|&t| t != end).collect();
            reader.tokenizer().decode(&tokens, true)
        };
        let predicted: Vec<String> = generated
            .iter()
            .map(|t| said(t))
            .collect::<Result<_, _>>()?;
        // LatentWire bans the end at the first step of a latent prefix's answer: the rows that
        // ended at once are generated again so.
        let ended: Vec<usize> = (0..generated.len())
            .filter(|&row| generated[row].first() == Some(&end))
            .collect();
        if matches!(contents, Contents::Embeddings(_)) && !ended.is_empty() {
            let forced = GenerationConfig {
                min_new_tokens: 1,
                ..config
            };
            let again = reader.generate(contents.select(&ended), &forced)?;
            for (row, tokens) in ended.into_iter().zip(again) {
                generated[row] = tokens;
            }
        }
        let mut outcomes = Vec::with_capacity(items.len());
        for (row, item) in items.iter().enumerate() {
            let clean = clean_pred(&said(&generated[row])?);
            outcomes.push(Outcome {
                scored: scored[row],
                em: exact_match(&predicted[row], &item.answer),
                f1: f1(&predicted[row], &item.answer),
                em_clean: exact_match(&clean, &item.answer),
                f1_clean: f1(&clean, &item.answer),
                clean,
            });
        }
        Ok(outcomes)
    }
}

/// The encoder's and the readers' batch of `items`.
fn qa_batch<B: Backend>(
    model: &LatentWire<B>,
    readers: &[Reader<B>],
    items: &[QaItem],
) -> Result<QaBatch, LatentWireError> {
    let sources: Vec<String> = items.iter().map(QaItem::source).collect();
    Ok(QaBatch {
        bytes: ByteBatch::new(&sources, model.encoder.max_bytes()),
        readers: (readers.iter())
            .map(|reader| reader_batch(reader, &sources, items))
            .collect::<Result<_, _>>()?,
    })
}

/// For each item, the item whose latent `shuffled_latent` reads it with: the next one (in
/// order, wrapping) asking about the same relation, else the next one.
fn donors(items: &[QaItem]) -> Vec<usize> {
    let n = items.len();
    (0..n)
        .map(|i| {
            let next = (1..n).map(|step| (i + step) % n);
            (next.clone())
                .find(|&j| items[j].relation == items[i].relation)
                .unwrap_or((i + 1) % n)
        })
        .collect()
}

/// The six prompt kinds of [`PROMPT_KINDS`], in order, for `items`: their `texts` (ids),
/// `prefix`, the texts' first `latents` ids, the questions, the question-first texts' first
/// `latents` ids, and the `shuffled` prefix.
fn prompt_kinds<B: Backend>(
    reader: &Reader<B>,
    items: &[QaItem],
    texts: &[Vec<u32>],
    prefix: Tensor<B, 3>,
    shuffled: Tensor<B, 3>,
    latents: usize,
) -> Result<Vec<Contents<B>>, LatentWireError> {
    let ids = |text: String| reader.ids(&text);
    let questions = (items.iter())
        .map(|item| ids(format!("Question: {}\n", item.question)))
        .collect::<Result<_, _>>()?;
    let question_first = (items.iter())
        .map(|item| {
            let ids = ids(format!(
                "Question: {}\nContext: {}\n",
                item.question, item.context
            ))?;
            Ok(ids[..ids.len().min(latents)].to_vec())
        })
        .collect::<Result<_, LatentWireError>>()?;
    let [text, latent, budget] = curve_kinds(texts, prefix, latents).map(|(_, c)| c);
    Ok(vec![
        text,
        latent,
        budget,
        Contents::Tokens(questions),
        Contents::Tokens(question_first),
        Contents::Embeddings(shuffled),
    ])
}

/// The three prompt kinds training's evaluations draw, named: the texts, the soft prompt
/// `prefix`, and the texts cut to their first `latents` tokens.
pub(crate) fn curve_kinds<B: Backend>(
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

/// Every kind's scores per relation, with the answers' first tokens.
fn by_relation<B: Backend>(
    reader: &Reader<B>,
    items: &[QaItem],
    per_kind: &[Vec<Outcome>],
) -> Result<BTreeMap<String, RelationReport>, LatentWireError> {
    let spelling = |id: u32| {
        reader
            .tokenizer()
            .token(id)
            .unwrap_or_else(|| format!("<{id}>"))
    };
    let mut relations = BTreeMap::new();
    for relation in Relation::ALL {
        let rows: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].relation == relation)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let (mut first, mut content) = (BTreeMap::new(), BTreeMap::new());
        for &i in &rows {
            let answer = reader.answer_ids(&items[i].answer)?;
            *first.entry(spelling(answer[0])).or_insert(0) += 1;
            let at = reader.first_content_token(&answer)?;
            *content.entry(spelling(answer[at])).or_insert(0) += 1;
        }
        let kinds = (PROMPT_KINDS.iter().zip(per_kind))
            .map(|(name, outcomes)| (name.to_string(), scores(outcomes, &rows)))
            .collect();
        relations.insert(
            relation.name().to_string(),
            RelationReport {
                items: rows.len(),
                answer_first_tokens: first,
                answer_first_content_tokens: content,
                kinds,
            },
        );
    }
    Ok(relations)
}

/// The scores of `outcomes`' items `rows`, with their standard errors.
fn scores(outcomes: &[Outcome], rows: &[usize]) -> Scores {
    let n = rows.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Outcome) -> f64| rows.iter().map(|&i| f(&outcomes[i])).sum::<f64>() / n;
    // The standard error of a mean of per-item values.
    let error = |f: &dyn Fn(&Outcome) -> f64| {
        if rows.len() < 2 {
            return 0.0;
        }
        let m = mean(f);
        let square = rows
            .iter()
            .map(|&i| (f(&outcomes[i]) - m).powi(2))
            .sum::<f64>();
        (square / (n - 1.0) / n).sqrt()
    };
    let flag = |b: bool| f64::from(u8::from(b));
    let tokens = mean(&|o| o.scored.tokens as f64).max(f64::MIN_POSITIVE);
    let nll = mean(&|o| o.scored.nll) / tokens;
    Scores {
        nll,
        first_token_accuracy: mean(&|o| flag(o.scored.first_right)),
        first_content_token_accuracy: mean(&|o| flag(o.scored.content_right)),
        em: mean(&|o| o.em),
        f1: mean(&|o| o.f1),
        em_clean: mean(&|o| o.em_clean),
        f1_clean: mean(&|o| o.f1_clean),
        items: rows.len(),
        standard_errors: StandardErrors {
            // A ratio of sums: the standard error of the mean of each item's NLL less `nll`
            // times its tokens, over the mean tokens (the delta method).
            nll: error(&|o| o.scored.nll - nll * o.scored.tokens as f64) / tokens,
            first_token_accuracy: error(&|o| flag(o.scored.first_right)),
            first_content_token_accuracy: error(&|o| flag(o.scored.content_right)),
            em: error(&|o| o.em),
            f1: error(&|o| o.f1),
        },
    }
}

/// One item's two latent-prefix answers scored jointly.
#[derive(Debug, Clone, Copy)]
struct Rescored {
    rescored_em: f64,
    rescored_f1: f64,
    agree: bool,
    oracle_em: f64,
    oracle_f1: f64,
}

/// The joint scores of the first two readers' latent-prefix answers `answers` to `items`: each
/// answer's log-likelihood under both readers, each given its own `prefixes`, summed.
fn rescore<B: Backend>(
    readers: [&Reader<B>; 2],
    prefixes: [&Tensor<B, 3>; 2],
    answers: [&[Outcome]; 2],
    items: &[QaItem],
) -> Result<Vec<Rescored>, LatentWireError> {
    let mut log_likelihood = [vec![0.0; items.len()], vec![0.0; items.len()]];
    for (candidate, total) in log_likelihood.iter_mut().enumerate() {
        let texts: Vec<&str> = answers[candidate]
            .iter()
            .map(|o| o.clean.as_str())
            .collect();
        for (reader, prefix) in readers.iter().zip(prefixes) {
            let ids = (texts.iter())
                .map(|text| reader.answer_ids(text))
                .collect::<Result<Vec<_>, _>>()?;
            // An empty answer has no likelihood to compare: it is never kept.
            let scored_ids: Vec<Vec<u32>> = (ids.iter())
                .map(|ids| {
                    if ids.is_empty() {
                        vec![reader.template().end]
                    } else {
                        ids.clone()
                    }
                })
                .collect();
            let scored = teacher_forced(reader, Contents::Embeddings(prefix.clone()), &scored_ids)?;
            for (row, ids) in ids.iter().enumerate() {
                total[row] -= if ids.is_empty() {
                    f64::INFINITY
                } else {
                    scored[row].nll
                };
            }
        }
    }
    Ok((0..items.len())
        .map(|row| {
            let [a, b] = answers.map(|o| o[row].clean.as_str());
            let gold = &items[row].answer;
            let pick = if log_likelihood[0][row] >= log_likelihood[1][row] {
                a
            } else {
                b
            };
            Rescored {
                rescored_em: exact_match(pick, gold),
                rescored_f1: f1(pick, gold),
                agree: normalize(a) == normalize(b),
                oracle_em: exact_match(a, gold).max(exact_match(b, gold)),
                oracle_f1: f1(a, gold).max(f1(b, gold)),
            }
        })
        .collect())
}

/// The means of `rescored`.
fn joint_scores(rescored: &[Rescored]) -> JointScores {
    let n = rescored.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Rescored) -> f64| rescored.iter().map(f).sum::<f64>() / n;
    JointScores {
        rescored_em: mean(&|r| r.rescored_em),
        rescored_f1: mean(&|r| r.rescored_f1),
        agreement: mean(&|r| f64::from(u8::from(r.agree))),
        oracle_em: mean(&|r| r.oracle_em),
        oracle_f1: mean(&|r| r.oracle_f1),
    }
}

/// A generated answer as LatentWire's eval keeps it (`_local_clean_pred`, models.py): cut at the
/// first of its stop strings, a leading `assistant` or `Assistant:` removed, the first non-empty
/// line, trimmed of spaces and ` .:;,'"-–—`.
fn clean_pred(text: &str) -> String {
    const STOPS: [&str; 7] = [
        "<|eot_id|>",
        "<|im_end|>",
        "</s>",
        "<|endoftext|>",
        "\n\n\n",
        "\nAssistant:",
        "\nassistant",
    ];
    let cut = STOPS
        .iter()
        .filter_map(|stop| text.find(stop))
        .min()
        .map_or(text, |at| &text[..at]);
    let cut = cut.trim_start();
    let cut = (cut.strip_prefix("Assistant:"))
        .or_else(|| cut.strip_prefix("assistant"))
        .unwrap_or(cut);
    let line = cut
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    line.trim_matches(|c: char| " \t\r\n.:;,'\"-–—".contains(c))
        .to_string()
}

/// One answer's teacher-forced scores: its summed NLL, its tokens, and whether its first token
/// and its first content token are the most likely there.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TeacherForced {
    pub nll: f64,
    pub tokens: usize,
    pub first_right: bool,
    pub content_right: bool,
}

/// The teacher-forced scores of each of `answers` (none empty) after `contents`.
pub(crate) fn teacher_forced<B: Backend>(
    reader: &Reader<B>,
    contents: Contents<B>,
    answers: &[Vec<u32>],
) -> Result<Vec<TeacherForced>, LatentWireError> {
    let composed = reader.compose(contents, answers);
    let logits = reader.forward(composed)?.logits;
    let [_, window, vocab] = logits.dims();
    let values = host_f32(logits);
    let mut scored = Vec::with_capacity(answers.len());
    for (row, answer) in answers.iter().enumerate() {
        let row_logits = |j: usize| &values[(row * window + j) * vocab..][..vocab];
        let right = |j: usize| argmax(row_logits(j)) == answer[j] as usize;
        let content = reader.first_content_token(answer)?;
        scored.push(TeacherForced {
            nll: (answer.iter().enumerate())
                .map(|(j, &token)| negative_log_softmax(row_logits(j), token as usize))
                .sum(),
            tokens: answer.len(),
            first_right: right(0),
            content_right: right(content),
        });
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

/// Each row of `x` (`[rows, M, width]`) flattened, on the host.
fn per_item<B: Backend>(x: Tensor<B, 3>) -> Vec<Vec<f32>> {
    let [rows, ..] = x.dims();
    let values = host_f32(x);
    values
        .chunks(values.len() / rows.max(1))
        .map(<[f32]>::to_vec)
        .collect()
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

    /// LatentWire's `_local_clean_pred`: stop strings, a leading speaker, the first non-empty
    /// line, trimmed punctuation; no lower-casing (EM and F1 normalise afterwards).
    #[test]
    fn predictions_are_cleaned_as_latentwire_cleans_them() {
        assert_eq!(clean_pred("  Tarnwick.\nMore text"), "Tarnwick");
        assert_eq!(clean_pred("\n\n  \"Belford\"; "), "Belford");
        assert_eq!(
            clean_pred("Assistant: a brass clock<|im_end|>x"),
            "a brass clock"
        );
        assert_eq!(clean_pred("12 May 1740\n\n\nQuestion"), "12 May 1740");
        assert_eq!(clean_pred("Answer: Oslo"), "Answer: Oslo");
        assert_eq!(clean_pred("..."), "");
    }

    /// Each item is read with the next one asking about the same relation, else the next one.
    #[test]
    fn donors_share_the_relation_where_one_does() {
        let mut items = crate::generate(crate::Split::Test, 5, 0);
        let relations = [
            Relation::Birthday,
            Relation::Occupation,
            Relation::Birthday,
            Relation::Possession,
            Relation::Occupation,
        ];
        for (item, relation) in items.iter_mut().zip(relations) {
            item.relation = relation;
        }
        assert_eq!(donors(&items), [2, 4, 0, 4, 1]);
    }

    /// Identical vectors have no spread; vectors that differ only by relation spread between
    /// relations alone; and the two parts add up in squares to the whole.
    #[test]
    fn spread_splits_into_relations_and_items_within_them() {
        let relations = [
            Relation::Birthday,
            Relation::Birthday,
            Relation::Occupation,
            Relation::Occupation,
        ];
        let same = vec![vec![1.0, -2.0]; 4];
        assert_eq!(Spread::of(&same, &relations), Spread::default());
        let by_relation = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]].map(Vec::from);
        let spread = Spread::of(&by_relation, &relations);
        assert_eq!(spread.within_relations, 0.0);
        // Mean (½, ½): every vector lies √½ from it, and each is of size 1.
        assert!((spread.between_items - 0.5f64.sqrt()).abs() < 1e-12);
        assert!((spread.between_relations - spread.between_items).abs() < 1e-12);
        let mixed = [[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, -1.0]].map(Vec::from);
        let spread = Spread::of(&mixed, &relations);
        assert!(spread.within_relations > 0.0 && spread.between_relations > 0.0);
        let parts = spread.between_relations.powi(2) + spread.within_relations.powi(2);
        assert!((parts - spread.between_items.powi(2)).abs() < 1e-12);
    }

    #[test]
    fn the_negative_log_likelihood_is_that_of_the_softmax() {
        let row = [0.0, (2.0f32).ln(), 0.0];
        assert!((negative_log_softmax(&row, 1) - 2f64.ln()).abs() < 1e-6);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
