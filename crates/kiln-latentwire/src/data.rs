//! A seeded extractive QA set, in place of SQuAD: each context states a few facts about two
//! invented people, each question asks for one of them, each answer is a span of its context.
//!
//! Held out, so that the test split measures reading rather than recall: every entity (a
//! person, a town, an object, a date) belongs to one split, chosen by a hash of its parts, and
//! each relation has phrasings of its facts and questions that only the test split uses.
//!
//! ```
//! use kiln_latentwire::{Split, generate};
//!
//! let items = generate(Split::Train, 3, 7);
//! assert_eq!(items, generate(Split::Train, 3, 7));
//! for item in &items {
//!     let start = item.answer_start;
//!     assert_eq!(&item.context[start..start + item.answer.len()], item.answer);
//! }
//! ```

use kiln_core::{SplitMix64, splitmix64};
use serde::{Deserialize, Serialize};

/// Which part of the set an item belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Split {
    /// Training items.
    Train,
    /// Held-out items: entities and phrasings that no training item uses.
    Test,
}

/// What a question asks about its person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Relation {
    /// The town they were born in.
    Birthplace,
    /// The date they were born on.
    Birthday,
    /// The town they work in.
    Workplace,
    /// The object they own.
    Possession,
    /// Their trade.
    Occupation,
}

impl Relation {
    /// Every relation, in declaration order.
    pub const ALL: [Relation; 5] = RELATIONS;

    /// Its name in reports: `birthplace`, `birthday`, `workplace`, `possession`, `occupation`.
    pub fn name(self) -> &'static str {
        match self {
            Relation::Birthplace => "birthplace",
            Relation::Birthday => "birthday",
            Relation::Workplace => "workplace",
            Relation::Possession => "possession",
            Relation::Occupation => "occupation",
        }
    }
}

/// One question about a context, and its answer: the span
/// `context[answer_start..answer_start + answer.len()]` (bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QaItem {
    /// Four sentences: two facts about each of two people.
    pub context: String,
    /// A question about one of those facts.
    pub question: String,
    /// The answer, as it appears in the context, once.
    pub answer: String,
    /// The answer's byte offset in the context.
    pub answer_start: usize,
    /// What the question asks.
    pub relation: Relation,
    /// The person it asks about.
    pub subject: String,
}

impl QaItem {
    /// The text the encoder and the language models read: LatentWire's SQuAD prompt,
    /// `"Context: …\nQuestion: …\n"`.
    pub fn source(&self) -> String {
        format!("Context: {}\nQuestion: {}\n", self.context, self.question)
    }
}

/// `count` items of `split`, the same for the same seed on every platform.
pub fn generate(split: Split, count: usize, seed: u64) -> Vec<QaItem> {
    let mut random = SplitMix64::new(splitmix64(splitmix64(seed) ^ split_salt(split)));
    let mut items = Vec::with_capacity(count);
    while items.len() < count {
        if let Some(item) = item(split, &mut random) {
            items.push(item);
        }
    }
    items
}

/// Every relation, in declaration order (the index of [`FACTS`] and [`QUESTIONS`]).
const RELATIONS: [Relation; 5] = [
    Relation::Birthplace,
    Relation::Birthday,
    Relation::Workplace,
    Relation::Possession,
    Relation::Occupation,
];

const GIVEN_STARTS: [&str; 12] = [
    "Ma", "Ve", "Lo", "Ta", "Ri", "So", "Ka", "Ne", "Do", "Fi", "Ha", "Jo",
];
const GIVEN_ENDS: [&str; 10] = [
    "ren", "lia", "nor", "dric", "vin", "sa", "mon", "ra", "bel", "tus",
];
const FAMILY_STARTS: [&str; 10] = [
    "Ash", "Brem", "Cald", "Dorr", "Elst", "Farn", "Grell", "Hollo", "Ivers", "Jask",
];
const FAMILY_ENDS: [&str; 8] = ["by", "well", "ton", "ley", "mark", "wood", "er", "en"];
const TOWN_STARTS: [&str; 10] = [
    "Tarn", "Bel", "Cor", "Mor", "Wen", "Dun", "Fal", "Kel", "Rav", "Sel",
];
const TOWN_ENDS: [&str; 8] = [
    "wick", "ford", "holm", "bury", "mere", "stead", "gate", "moor",
];
const MATERIALS: [&str; 8] = [
    "brass", "silver", "wooden", "copper", "glass", "velvet", "iron", "ivory",
];
const THINGS: [&str; 8] = [
    "lantern",
    "compass",
    "violin",
    "kettle",
    "telescope",
    "clock",
    "chessboard",
    "bicycle",
];
const TRADES: [&str; 10] = [
    "baker",
    "cartographer",
    "blacksmith",
    "weaver",
    "astronomer",
    "carpenter",
    "glassblower",
    "beekeeper",
    "bookbinder",
    "ferryman",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A new person's name of `split`'s.
fn person(split: Split, random: &mut SplitMix64) -> String {
    let sizes = [
        GIVEN_STARTS.len(),
        GIVEN_ENDS.len(),
        FAMILY_STARTS.len(),
        FAMILY_ENDS.len(),
    ];
    let [given, given_end, family, family_end] = draw(split, 1, random, &sizes);
    format!(
        "{}{} {}{}",
        GIVEN_STARTS[given], GIVEN_ENDS[given_end], FAMILY_STARTS[family], FAMILY_ENDS[family_end]
    )
}

/// The answer of a new fact of `relation`, of `split`'s.
fn value(relation: Relation, split: Split, random: &mut SplitMix64) -> String {
    match relation {
        Relation::Birthplace | Relation::Workplace => {
            let parts = draw(split, 2, random, &[TOWN_STARTS.len(), TOWN_ENDS.len()]);
            format!("{}{}", TOWN_STARTS[parts[0]], TOWN_ENDS[parts[1]])
        }
        Relation::Birthday => {
            let parts = draw(split, 3, random, &[28, MONTHS.len(), 300]);
            format!("{} {} {}", parts[0] + 1, MONTHS[parts[1]], 1700 + parts[2])
        }
        Relation::Possession => {
            let parts = draw(split, 4, random, &[MATERIALS.len(), THINGS.len()]);
            format!("{} {}", MATERIALS[parts[0]], THINGS[parts[1]])
        }
        // Too few trades to hold out by a hash: the last two are the test split's.
        Relation::Occupation => match split {
            Split::Train => TRADES[pick(random, TRADES.len() - 2)].to_string(),
            Split::Test => TRADES[TRADES.len() - 2 + pick(random, 2)].to_string(),
        },
    }
}

/// How each relation's facts are stated, in [`RELATIONS`]' order: `{person}` and `{value}` filled
/// in. Phrasings 0–1 are the training split's, 2 the test split's.
const FACTS: [[&str; 3]; 5] = [
    [
        "{person} was born in {value}.",
        "{value} is the town where {person} was born.",
        "{person} came into the world in {value}.",
    ],
    [
        "{person} was born on {value}.",
        "The birthday of {person} is {value}.",
        "On {value}, {person} was born.",
    ],
    [
        "{person} works in {value}.",
        "Every day {person} goes to work in {value}.",
        "{person} has a job in {value}.",
    ],
    [
        "{person} owns a {value}.",
        "A {value} belongs to {person}.",
        "{person} keeps a {value} at home.",
    ],
    [
        "{person} is a {value} by trade.",
        "{person} earns a living as a {value}.",
        "The trade of {person} is {value}.",
    ],
];

/// How each relation is asked about, as [`FACTS`].
const QUESTIONS: [[&str; 3]; 5] = [
    [
        "Where was {person} born?",
        "In which town was {person} born?",
        "What is the birthplace of {person}?",
    ],
    [
        "When was {person} born?",
        "On what date was {person} born?",
        "What is the birth date of {person}?",
    ],
    [
        "Where does {person} work?",
        "In which town does {person} work?",
        "Which town is {person}'s workplace in?",
    ],
    [
        "What does {person} own?",
        "Which object belongs to {person}?",
        "What object does {person} have?",
    ],
    [
        "What is {person}'s trade?",
        "What does {person} do for a living?",
        "What is the job of {person}?",
    ],
];

/// The sentence stating that `relation` of `person` is `value`, in phrasing `phrasing`.
fn fact(relation: Relation, phrasing: usize, person: &str, value: &str) -> String {
    FACTS[relation as usize][phrasing]
        .replace("{person}", person)
        .replace("{value}", value)
}

/// The question asking for `relation` of `person`, in phrasing `phrasing`.
fn question(relation: Relation, phrasing: usize, person: &str) -> String {
    QUESTIONS[relation as usize][phrasing].replace("{person}", person)
}

/// A fact of a context: `sentence` states that `relation` of `person` is `answer`.
struct Fact {
    relation: Relation,
    person: String,
    answer: String,
    sentence: String,
}

/// One item, or `None` where the draws made its answer ambiguous (the same name or value twice).
fn item(split: Split, random: &mut SplitMix64) -> Option<QaItem> {
    let people = [person(split, random), person(split, random)];
    if people[0] == people[1] {
        return None;
    }
    // Two different relations per person, each stated once in one of the split's phrasings.
    let mut facts = Vec::with_capacity(4);
    for person in people {
        let first = pick(random, RELATIONS.len());
        let second = (first + 1 + pick(random, RELATIONS.len() - 1)) % RELATIONS.len();
        for relation in [RELATIONS[first], RELATIONS[second]] {
            let answer = value(relation, split, random);
            let sentence = fact(relation, phrasing(split, random), &person, &answer);
            facts.push(Fact {
                relation,
                person: person.clone(),
                answer,
                sentence,
            });
        }
    }
    // The facts in a random order, the question about one of them.
    for index in (1..facts.len()).rev() {
        facts.swap(index, pick(random, index + 1));
    }
    let context = facts
        .iter()
        .map(|f| f.sentence.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let asked = facts.swap_remove(pick(random, facts.len()));
    // The answer occurs once in the context, so that its span is the answer.
    let mut found = context.match_indices(asked.answer.as_str());
    let (answer_start, _) = found.next()?;
    if found.next().is_some() {
        return None;
    }
    Some(QaItem {
        question: question(asked.relation, phrasing(split, random), &asked.person),
        answer: asked.answer,
        answer_start,
        relation: asked.relation,
        subject: asked.person,
        context,
    })
}

/// A phrasing of `split`'s: 0 or 1 for training, 2 for the test split.
fn phrasing(split: Split, random: &mut SplitMix64) -> usize {
    match split {
        Split::Train => pick(random, 2),
        Split::Test => 2,
    }
}

/// The parts of a new entity of kind `kind` belonging to `split`, each below its `sizes`:
/// drawn until a hash of the parts puts the entity in `split` (one in five in the test split).
fn draw<const N: usize>(
    split: Split,
    kind: u64,
    random: &mut SplitMix64,
    sizes: &[usize; N],
) -> [usize; N] {
    loop {
        let parts = sizes.map(|n| pick(random, n));
        let hash = (parts.iter()).fold(splitmix64(kind), |h, &p| splitmix64(h ^ p as u64));
        if (hash % 5 == 0) == (split == Split::Test) {
            return parts;
        }
    }
}

/// A uniform index below `n`.
fn pick(random: &mut SplitMix64, n: usize) -> usize {
    (random.unit() * n as f64) as usize
}

/// Keeps the two splits' random streams apart for the same seed.
fn split_salt(split: Split) -> u64 {
    match split {
        Split::Train => 1,
        Split::Test => 2,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Every answer is the span at its offset, once in its context; the set is the same for
    /// the same seed and different for another.
    #[test]
    fn answers_are_unique_spans_of_their_contexts() {
        for split in [Split::Train, Split::Test] {
            let items = generate(split, 400, 3);
            assert_eq!(items, generate(split, 400, 3));
            assert_ne!(items, generate(split, 400, 4));
            for item in &items {
                let span = &item.context[item.answer_start..item.answer_start + item.answer.len()];
                assert_eq!(span, item.answer);
                assert_eq!(item.context.matches(item.answer.as_str()).count(), 1);
            }
            let relations: HashSet<_> = items.iter().map(|i| i.relation).collect();
            assert_eq!(
                relations.len(),
                RELATIONS.len(),
                "{split:?}: every relation asked"
            );
        }
    }

    /// No test answer, test person or test phrasing occurs in any training item, and each
    /// split has many entities of every kind.
    #[test]
    fn the_test_split_is_held_out() {
        let train = generate(Split::Train, 1000, 1);
        let test = generate(Split::Test, 300, 1);
        let seen: String = train
            .iter()
            .flat_map(|i| [i.context.as_str(), i.question.as_str()])
            .collect::<Vec<_>>()
            .join("\n");
        for item in &test {
            // Bounded by a space on one side: "3 May 1750" is inside "13 May 1750".
            let bounded = [format!(" {}", item.answer), format!("{} ", item.answer)];
            assert!(
                bounded.iter().all(|a| !seen.contains(a.as_str())),
                "the test answer {:?} occurs in training",
                item.answer
            );
            assert!(
                !seen.contains(&item.subject),
                "{} in training",
                item.subject
            );
        }
        for split in [&train, &test] {
            for relation in RELATIONS {
                let answers: HashSet<_> = (split.iter())
                    .filter(|i| i.relation == relation)
                    .map(|i| &i.answer)
                    .collect();
                assert!(answers.len() >= 2, "{relation:?}: {answers:?}");
            }
        }
        // The tables are indexed by the relation's discriminant.
        assert!(RELATIONS.iter().enumerate().all(|(i, &r)| r as usize == i));
        let phrasings = |p: usize| RELATIONS.map(|r| [question(r, p, "X"), fact(r, p, "X", "Y")]);
        let train: HashSet<_> = [phrasings(0), phrasings(1)]
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        let test: HashSet<_> = phrasings(2).into_iter().flatten().collect();
        assert!(test.is_disjoint(&train));
    }
}
