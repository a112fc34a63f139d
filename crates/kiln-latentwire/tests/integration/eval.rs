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
        .unwrap()[0];

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
        .unwrap()[0];
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
