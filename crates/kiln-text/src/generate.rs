//! Batched generation: prompts left-padded into one batch, one prefill, then one token per step
//! through the key/value cache, chosen greedily or sampled (temperature, top-p), until every
//! sequence meets a stop token or the length limit.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::KvCache;
use crate::TextError;
use crate::input::TextInput;
use crate::llama::CausalLm;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id among equals).
    Greedy,
    /// A draw from `softmax(logits / temperature)`, restricted to the smallest set of most
    /// likely tokens whose probabilities reach `top_p` (nucleus sampling; 1 keeps every token).
    Sample {
        /// Divides the logits: below 1 sharpens, above 1 flattens.
        temperature: f64,
        /// The nucleus's probability mass, in (0, 1].
        top_p: f64,
        /// Seeds the draws: the same seed gives the same continuation.
        seed: u64,
    },
}

/// What [`generate`] does.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// The most tokens added to each prompt.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Tokens that end a sequence (kept in its output).
    pub stop_tokens: Vec<u32>,
    /// The id that pads prompts on the left and finished sequences.
    pub pad_token: u32,
    /// The fewest tokens added before a stop token may be chosen (transformers'
    /// `min_new_tokens`): until then the stop tokens' logits are taken as −∞.
    pub min_new_tokens: usize,
}

impl GenerationConfig {
    /// Greedy decoding of at most `max_new_tokens`, no stop token, padding with id 0.
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenerationConfig {
            max_new_tokens,
            sampling: Sampling::Greedy,
            stop_tokens: Vec::new(),
            pad_token: 0,
            min_new_tokens: 0,
        }
    }

    /// Refuses a temperature that is not positive or a `top_p` outside (0, 1].
    fn validate(&self) -> Result<(), TextError> {
        if let Sampling::Sample {
            temperature, top_p, ..
        } = self.sampling
            && !(temperature > 0.0 && temperature.is_finite() && top_p > 0.0 && top_p <= 1.0)
        {
            return Err(TextError::Input(format!(
                "temperature {temperature} and top_p {top_p}: the temperature must be positive \
                 and top_p in (0, 1] (use greedy decoding for temperature 0)"
            )));
        }
        Ok(())
    }
}

/// The continuations of `prompts` (ids, any lengths), generated together; `on_step` sees each
/// step's new token of every sequence (`None` for a sequence already finished) as it is chosen,
/// for streaming. Returns each prompt's new tokens, stop token included.
pub fn generate<B: Backend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    on_step: impl FnMut(&[Option<u32>]),
) -> Result<Vec<Vec<u32>>, TextError> {
    if let Some(row) = prompts.iter().position(Vec::is_empty) {
        return Err(TextError::Input(format!("prompt {} is empty", row + 1)));
    }
    let prompt = TextInput::left_padded(prompts, config.pad_token)?;
    generate_from(model, prompt, config, on_step)
}

/// [`generate`] from a prompt given as a forward's input: ids or embeddings (a soft prompt), with
/// its padding mask; every row's last token must be real (pad on the left).
pub fn generate_from<B: Backend>(
    model: &CausalLm<B>,
    prompt: TextInput<B>,
    config: &GenerationConfig,
    on_step: impl FnMut(&[Option<u32>]),
) -> Result<Vec<Vec<u32>>, TextError> {
    generate_after(model, KvCache::new(), prompt, config, on_step)
}

/// [`generate_from`] after what `cache` holds (a [`KvCache::after`] a prefix every prompt
/// shares, such as a chat template's system turn, computed once by [`CausalLm::prefix`]).
pub fn generate_after<B: Backend>(
    model: &CausalLm<B>,
    mut cache: KvCache<B>,
    prompt: TextInput<B>,
    config: &GenerationConfig,
    mut on_step: impl FnMut(&[Option<u32>]),
) -> Result<Vec<Vec<u32>>, TextError> {
    config.validate()?;
    let (rows, tokens) = prompt.tokens.dims();
    if rows == 0 {
        return Ok(Vec::new());
    }
    if tokens == 0 {
        return Err(TextError::Input("the prompts are empty".into()));
    }
    let mut rng = match config.sampling {
        Sampling::Sample { seed, .. } => Some(ChaCha8Rng::seed_from_u64(seed)),
        Sampling::Greedy => None,
    };
    let mut input = prompt.with_last_logits_only();
    let mut outputs = vec![Vec::new(); rows];
    let mut finished = vec![false; rows];
    for step in 0..config.max_new_tokens {
        let logits = last_logits(model.forward_cached(input, &mut cache)?.logits);
        for (row, values) in logits.iter().enumerate() {
            let bad = values.iter().filter(|v| !v.is_finite()).count();
            if bad > 0 && !finished[row] {
                return Err(TextError::NonFinite(format!(
                    "new token {} of prompt {}: {bad} of the model's {} logits are NaN or \
                     infinite, so no token can be chosen: its weights hold non-finite values, \
                     or its arithmetic overflowed (in 16-bit precision, try f32)",
                    step + 1,
                    row + 1,
                    values.len()
                )));
            }
        }
        let mut logits = logits;
        if step < config.min_new_tokens {
            for values in &mut logits {
                for &stop in &config.stop_tokens {
                    if let Some(value) = values.get_mut(stop as usize) {
                        *value = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let chosen: Vec<Option<u32>> = logits
            .iter()
            .zip(&finished)
            .map(|(logits, &done)| (!done).then(|| choose(logits, config.sampling, rng.as_mut())))
            .collect();
        on_step(&chosen);
        for (row, token) in chosen.iter().enumerate() {
            if let Some(token) = *token {
                outputs[row].push(token);
                finished[row] = config.stop_tokens.contains(&token);
            }
        }
        if finished.iter().all(|&done| done) {
            break;
        }
        let ids = chosen
            .iter()
            .map(|t| vec![t.unwrap_or(config.pad_token)])
            .collect();
        let mask = chosen.iter().map(|t| vec![t.is_some()]).collect();
        input = TextInput::ids(ids)
            .with_attention_mask(mask)
            .with_last_logits_only();
    }
    Ok(outputs)
}

/// Each sequence's last-token logits, on the host in f32.
fn last_logits<B: Backend>(logits: Tensor<B, 3>) -> Vec<Vec<f32>> {
    let [batch, tokens, vocab] = logits.dims();
    let values: Vec<f32> = logits
        .slice([0..batch, tokens - 1..tokens, 0..vocab])
        .cast(FloatDType::F32)
        .into_data()
        .to_vec()
        .expect("logits are f32 after the cast");
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// The next token from one sequence's logits.
fn choose(logits: &[f32], sampling: Sampling, rng: Option<&mut ChaCha8Rng>) -> u32 {
    let Sampling::Sample {
        temperature, top_p, ..
    } = sampling
    else {
        return argmax(logits);
    };
    let rng = rng.expect("sampling has a generator");
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let best = f64::from(logits[order[0] as usize]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&t| ((f64::from(logits[t as usize]) - best) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    // The nucleus: the most likely tokens until their mass reaches top_p (at least one).
    let mut mass = 0.0;
    let kept = weights
        .iter()
        .take_while(|&&w| {
            let inside = mass < top_p * total;
            mass += w;
            inside
        })
        .count()
        .max(1);
    let kept_total: f64 = weights[..kept].iter().sum();
    let mut draw = rng.random::<f64>() * kept_total;
    for (token, weight) in order.iter().zip(&weights[..kept]) {
        if draw < *weight {
            return *token;
        }
        draw -= weight;
    }
    order[kept - 1]
}

/// The index of the largest value, the first among equals.
fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampled frequencies follow softmax(logits / T) within the nucleus, and tokens outside it
    /// never come.
    #[test]
    fn sampling_follows_the_tempered_nucleus() {
        let logits = [2.0f32, 1.0, 0.0, -3.0];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let sampling = |top_p| Sampling::Sample {
            temperature: 0.5,
            top_p,
            seed: 0,
        };
        let draws = 40_000;
        let mut counts = [0usize; 4];
        for _ in 0..draws {
            counts[choose(&logits, sampling(1.0), Some(&mut rng)) as usize] += 1;
        }
        let weights: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / 0.5).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (count, weight) in counts.iter().zip(&weights) {
            let p = weight / total;
            let sd = (p * (1.0 - p) / draws as f64).sqrt();
            let seen = *count as f64 / draws as f64;
            assert!((seen - p).abs() < 5.0 * sd + 1e-4, "{seen} vs {p}");
        }
        // Token 0 holds e⁴/(e⁴ + e² + 1 + e⁻⁶) ≈ 0.867 of the mass: top_p 0.8 keeps it alone.
        assert!((0..1000).all(|_| choose(&logits, sampling(0.8), Some(&mut rng)) == 0));
        // top_p 0.95 keeps tokens 0 and 1, never 2 or 3.
        let mut seen = [false; 4];
        for _ in 0..2000 {
            seen[choose(&logits, sampling(0.95), Some(&mut rng)) as usize] = true;
        }
        assert_eq!(seen, [true, true, false, false]);
    }

    #[test]
    fn greedy_takes_the_first_best() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    }
}
