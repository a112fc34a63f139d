//! LatentWire's objective against the same terms recomputed one sequence at a time (no padding,
//! no masks, plain arithmetic on the logits), on kiln-text's tiny Llama and Qwen2 checkpoints.

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_latentwire::{
    ByteBatch, Encoder, EncoderConfig, EncoderKind, LatentWire, Objective, QaBatch, Reader,
    ReaderBatch,
};
use kiln_text::TextInput;

use crate::support::roomy_reader;

type Ad = Autodiff<Flex>;

const ITEMS: [(&str, &str); 2] = [("Ada: Oslo.", "Oslo"), ("Bo: a red kite.", "a red kite")];

fn readers<B: Backend>() -> Vec<Reader<B>> {
    ["llama", "qwen2"].map(roomy_reader).into()
}

fn system<B: Backend>(readers: &[Reader<B>]) -> LatentWire<B> {
    system_reading(readers, EncoderKind::Bytes)
}

/// A tiny system whose encoder reads what `kind` says.
fn system_reading<B: Backend>(readers: &[Reader<B>], kind: EncoderKind) -> LatentWire<B> {
    let config = EncoderConfig::new(3)
        .with_width(16)
        .with_layers(1)
        .with_heads(2)
        .with_max_bytes(64);
    let widths: Vec<usize> = readers.iter().map(Reader::model_width).collect();
    LatentWire::init(&config, kind, &widths, &Default::default())
}

fn batch<B: Backend>(readers: &[Reader<B>]) -> QaBatch {
    let texts: Vec<&str> = ITEMS.iter().map(|(text, _)| *text).collect();
    QaBatch {
        bytes: ByteBatch::new(&texts, 64),
        readers: readers
            .iter()
            .map(|reader| ReaderBatch {
                texts: ITEMS.iter().map(|(t, _)| reader.ids(t).unwrap()).collect(),
                answers: ITEMS.iter().map(|(_, a)| reader.ids(a).unwrap()).collect(),
            })
            .collect(),
    }
}

/// `log softmax(row / τ)` in f64.
fn log_softmax(row: &[f32], temperature: f64) -> Vec<f64> {
    let scaled: Vec<f64> = row.iter().map(|&x| f64::from(x) / temperature).collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scaled.iter().map(|x| (x - max).exp()).sum();
    scaled.iter().map(|x| x - max - sum.ln()).collect()
}

/// The logits `[tokens][vocab]` of one sequence: the template around `content` (embeddings
/// `[1, n, hidden]`) then `answer` ids.
fn logits_alone(reader: &Reader<Flex>, content: Tensor<Flex, 3>, answer: &[u32]) -> Vec<Vec<f32>> {
    let template = reader.template();
    let embed = |ids: &[u32]| {
        let ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        let shape = [1, ids.len()];
        let ids =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, shape), &Default::default());
        reader.lm().embed(ids)
    };
    let after = [template.after.as_slice(), answer].concat();
    let x = Tensor::cat(vec![embed(&template.before), content, embed(&after)], 1);
    let logits = reader
        .lm()
        .forward(TextInput::embeddings(x))
        .unwrap()
        .logits;
    let vocab = logits.dims()[2];
    let values = logits.into_data().to_vec::<f32>().unwrap();
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// Every term of every language model, and the total, as the means LatentWire's train.py
/// takes (K = 2 here, so that step 1 averages the longer answer only).
#[test]
fn each_term_is_the_mean_it_names() {
    let trained = readers::<Ad>();
    let model = system::<Ad>(&trained);
    let batch = batch(&trained);
    let objective = Objective::new().with_k(2);
    let loss = objective.loss(&model, &trained, &batch).unwrap();

    let readers = readers::<Flex>();
    let model = model.valid();
    let prefixes = model.prefixes(model.latents(&batch, &readers).unwrap(), &readers);
    let mut total = 0.0;
    for (m, (reader, items)) in readers.iter().zip(&batch.readers).enumerate() {
        let end = reader.template().end;
        let (mut scored, mut first, mut steps, mut kd) =
            (Vec::new(), Vec::new(), [vec![], vec![]], [vec![], vec![]]);
        for (row, (text, answer)) in items.texts.iter().zip(&items.answers).enumerate() {
            let answer = [answer.as_slice(), &[end]].concat();
            let prefix = prefixes[m].clone().narrow(0, row, 1);
            let student = logits_alone(reader, prefix.clone(), &answer);
            let ids: Vec<i64> = text.iter().map(|&id| i64::from(id)).collect();
            let n = ids.len();
            let text_ids = Tensor::<Flex, 2, Int>::from_data(
                TensorData::new(ids, [1, n]),
                &Default::default(),
            );
            let teacher = logits_alone(reader, reader.lm().embed(text_ids), &answer);
            let (s_start, t_start) = (
                student.len() - answer.len() - 1,
                teacher.len() - answer.len() - 1,
            );
            for (j, &token) in answer.iter().enumerate() {
                let ce = -log_softmax(&student[s_start + j], 1.0)[token as usize];
                scored.push(ce);
                if j == 0 {
                    first.push(ce);
                }
                if j < 2 && j < answer.len() - 1 {
                    steps[j].push(ce);
                    let (s, t) = (
                        log_softmax(&student[s_start + j], 2.0),
                        log_softmax(&teacher[t_start + j], 2.0),
                    );
                    let kl: f64 = s.iter().zip(&t).map(|(s, t)| t.exp() * (t - s)).sum();
                    kd[j].push(4.0 * kl);
                }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let tf = mean(&scored);
        let first = mean(&first);
        let k_token = (mean(&steps[0]) + mean(&steps[1])) / 2.0;
        let kd = (mean(&kd[0]) + mean(&kd[1])) / 2.0;
        let got = loss.terms[m];
        for (name, got, want) in [
            ("tf", got.teacher_forced, tf),
            ("first", got.first_token, first),
            ("k", got.k_token, k_token),
            ("kd", got.distillation, kd),
        ] {
            assert!(
                (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0),
                "LM {m} {name}: {got} vs {want}"
            );
        }
        let autoscale = (first / tf.max(1e-4)).clamp(1.0, 8.0);
        total += tf + 0.5 * autoscale * first + 0.5 * k_token + kd;
    }
    // The adapters' scales start at 1: no penalty yet.
    assert_eq!(loss.scale_penalty, 0.0);
    let want = total / 2.0;
    let got = f64::from(loss.loss.into_scalar());
    assert!((got - want).abs() <= 1e-4 * want, "{got} vs {want}");
}

/// AdamW steps on one batch lower the loss, with either encoder; the language models get no
/// gradient.
#[test]
fn training_steps_lower_the_loss_and_leave_the_language_models_frozen() {
    training_lowers_the_loss(EncoderKind::Bytes);
    training_lowers_the_loss(EncoderKind::States);
}

fn training_lowers_the_loss(kind: EncoderKind) {
    <Ad as Backend>::seed(&Default::default(), 53);
    let readers = readers::<Ad>();
    let mut model = system_reading::<Ad>(&readers, kind);
    let batch = batch(&readers);
    let objective = Objective::new();
    let mut optimizer = AdamWConfig::new().init::<Ad, LatentWire<Ad>>();
    let mut losses = Vec::new();
    for _ in 0..16 {
        let loss = objective.loss(&model, &readers, &batch).unwrap().loss;
        losses.push(loss.clone().into_scalar());
        let grads = loss.backward();
        for reader in &readers {
            assert!(reader.lm().input_embeddings().grad(&grads).is_none());
        }
        assert!(model.encoder.pooler().latent.grad(&grads).is_some());
        let grads = GradientsParams::from_grads(grads, &model);
        model = optimizer.step(1e-2, model, grads);
    }
    let late = losses[12..].iter().cloned().fold(f32::INFINITY, f32::min);
    assert!(late < 0.9 * losses[0], "{kind:?}: {losses:?}");
}

/// The state encoder reads the first model's final hidden states of each text, which padding
/// the shorter texts leaves as they are alone.
#[test]
fn the_state_encoder_reads_each_texts_hidden_states() {
    let readers = readers::<Flex>();
    let batch = batch(&readers);
    let texts = &batch.readers[0].texts;
    assert_ne!(texts[0].len(), texts[1].len());
    let states = readers[0].text_states(texts).unwrap();
    let [_, longest, hidden] = states.dims();
    assert_eq!(hidden, readers[0].model_width());
    for (row, text) in texts.iter().enumerate() {
        let alone = readers[0]
            .lm()
            .forward(TextInput::ids(vec![text.clone()]))
            .unwrap();
        let got = states
            .clone()
            .slice([row..row + 1, 0..text.len(), 0..hidden]);
        let gap = (got - alone.last_hidden_state).abs().max().into_scalar();
        assert!(gap < 1e-5, "row {}: {gap}", row + 1);
    }
    assert!(longest == texts.iter().map(Vec::len).max().unwrap());
    let model = system_reading(&readers, EncoderKind::States);
    let latents = model.latents(&batch, &readers).unwrap();
    assert_eq!(latents.dims(), [2, 3, 16]);
    // The padding is masked, as stq masks it: each text's latents in the batch are its own alone.
    let Encoder::States(encoder) = &model.encoder else {
        unreachable!("a state encoder")
    };
    for (row, text) in texts.iter().enumerate() {
        let states = readers[0].text_states(std::slice::from_ref(text)).unwrap();
        let alone = encoder.forward(states, &[text.len()]);
        let got = latents.clone().narrow(0, row, 1);
        let gap = (got - alone).abs().max().into_scalar();
        assert!(gap < 1e-5, "row {}: {gap}", row + 1);
    }
    let no_readers = model.latents(&batch, &[]).unwrap_err();
    assert!(
        no_readers.to_string().contains("first language model"),
        "{no_readers}"
    );
}
