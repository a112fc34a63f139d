//! Multiple-choice questions about clips, as fVLM's benchmark shards hold them and its
//! `benchmark.py` reads them: the options listed in the question (`parse_mcq_options`), the
//! answer's letter (`extract_answer_letter`), the category from the source.
//!
//! A questions file is JSON Lines, one question a line, its fields fVLM's shard JSON's and the
//! clip's name below the clips folder:
//!
//! ```text
//! {"clip": "dog.gif", "user": "What does the dog do?\nA. It runs.\nB. It sleeps.", "assistant": "A. It runs.", "source": "mvbench/action"}
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::FoveatedError;
use crate::captions::read_lines;

/// One question about a clip.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The clip, as the clip cache names it.
    pub clip: String,
    /// The question with its options listed, `A. …` a line (fVLM's `user`).
    pub user: String,
    /// The right answer, its letter first (fVLM's `assistant`: `"B. It sleeps."` or `"B"`).
    pub assistant: String,
    /// The benchmark and category, `mvbench/action_sequence` (the last part is the category).
    #[serde(default)]
    pub source: Option<String>,
}

impl Question {
    /// The options, by letter ([`mcq_options`] of the question).
    pub fn options(&self) -> BTreeMap<char, String> {
        mcq_options(&self.user)
    }

    /// The right answer's letter ([`answer_letter`]).
    pub fn answer(&self) -> String {
        answer_letter(&self.assistant)
    }

    /// The category: the source's last `/`-separated part, `unknown` without a source.
    pub fn category(&self) -> String {
        let source = self.source.as_deref().unwrap_or("unknown");
        source.rsplit('/').next().unwrap_or(source).to_string()
    }
}

/// The questions of a JSON Lines file (blank lines skipped), refusing a line that is not one by
/// its 1-based number.
pub fn read_questions(path: impl AsRef<Path>) -> Result<Vec<Question>, FoveatedError> {
    let form = "{\"clip\": NAME, \"user\": QUESTION, \"assistant\": ANSWER, \"source\": CATEGORY}";
    let lines = read_lines(path.as_ref(), "a question", form)?;
    Ok(lines.into_iter().map(|(_, question)| question).collect())
}

/// The options listed in `text`, as fVLM's `parse_mcq_options` finds them (its regular
/// expression `([A-Z])\.\s*(.+?)(?=\n[A-Z]\.|$)`, dot matching newlines): each capital letter
/// followed by a full stop starts an option that runs to the next line starting with one, or
/// to the end; the option is `"B. text"`, its text stripped. A later option of the same letter
/// replaces an earlier one, and a capital with a full stop inside the question ("U.S.") starts
/// one too, as in fVLM.
pub fn mcq_options(text: &str) -> BTreeMap<char, String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let count = chars.len();
    let byte = |at: usize| chars.get(at).map_or(text.len(), |&(byte, _)| byte);
    let starts_option =
        |at: usize| at + 1 < count && chars[at].1.is_ascii_uppercase() && chars[at + 1].1 == '.';
    // The lookahead: the end of the text (or its final newline), or a line starting an option.
    let ends_option = |at: usize| {
        at == count
            || (at + 1 == count && chars[at].1 == '\n')
            || (chars[at].1 == '\n' && starts_option(at + 1))
    };
    let mut options = BTreeMap::new();
    let mut at = 0;
    while at < count {
        if !starts_option(at) {
            at += 1;
            continue;
        }
        let letter = chars[at].1;
        let mut start = at + 2;
        while start < count && chars[start].1.is_whitespace() {
            start += 1;
        }
        if start == count {
            // `\s*` gives a character back to `.+?`, which needs one.
            if start == at + 2 {
                break;
            }
            start -= 1;
        }
        let mut end = start + 1;
        while !ends_option(end) {
            end += 1;
        }
        let body = text[byte(start)..byte(end)].trim();
        options.insert(letter, format!("{letter}. {body}"));
        at = end;
    }
    options
}

/// The letter of an answer, as fVLM's `extract_answer_letter` reads it: a capital followed by
/// a full stop at the start, else the first character, else `?`.
pub fn answer_letter(text: &str) -> String {
    let text = text.trim();
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(letter), Some('.')) if letter.is_ascii_uppercase() => letter.to_string(),
        (Some(first), _) => first.to_string(),
        (None, _) => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_answers_are_read_as_fvlm_reads_them() {
        let options = mcq_options("Which? A. one\nB. two\n");
        assert_eq!(options.values().collect::<Vec<_>>(), ["A. one", "B. two"]);
        assert_eq!(answer_letter(" B. two"), "B");
        let question = Question {
            clip: "a".into(),
            user: String::new(),
            assistant: "C".into(),
            source: Some("mvbench/action".into()),
        };
        assert_eq!(
            (question.answer(), question.category()),
            ("C".into(), "action".into())
        );
    }
}
