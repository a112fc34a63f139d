//! A frozen language model reading prompts in its chat template (kiln-text's tiny checkpoints).

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_latentwire::reader::{ANCHOR, SYSTEM_PROMPT};
use kiln_latentwire::{Contents, LatentWireError, Layout, Reader};
use kiln_text::{GenerationConfig, TextInput, generate};

use crate::support::{language_model, max_gap, roomy_reader};

/// kiln-text's tiny Llama's tokenizer and shape, with room for the system prompt.
fn tiny() -> Reader<Flex> {
    roomy_reader("llama")
}

/// `text` then the end id, as the losses score an answer.
fn answer(reader: &Reader<Flex>, text: &str) -> Vec<u32> {
    [reader.ids(text).unwrap(), vec![reader.template().end]].concat()
}

#[test]
fn the_content_sits_in_the_user_turn_of_the_chat_template() {
    let reader = tiny();
    let template = reader.template();
    let text = |ids: &[u32]| reader.tokenizer().decode(ids, false).unwrap();
    let system = format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n");
    assert_eq!(
        text(&template.before),
        format!("{system}<|im_start|>user\n")
    );
    assert_eq!(
        text(&template.after),
        "<|im_end|>\n<|im_start|>assistant\nAnswer:"
    );
    assert_eq!(
        Some(template.end),
        reader.tokenizer().token_id("<|im_end|>")
    );
}

/// An answer's ids are those of running text after the anchor: its space joins its first token.
#[test]
fn answers_continue_the_anchor_as_running_text() {
    let reader = tiny();
    for answer in ["Paris", "the 3rd of May", "Lake Ørsted"] {
        let ids = reader.answer_ids(answer).unwrap();
        let anchored = reader.ids(&format!("{ANCHOR} {answer}")).unwrap();
        assert_eq!(
            [reader.ids(ANCHOR).unwrap(), ids.clone()].concat(),
            anchored
        );
        let decoded = reader.tokenizer().decode(&ids, false).unwrap();
        assert_eq!(decoded, format!(" {answer}"));
    }
    assert!(reader.answer_ids("").unwrap().is_empty());
}

/// Rows of different content and answer lengths, padded into one batch, get the logits each
/// sequence gets alone, at its answer's positions.
#[test]
fn padded_rows_get_the_logits_of_their_sequences_alone() {
    let reader = tiny();
    let contents = vec![
        reader.ids("Ada was born in Oslo.").unwrap(),
        reader.ids("Who?").unwrap(),
    ];
    let answers = vec![
        answer(&reader, "Oslo"),
        answer(&reader, "a long answer here"),
    ];
    assert_ne!(contents[0].len(), contents[1].len());
    assert_ne!(answers[0].len(), answers[1].len());
    let composed = reader.compose(Contents::Tokens(contents.clone()), &answers);
    let window = composed.window;
    let logits = reader.forward(composed).unwrap().logits;
    assert_eq!(logits.dims()[1], window);
    let template = reader.template();
    for (row, (content, answer)) in contents.iter().zip(&answers).enumerate() {
        let alone = [&template.before[..], content, &template.after, answer].concat();
        let single = reader
            .lm()
            .forward(TextInput::ids(vec![alone]))
            .unwrap()
            .logits;
        let start = template.before.len() + content.len() + template.after.len();
        let vocab = single.dims()[2];
        let want = single.slice([0..1, start - 1..start - 1 + answer.len(), 0..vocab]);
        let got = logits
            .clone()
            .slice([row..row + 1, 0..answer.len(), 0..vocab]);
        assert!(max_gap(got, want) < 1e-4, "row {}", row + 1);
    }
}

/// A soft prompt made of the content's own token embeddings reads as those tokens.
#[test]
fn a_soft_prompt_of_token_embeddings_reads_as_the_tokens() {
    let reader = tiny();
    let first = reader.ids("one two three").unwrap();
    let contents = vec![first.clone(), first.into_iter().rev().collect()];
    let answers = vec![answer(&reader, "yes"), answer(&reader, "no idea")];
    let flat: Vec<i64> = contents.iter().flatten().map(|&id| i64::from(id)).collect();
    let shape = [2, contents[0].len()];
    let ids = Tensor::<Flex, 2, Int>::from_data(TensorData::new(flat, shape), &Default::default());
    let prefix = reader.lm().embed(ids);
    let forward = |contents| {
        reader
            .forward(reader.compose(contents, &answers))
            .unwrap()
            .logits
    };
    let gap = max_gap(
        forward(Contents::Embeddings(prefix)),
        forward(Contents::Tokens(contents)),
    );
    assert!(gap < 1e-4, "{gap}");
}

/// Each calibrated row's RMS over its `M × hidden` values is the embedding table's, whatever
/// the row's own scale.
#[test]
fn calibrated_prompts_have_the_embeddings_rms() {
    let reader = tiny();
    let device = Default::default();
    let small = Tensor::<Flex, 3>::ones([1, 3, 48], &device) * 0.01;
    let large = Tensor::<Flex, 3>::random([1, 3, 48], burn::tensor::Distribution::Default, &device);
    let calibrated = reader.calibrate(Tensor::cat(vec![small, large * 40.0], 0));
    let rms = calibrated.powi_scalar(2).mean_dim(2).mean_dim(1).sqrt();
    for row in rms.into_data().to_vec::<f32>().unwrap() {
        assert!((row - reader.embedding_rms()).abs() < 1e-5 * row, "{row}");
    }
    assert!(reader.embedding_rms() > 0.0);
}

#[test]
fn a_missing_language_model_is_an_error_naming_it() {
    let missing = language_model("no-such-model");
    let error = Reader::<Flex>::from_hf_dir(&missing, &Default::default()).unwrap_err();
    assert!(matches!(error, LatentWireError::Input(_)), "{error}");
    assert!(error.to_string().contains("no-such-model"), "{error}");
}

/// Greedy answers to a soft prompt of the content's token embeddings (`Reader::generate`, after
/// the template's cached opening) are those kiln-text's `generate` gives the whole prompts as
/// ids, one at a time.
#[test]
fn a_soft_prompt_of_token_embeddings_generates_as_the_tokens() {
    let reader = tiny();
    let first = reader.ids("one two three").unwrap();
    let contents = [first.clone(), first.into_iter().rev().collect::<Vec<_>>()];
    let flat: Vec<i64> = contents.iter().flatten().map(|&id| i64::from(id)).collect();
    let shape = [2, contents[0].len()];
    let ids = Tensor::<Flex, 2, Int>::from_data(TensorData::new(flat, shape), &Default::default());
    let end = reader.template().end;
    let config = GenerationConfig {
        stop_tokens: vec![end],
        pad_token: end,
        ..GenerationConfig::greedy(6)
    };
    let prefix = reader.lm().embed(ids);
    let batched = reader
        .generate(Contents::Embeddings(prefix), &config)
        .unwrap();
    let template = reader.template();
    for (content, got) in contents.iter().zip(&batched) {
        let prompt = [&template.before[..], content, &template.after].concat();
        let alone = generate(reader.lm(), &[prompt], &config, |_| {}).unwrap();
        assert_eq!(got, &alone[0]);
    }
    assert!(batched.iter().all(|tokens| !tokens.is_empty()));
}

/// `Layout::Latentwire`: a soft prompt of token embeddings reads and generates as those tokens
/// alone at position 0 (no template, no anchor), answers are their own ids with no space before
/// them, and token prompts keep the chat template without the anchor.
#[test]
fn latentwires_layout_reads_a_bare_prefix_at_position_zero() {
    let reader = tiny().with_layout(Layout::Latentwire).unwrap();
    assert_eq!(reader.layout(), Layout::Latentwire);
    assert_eq!(
        reader.answer_ids("Paris").unwrap(),
        reader.ids("Paris").unwrap()
    );
    let text = |ids: &[u32]| reader.tokenizer().decode(ids, false).unwrap();
    assert_eq!(
        text(&reader.template().after),
        "<|im_end|>\n<|im_start|>assistant\n"
    );
    let content = reader.ids("one two three").unwrap();
    let answer = answer(&reader, "yes");
    let flat: Vec<i64> = content.iter().map(|&id| i64::from(id)).collect();
    let shape = [1, content.len()];
    let ids = Tensor::<Flex, 2, Int>::from_data(TensorData::new(flat, shape), &Default::default());
    let prefix = reader.lm().embed(ids);
    let composed = reader.compose(
        Contents::Embeddings(prefix.clone()),
        std::slice::from_ref(&answer),
    );
    assert!(!composed.after_opening);
    assert_eq!(composed.answer_start, content.len());
    let got = reader.forward(composed).unwrap().logits;
    let whole = [content.clone(), answer.clone()].concat();
    let input = TextInput::ids(vec![whole]).with_logits_from(content.len() - 1);
    let alone = reader.lm().forward(input).unwrap().logits;
    let gap = max_gap(got, alone);
    assert!(gap < 1e-4, "{gap}");
    let config = GenerationConfig::greedy(4);
    let generated = reader
        .generate(Contents::Embeddings(prefix), &config)
        .unwrap();
    let expected = generate(reader.lm(), &[content], &config, |_| {}).unwrap();
    assert_eq!(generated, expected);
}

/// The first content token is the first that is not whitespace alone.
#[test]
fn the_first_content_token_skips_bare_spaces() {
    let reader = tiny();
    let answer = reader.answer_ids("12 May 1740").unwrap();
    let at = reader.first_content_token(&answer).unwrap();
    let spelled = |ids: &[u32]| reader.tokenizer().decode(ids, false).unwrap();
    assert!(
        spelled(&answer[..at]).trim().is_empty(),
        "{:?}",
        spelled(&answer[..at])
    );
    assert_eq!(
        spelled(&answer[at..=at]).trim_start().chars().next(),
        Some('1')
    );
    let space = reader.ids(" ").unwrap();
    let bare = [space.clone(), reader.ids("x").unwrap()].concat();
    assert_eq!(reader.first_content_token(&bare).unwrap(), space.len());
    assert_eq!(reader.first_content_token(&space).unwrap(), 0);
}

/// A soft prompt is scaled to the rows the model reads: Gemma 3 multiplies its table's by
/// √hidden, so its prompts' RMS is that of `embed`'s output, not of the table.
#[test]
fn soft_prompts_take_the_scale_of_the_embeddings_read() {
    let reader = roomy_reader::<Flex>("gemma3");
    let vocab = reader.lm().config().vocab_size;
    let ids: Vec<i64> = (0..vocab as i64).collect();
    let ids =
        Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, [1, vocab]), &Default::default());
    let read = reader.lm().embed(ids);
    let rms = read.powi_scalar(2).mean().sqrt().into_scalar();
    assert!(
        (rms - reader.embedding_rms()).abs() < 1e-4 * rms,
        "{rms} vs {}",
        reader.embedding_rms()
    );
    let table = reader
        .lm()
        .input_embeddings()
        .powi_scalar(2)
        .mean()
        .sqrt()
        .into_scalar();
    assert!(
        rms > 5.0 * table,
        "Gemma 3 scales its embeddings by √36: {rms} vs {table}"
    );
}
