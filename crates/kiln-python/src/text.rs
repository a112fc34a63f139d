//! Text generation from Python: `LanguageModel(model_dir, device, policy)` with `generate`
//! (texts in, continuations out) and `generate_ids` (token ids), what `kiln.text.generate` calls.

use std::path::PathBuf;
use std::sync::Mutex;

use burn::tensor::backend::Backend;
use kiln_core::{DeviceJob, PolicySpec};
use kiln_text::{
    CausalLm, GenerationConfig, Message, Sampling, TextError, TextTokenizer, generate,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A loaded language model on its device, whichever backend that is.
trait Generate: Send {
    fn generate(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
    ) -> Result<Vec<Vec<u32>>, TextError>;
    fn eos_token_ids(&self) -> Vec<u32>;
}

struct OnDevice<B: Backend> {
    model: CausalLm<B>,
}

impl<B: Backend> Generate for OnDevice<B> {
    fn generate(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
    ) -> Result<Vec<Vec<u32>>, TextError> {
        generate(&self.model, prompts, config, |_| {})
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.model.config().eos_token_ids.clone()
    }
}

/// Loads a checkpoint directory on the job's backend under a policy.
struct Load {
    dir: PathBuf,
    policy: PolicySpec,
}

impl DeviceJob for Load {
    type Output = PyResult<Box<dyn Generate>>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = crate::resolve::<B>(&self.policy, device)?;
        let model =
            CausalLm::<B>::from_hf_dir(&self.dir, device, &policy).map_err(|e| error(&e))?;
        Ok(Box::new(OnDevice { model }))
    }
}

/// A Llama or Qwen2 checkpoint directory (config.json, weights, tokenizer.json) on one device.
#[pyclass(module = "kiln._kiln", frozen)]
pub struct LanguageModel {
    model: Mutex<Box<dyn Generate>>,
    tokenizer: TextTokenizer,
}

#[pymethods]
impl LanguageModel {
    /// Loads `model_dir` on `device` under the precision `policy`.
    #[new]
    #[pyo3(signature = (model_dir, device = "cpu", policy = "full"))]
    fn new(py: Python<'_>, model_dir: PathBuf, device: &str, policy: &str) -> PyResult<Self> {
        let tokenizer = TextTokenizer::from_hf_dir(&model_dir).map_err(|e| error(&e))?;
        let job = Load {
            dir: model_dir,
            policy: crate::policy(policy)?,
        };
        let model = crate::released(py, || crate::on_device(device, job))???;
        Ok(LanguageModel {
            model: Mutex::new(model),
            tokenizer,
        })
    }

    /// The token ids of `text`, as transformers' `tokenizer(text)` gives them.
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.tokenizer.encode(text).map_err(|e| error(&e))
    }

    /// The text of `ids`; an id outside the vocabulary is a `ValueError` naming it (the
    /// tokenizer would drop it silently).
    #[pyo3(signature = (ids, skip_special_tokens = true))]
    fn decode(&self, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        let size = self.tokenizer.vocab_size();
        if let Some(at) = ids.iter().position(|&id| id as usize >= size) {
            return Err(PyValueError::new_err(format!(
                "ids[{at}] = {}: not a token id (the vocabulary has ids 0 to {})",
                ids[at],
                size.saturating_sub(1)
            )));
        }
        self.tokenizer
            .decode(&ids, skip_special_tokens)
            .map_err(|e| error(&e))
    }

    /// The continuation of each prompt (texts; with `chat`, each wrapped as a user turn in the
    /// checkpoint's chat template), greedy at temperature 0, else sampled with nucleus `top_p`
    /// from `seed`; each stops at the checkpoint's end-of-sequence token or after
    /// `max_new_tokens`.
    #[pyo3(signature = (prompts, max_new_tokens = 64, temperature = 0.0, top_p = 1.0, seed = 0, chat = false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, each with its default.
    fn generate(
        &self,
        py: Python<'_>,
        prompts: Vec<String>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: u64,
        chat: bool,
    ) -> PyResult<Vec<String>> {
        let ids = prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let text = if chat {
                    let turn = [Message::new("user", prompt)];
                    self.tokenizer
                        .apply_chat_template(&turn, true)
                        .map_err(|e| error(&e))?
                } else {
                    prompt.clone()
                };
                let ids = self.encode(&text)?;
                if ids.is_empty() {
                    return Err(PyValueError::new_err(format!("prompt {} is empty", i + 1)));
                }
                Ok(ids)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut stop_tokens = self.eos_token_ids()?;
        if chat {
            stop_tokens.extend(self.tokenizer.token_id("<|im_end|>"));
        }
        let config = generation(max_new_tokens, temperature, top_p, seed, stop_tokens)?;
        let generated = self.run(py, &ids, &config)?;
        generated
            .iter()
            .map(|ids| self.decode(ids.clone(), true))
            .collect()
    }

    /// [`generate`](Self::generate) on token ids: each prompt's new ids, the stop token
    /// included; `stop_tokens` defaults to the checkpoint's end-of-sequence ids.
    #[pyo3(signature = (prompts, max_new_tokens = 64, temperature = 0.0, top_p = 1.0, seed = 0, stop_tokens = None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, each with its default.
    fn generate_ids(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<u32>>,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        seed: u64,
        stop_tokens: Option<Vec<u32>>,
    ) -> PyResult<Vec<Vec<u32>>> {
        let stop_tokens = match stop_tokens {
            Some(ids) => ids,
            None => self.eos_token_ids()?,
        };
        let config = generation(max_new_tokens, temperature, top_p, seed, stop_tokens)?;
        self.run(py, &prompts, &config)
    }
}

impl LanguageModel {
    fn eos_token_ids(&self) -> PyResult<Vec<u32>> {
        let model = self.model.lock().map_err(|_| crate::poisoned())?;
        Ok(model.eos_token_ids())
    }

    /// Generates with the interpreter's lock released.
    fn run(
        &self,
        py: Python<'_>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
    ) -> PyResult<Vec<Vec<u32>>> {
        crate::released(py, || {
            let model = self.model.lock().map_err(|_| crate::poisoned())?;
            model.generate(prompts, config).map_err(|e| error(&e))
        })?
    }
}

/// What to generate: greedy at temperature 0, else sampled.
fn generation(
    max_new_tokens: usize,
    temperature: f64,
    top_p: f64,
    seed: u64,
    stop_tokens: Vec<u32>,
) -> PyResult<GenerationConfig> {
    if temperature < 0.0 || !temperature.is_finite() {
        return Err(PyValueError::new_err(format!(
            "temperature {temperature}: give 0 (greedy) or a positive number"
        )));
    }
    let sampling = if temperature > 0.0 {
        Sampling::Sample {
            temperature,
            top_p,
            seed,
        }
    } else {
        Sampling::Greedy
    };
    Ok(GenerationConfig {
        max_new_tokens,
        sampling,
        stop_tokens,
        pad_token: 0,
        min_new_tokens: 0,
    })
}

/// A text error as the Python exception it is.
fn error(error: &TextError) -> PyErr {
    match error {
        TextError::Checkpoint(e) => crate::checkpoint_error(e),
        TextError::NonFinite(_) => PyRuntimeError::new_err(error.to_string()),
        _ => PyValueError::new_err(error.to_string()),
    }
}
