//! Held-out evaluation on kiln-text's tiny checkpoints.

use burn::backend::Flex;
use kiln_latentwire::{
    EncoderConfig, EncoderKind, Evaluation, LatentWire, QaItem, Reader, Relation,
};
use kiln_text::{GenerationConfig, TextInput, generate};

use crate::support::roomy_reader;

/// Items short enough for the tiny checkpoints' 64 positions.
fn items() -> Vec<QaItem> {
    let item = |context: &str, question: &str, answer: &str| QaItem {
        context: context.into(),
        question: question.into(),
        answer: answer.into(),
        answer_start: context.find(answer).unwrap(),
        relation: Relation::Birthplace,
        subject: "Ada".into(),
    };
    vec![
        item("Ada: Oslo.", "Where?", "Oslo"),
        item("Bo: a kite.", "What?", "a kite"),
        item("Cy: Rome.", "Where?", "Rome"),
    ]
}

fn reader() -> Reader<Flex> {
    roomy_reader("llama")
}

fn system(reader: &Reader<Flex>, latents: usize) -> LatentWire<Flex> {
    let config = EncoderConfig::new(latents)
        .with_width(16)
        .with_layers(1)
        .with_heads(2);
    let widths = [reader.model_width()];
    LatentWire::init(&config, EncoderKind::Bytes, &widths, &Default::default())
}

/// The text prompt's scores, batched and padded, are those of each item alone: its answer's
/// NLL from a forward over the unpadded sequence, and EM from `generate` on its own prompt.
#[test]
fn the_text_scores_are_each_items_alone() {
    let reader = reader();
    let items = items();
    let evaluation = Evaluation {
        batch: 2,
        max_new_tokens: 4,
    };
    let report = &evaluation
        .run(&system(&reader, 2), std::slice::from_ref(&reader), &items)
        .unwrap()
        .readers[0];

    let template = reader.template();
    let (mut nll, mut tokens, mut right, mut em) = (0.0, 0, 0, 0.0);
    for item in &items {
        let text = reader.ids(&item.source()).unwrap();
        let answer = reader.answer_ids(&item.answer).unwrap();
        let prompt = [&template.before[..], &text, &template.after].concat();
        let logits = reader
            .lm()
            .forward(TextInput::ids(vec![[&prompt[..], &answer].concat()]))
            .unwrap()
            .logits;
        let vocab = logits.dims()[2];
        let values = logits.into_data().to_vec::<f32>().unwrap();
        for (j, &token) in answer.iter().enumerate() {
            let row = &values[(prompt.len() - 1 + j) * vocab..][..vocab];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
            nll += f64::from(max) + sum.ln() - f64::from(row[token as usize]);
            if j == 0 {
                let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
                right += usize::from(best == token as usize);
            }
        }
        tokens += answer.len();
        let config = GenerationConfig {
            stop_tokens: vec![template.end],
            ..GenerationConfig::greedy(4)
        };
        let generated = generate(reader.lm(), &[prompt], &config, |_| {}).unwrap();
        let words: Vec<u32> = generated[0]
            .iter()
            .copied()
            .filter(|&t| t != template.end)
            .collect();
        let said = reader.tokenizer().decode(&words, true).unwrap();
        em += f64::from(u8::from(
            said.trim().eq_ignore_ascii_case(item.answer.trim()),
        ));
    }
    let text = report.text;
    assert!(
        (text.nll - nll / tokens as f64).abs() < 1e-4,
        "{} vs {}",
        text.nll,
        nll / tokens as f64
    );
    assert!((text.first_token_accuracy - right as f64 / 3.0).abs() < 1e-12);
    assert!((text.em - em / 3.0).abs() < 1e-12);
    assert!(report.latent.nll.is_finite() && report.latent.nll > 0.0);
    assert_eq!(report.payload_bytes, 2 * 16 * 4);
}

/// A budget of as many tokens as the longest text is the text itself.
#[test]
fn a_budget_as_long_as_the_text_scores_as_the_text() {
    let reader = reader();
    let items = items();
    let longest = items
        .iter()
        .map(|i| reader.ids(&i.source()).unwrap().len())
        .max()
        .unwrap();
    let evaluation = Evaluation {
        batch: 3,
        max_new_tokens: 3,
    };
    let report = &evaluation
        .run(
            &system(&reader, longest),
            std::slice::from_ref(&reader),
            &items,
        )
        .unwrap()
        .readers[0];
    assert_eq!(report.token_budget, report.text);
    assert!(report.compression <= 1.0);
}

#[test]
fn an_empty_split_is_an_error() {
    let reader = reader();
    let error = Evaluation::default()
        .run(&system(&reader, 2), std::slice::from_ref(&reader), &[])
        .unwrap_err();
    assert!(error.to_string().contains("no items"), "{error}");
}

/// The answer's summed NLL after `prompt` (the template's content), read whole by the model.
fn answer_nll(reader: &Reader<Flex>, content: &[u32], answer: &[u32]) -> f64 {
    let template = reader.template();
    let prompt = [&template.before[..], content, &template.after].concat();
    let ids = [&prompt[..], answer].concat();
    let logits = reader
        .lm()
        .forward(TextInput::ids(vec![ids]))
        .unwrap()
        .logits;
    let vocab = logits.dims()[2];
    let values = logits.into_data().to_vec::<f32>().unwrap();
    let mut nll = 0.0;
    for (j, &token) in answer.iter().enumerate() {
        let row = &values[(prompt.len() - 1 + j) * vocab..][..vocab];
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
        nll += f64::from(max) + sum.ln() - f64::from(row[token as usize]);
    }
    nll
}

/// The baselines read what they name: the question alone, and the question first then the
/// context cut to `M` tokens.
#[test]
fn the_baselines_that_know_the_question_read_it() {
    let reader = reader();
    let items = items();
    let latents = 3;
    let evaluation = Evaluation {
        batch: 2,
        max_new_tokens: 2,
    };
    let report = &evaluation
        .run(
            &system(&reader, latents),
            std::slice::from_ref(&reader),
            &items,
        )
        .unwrap()
        .readers[0];
    let (mut question, mut first, mut tokens) = (0.0, 0.0, 0);
    for item in &items {
        let answer = reader.answer_ids(&item.answer).unwrap();
        let asked = reader
            .ids(&format!("Question: {}\n", item.question))
            .unwrap();
        question += answer_nll(&reader, &asked, &answer);
        let both = format!("Question: {}\nContext: {}\n", item.question, item.context);
        let both = reader.ids(&both).unwrap();
        first += answer_nll(&reader, &both[..latents], &answer);
        tokens += answer.len();
    }
    let per_token = |x: f64| x / tokens as f64;
    assert!((report.question_only.nll - per_token(question)).abs() < 1e-4);
    assert!((report.token_budget_question.nll - per_token(first)).abs() < 1e-4);
    assert_ne!(report.question_only, report.text);
    for kind in kiln_latentwire::PROMPT_KINDS {
        let scores = report.kind(kind).unwrap();
        assert_eq!(scores.items, 3, "{kind}");
        assert!(scores.standard_errors.nll > 0.0, "{kind}: {scores:?}");
    }
}

/// Items that are all the same text read another's latent as their own; different texts do not.
#[test]
fn the_shuffled_latent_is_another_items() {
    let reader = reader();
    let evaluation = Evaluation {
        batch: 2,
        max_new_tokens: 2,
    };
    let model = system(&reader, 2);
    let same = vec![items()[0].clone(); 3];
    let report = &evaluation
        .run(&model, std::slice::from_ref(&reader), &same)
        .unwrap()
        .readers[0];
    assert!((report.shuffled_latent.nll - report.latent.nll).abs() < 1e-9);
    let report = &evaluation
        .run(&model, std::slice::from_ref(&reader), &items())
        .unwrap()
        .readers[0];
    assert!((report.shuffled_latent.nll - report.latent.nll).abs() > 1e-6);
    let error = evaluation
        .run(&model, std::slice::from_ref(&reader), &same[..1])
        .unwrap_err();
    assert!(error.to_string().contains("at least two"), "{error}");
}

/// Per relation: the items of each, the answers' first tokens counted, and scores whose
/// item-weighted mean is the overall score.
#[test]
fn scores_per_relation_add_up_to_the_whole() {
    let reader = reader();
    let mut items = items();
    items[1].relation = Relation::Possession;
    let evaluation = Evaluation {
        batch: 2,
        max_new_tokens: 2,
    };
    let report = &evaluation
        .run(&system(&reader, 2), std::slice::from_ref(&reader), &items)
        .unwrap()
        .readers[0];
    assert_eq!(report.by_relation.len(), 2);
    let birthplace = &report.by_relation["birthplace"];
    let possession = &report.by_relation["possession"];
    assert_eq!((birthplace.items, possession.items), (2, 1));
    assert_eq!(birthplace.answer_first_tokens.values().sum::<usize>(), 2);
    assert_eq!(
        possession
            .answer_first_content_tokens
            .values()
            .sum::<usize>(),
        1
    );
    for kind in kiln_latentwire::PROMPT_KINDS {
        let whole = report.kind(kind).unwrap();
        let weighted = (2.0 * birthplace.kinds[kind].first_token_accuracy
            + possession.kinds[kind].first_token_accuracy)
            / 3.0;
        assert!(
            (whole.first_token_accuracy - weighted).abs() < 1e-12,
            "{kind}"
        );
        let f1 = (2.0 * birthplace.kinds[kind].f1 + possession.kinds[kind].f1) / 3.0;
        assert!((whole.f1 - f1).abs() < 1e-12, "{kind}");
    }
}

/// Two models: LatentWire's joint scores, each between the worse and the better model's.
#[test]
fn two_models_are_scored_jointly() {
    let readers = [reader(), roomy_reader("qwen2")];
    let widths: Vec<usize> = readers.iter().map(Reader::model_width).collect();
    let config = EncoderConfig::new(2)
        .with_width(16)
        .with_layers(1)
        .with_heads(2);
    let model = LatentWire::<Flex>::init(&config, EncoderKind::Bytes, &widths, &Default::default());
    let evaluation = Evaluation {
        batch: 2,
        max_new_tokens: 3,
    };
    let report = evaluation.run(&model, &readers, &items()).unwrap();
    let joint = report.joint.expect("two models");
    let [a, b] = [&report.readers[0].latent, &report.readers[1].latent];
    assert!(joint.oracle_f1 >= a.f1_clean.max(b.f1_clean) - 1e-12);
    assert!(joint.rescored_f1 <= joint.oracle_f1 + 1e-12);
    assert!((0.0..=1.0).contains(&joint.agreement));
}
