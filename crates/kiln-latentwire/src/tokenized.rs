//! A split of the QA set tokenized once for every language model and kept on disk: LatentWire
//! tokenized its chat templates and targets again at every step. Items a model cannot read (a
//! text its tokenizer cannot encode, a sequence longer than its positions) are refused before
//! any training, by number.

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::{ByteBatch, LatentWireError, QaBatch, QaItem, Reader, ReaderBatch};

/// One language model's ids of a split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ReaderIds {
    name: String,
    texts: Vec<Vec<u32>>,
    answers: Vec<Vec<u32>>,
}

/// A split's texts and, for each language model, their ids and the answers'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizedSplit {
    /// What the ids were made from; a file made from anything else is made again.
    key: String,
    sources: Vec<String>,
    readers: Vec<ReaderIds>,
}

impl TokenizedSplit {
    /// `items` tokenized for `readers`; `key` names the items and the tokenizers (a file read
    /// back must carry the same). An empty split, an item a tokenizer cannot encode or an
    /// empty answer, and a text with its answer longer than a model's positions are errors.
    pub fn new<B: Backend>(
        items: &[QaItem],
        readers: &[Reader<B>],
        key: &str,
    ) -> Result<Self, LatentWireError> {
        if items.is_empty() {
            return Err(LatentWireError::Input("the split has no items".into()));
        }
        let sources: Vec<String> = items.iter().map(QaItem::source).collect();
        let mut ids = Vec::new();
        for reader in readers {
            let (mut texts, mut answers) = (Vec::new(), Vec::new());
            for (number, (item, source)) in (1..).zip(items.iter().zip(&sources)) {
                let at = |e: LatentWireError| {
                    LatentWireError::Input(format!("item {number} ({:?}): {e}", item.question))
                };
                let text = reader.ids(source).map_err(at)?;
                let answer = reader.answer_ids(&item.answer).map_err(at)?;
                if answer.is_empty() {
                    return Err(at(LatentWireError::Input("the answer is empty".into())));
                }
                let template = reader.template();
                let needed = template.before.len() + text.len() + template.after.len();
                let needed = needed + answer.len() + 1;
                let room = reader.lm().config().max_position_embeddings;
                if needed > room {
                    return Err(at(LatentWireError::Input(format!(
                        "{}: the prompt and answer take {needed} positions, the model has {room}",
                        reader.name()
                    ))));
                }
                texts.push(text);
                answers.push(answer);
            }
            ids.push(ReaderIds {
                name: reader.name().to_string(),
                texts,
                answers,
            });
        }
        Ok(TokenizedSplit {
            key: key.to_string(),
            sources,
            readers: ids,
        })
    }

    /// The split kept in `path` when it was made under `key`, else made now and written there.
    pub fn cached<B: Backend>(
        path: &Path,
        items: &[QaItem],
        readers: &[Reader<B>],
        key: &str,
    ) -> Result<Self, LatentWireError> {
        let kept = std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<TokenizedSplit>(&bytes).ok());
        if let Some(split) = kept.filter(|split| split.key == key) {
            match split.reads_as(items, readers) {
                Ok(()) => return Ok(split),
                Err(problem) => log::warn!(
                    "{}: {problem} (edited or damaged); tokenized again",
                    path.display()
                ),
            }
        }
        let split = Self::new(items, readers, key)?;
        let failed = |e: &dyn std::fmt::Display| LatentWireError::Input(e.to_string());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| failed(&format!("{}: {e}", parent.display())))?;
        }
        let bytes = serde_json::to_vec(&split).map_err(|e| failed(&e))?;
        kiln_io::write_atomic(path, &bytes).map_err(|e| failed(&e))?;
        Ok(split)
    }

    /// Refuses a split read back that is not what `items` tokenized for `readers` make: other
    /// texts, other models, rows missing, an id outside a model's vocabulary or a sequence
    /// longer than its positions (a file edited with its key intact).
    fn reads_as<B: Backend>(&self, items: &[QaItem], readers: &[Reader<B>]) -> Result<(), String> {
        let sources = items.iter().map(QaItem::source);
        if self.sources.len() != items.len() || !sources.eq(self.sources.iter().cloned()) {
            return Err("its texts are not the split's".into());
        }
        if self.readers.len() != readers.len() {
            return Err(format!(
                "{} models, not {}",
                self.readers.len(),
                readers.len()
            ));
        }
        for (ids, reader) in self.readers.iter().zip(readers) {
            let vocab = reader.lm().config().vocab_size;
            let room = reader.lm().config().max_position_embeddings;
            let template = reader.template();
            let fixed = template.before.len() + template.after.len() + 1;
            if ids.name != reader.name() || ids.texts.len() != items.len() {
                return Err(format!("no rows for {} of every item", reader.name()));
            }
            if ids.answers.len() != items.len() {
                return Err(format!("no answer for {} of every item", reader.name()));
            }
            for (number, (text, answer)) in (1..).zip(ids.texts.iter().zip(&ids.answers)) {
                if let Some(&id) = text.iter().chain(answer).find(|&&id| id as usize >= vocab) {
                    return Err(format!(
                        "item {number}: id {id} for {}, whose vocabulary has {vocab} tokens",
                        reader.name()
                    ));
                }
                if answer.is_empty() || fixed + text.len() + answer.len() > room {
                    return Err(format!(
                        "item {number}: a sequence {} cannot read",
                        reader.name()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Items in the split.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether the split has no items (never, once made).
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The mean tokens of a text for each language model.
    pub fn mean_text_tokens(&self) -> Vec<f64> {
        (self.readers.iter())
            .map(|r| r.texts.iter().map(Vec::len).sum::<usize>() as f64 / self.len() as f64)
            .collect()
    }

    /// The items at `indices` as a batch, their bytes cut at `max_bytes`.
    pub fn batch(&self, indices: &[usize], max_bytes: usize) -> QaBatch {
        let sources: Vec<&str> = indices.iter().map(|&i| self.sources[i].as_str()).collect();
        let pick = |rows: &[Vec<u32>]| indices.iter().map(|&i| rows[i].clone()).collect();
        QaBatch {
            bytes: ByteBatch::new(&sources, max_bytes),
            readers: (self.readers.iter())
                .map(|r| ReaderBatch {
                    texts: pick(&r.texts),
                    answers: pick(&r.answers),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::{Split, generate, tiny_readers};

    #[test]
    fn a_split_is_tokenized_once_and_read_back_under_its_key() {
        let readers = tiny_readers::<Flex>(&Default::default()).unwrap();
        let items = generate(Split::Train, 5, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens").join("train.json");
        let made = TokenizedSplit::cached(&path, &items, &readers, "seed 1").unwrap();
        assert_eq!(made.len(), 5);
        // The byte-level tokenizer: one id per byte.
        assert_eq!(made.readers[0].texts[2].len(), items[2].source().len());
        let read = TokenizedSplit::cached(&path, &items, &readers, "seed 1").unwrap();
        assert_eq!(read, made);
        // A file edited with its key intact is made again, not trusted: an id past a
        // vocabulary panicked in the embedding.
        let mut edited = made.clone();
        edited.readers[0].texts[1][0] = 888_888;
        std::fs::write(&path, serde_json::to_vec(&edited).unwrap()).unwrap();
        let read = TokenizedSplit::cached(&path, &items, &readers, "seed 1").unwrap();
        assert_eq!(read, made);
        let mut fewer = made.clone();
        fewer.readers[1].answers.pop();
        std::fs::write(&path, serde_json::to_vec(&fewer).unwrap()).unwrap();
        let read = TokenizedSplit::cached(&path, &items, &readers, "seed 1").unwrap();
        assert_eq!(read, made);
        let batch = made.batch(&[4, 0], 512);
        assert_eq!(batch.bytes.dims()[0], 2);
        assert_eq!(batch.readers[1].answers[0], made.readers[1].answers[4]);
        // Another key makes the split again, here from no items: an error.
        let error = TokenizedSplit::cached(&path, &[], &readers, "seed 2").unwrap_err();
        assert!(error.to_string().contains("no items"), "{error}");
    }

    #[test]
    fn an_item_longer_than_the_positions_is_refused_by_number() {
        let readers = tiny_readers::<Flex>(&Default::default()).unwrap();
        let mut items = generate(Split::Train, 3, 1);
        items[1].context = "word ".repeat(300);
        let error = TokenizedSplit::new(&items, &readers, "").unwrap_err();
        assert!(error.to_string().contains("item 2"), "{error}");
        assert!(error.to_string().contains("positions"), "{error}");
    }
}
