//! Continues a prompt with a language model (Llama, Qwen2, Gemma 3) from a Hugging Face directory
//! or a llama.cpp GGUF file (Llama and Qwen2), streaming the text, then prints the prefill and
//! decode speeds; or writes the prompt's logits.
//!
//! ```text
//! cargo run --release --example generate -- --model-dir SmolLM2-135M-Instruct --prompt "Once" \
//!     [--max-new-tokens 64] [--temperature 0.7] [--top-p 0.9] [--seed 0] [--chat] \
//!     [--device cpu] [--policy full] [--weights as-stored|bf16|f32] [--logits logits.safetensors]
//! cargo run --release --example generate -- --model SmolLM2-135M-Instruct.Q4_1.gguf --chat \
//!     --prompt "What is the capital of France?"
//! ```
//!
//! A GGUF file holds the weights, the configuration, the tokenizer and the chat template in one.
//! `--weights as-stored` (the default for GGUF files on the CPU) keeps its quantized matrices in
//! their blocks and multiplies them as stored, with the activations quantized per block to 8
//! bits as llama.cpp does (its F16 and BF16 matrices kept in their 16 bits); `--weights bf16`
//! rounds the projections' and embeddings' matrices to bf16 (a GGUF file's or a Hugging Face
//! directory's: half the bytes f32 reads a token, on the CPU); `--weights f32` decodes every
//! tensor to the policy's dtype as it is loaded (the default for a Hugging Face directory, and
//! on other devices). The run says which it chose.
//!
//! The prompt is tokenised as it is (transformers' `tokenizer(prompt)`); `--chat` wraps it as a
//! user turn in the checkpoint's chat template first. Temperature 0 (the default) decodes
//! greedily. Generation stops at the checkpoint's `eos_token_id` (and `<|im_end|>` with
//! `--chat`) or after `--max-new-tokens`. `--logits FILE` writes, instead of generating, a
//! safetensors file with `input_ids` (i64 [tokens]) and `logits` (f32 [tokens, vocab]) of the
//! prompt, and exits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, TensorData};
use clap::Parser;
use kiln::burn;
use kiln::core::gguf::GgufFile;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec};
use kiln::text::{
    CausalLm, GenerationConfig, Message, TextInput, TextTokenizer, Weights, generate,
};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;
#[path = "shared/sampling.rs"]
mod sampling;

use sampling::SamplingFlags;

/// Continue a prompt with a language model.
#[derive(Parser)]
struct Args {
    /// A Hugging Face model directory: config.json, model.safetensors (or its index),
    /// tokenizer.json and, for --chat, tokenizer_config.json's chat template.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    model_dir: Option<PathBuf>,
    /// A GGUF file (llama.cpp's format): weights, configuration, tokenizer and chat template.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// The most tokens to add.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// Wrap the prompt as a user turn in the chat template.
    #[arg(long)]
    chat: bool,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// Write the prompt's `input_ids` and `logits` to this safetensors file and exit.
    #[arg(long)]
    logits: Option<PathBuf>,
    /// How the weights are held: as-stored (a GGUF file's quantized matrices multiplied in
    /// their blocks, on the CPU), bf16 (the matrices rounded to bf16, on the CPU) or f32
    /// (decoded to the policy's dtype). Default: as-stored for a GGUF file on the CPU, f32
    /// otherwise.
    #[arg(long)]
    weights: Option<Weights>,
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let text = |e: kiln::text::TextError| e.to_string();
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let (model, tokenizer) = match (&self.model, &self.model_dir) {
            (Some(file), _) => {
                let on_host = kiln::core::is_host_backend::<B>(device);
                let weights = self.weights.unwrap_or(match on_host {
                    true => Weights::AsStored,
                    false => Weights::F32,
                });
                let gguf = GgufFile::open(file).map_err(|e| e.to_string())?;
                let tokenizer = TextTokenizer::from_gguf(&gguf).map_err(text)?;
                let model =
                    CausalLm::<B>::from_gguf_file(gguf, device, &policy, weights).map_err(text)?;
                say_weights(&model, weights);
                (model, tokenizer)
            }
            (None, Some(dir)) => {
                let tokenizer = TextTokenizer::from_hf_dir(dir).map_err(text)?;
                let weights = self.weights.unwrap_or(Weights::F32);
                let model =
                    CausalLm::<B>::from_hf_dir_with(dir, device, &policy, weights).map_err(text)?;
                say_weights(&model, weights);
                (model, tokenizer)
            }
            (None, None) => unreachable!("clap requires --model or --model-dir"),
        };
        let prompt = if self.chat {
            let turn = [Message::new("user", &self.prompt)];
            tokenizer.apply_chat_template(&turn, true).map_err(text)?
        } else {
            self.prompt.clone()
        };
        let ids = tokenizer.encode(&prompt).map_err(text)?;
        if ids.is_empty() {
            return Err("the prompt is empty: give --prompt some text".into());
        }
        if let Some(path) = &self.logits {
            return write_logits(&model, &ids, path);
        }
        let mut stop_tokens = model.config().eos_token_ids.clone();
        if self.chat {
            stop_tokens.extend(tokenizer.token_id("<|im_end|>"));
        }
        let config = GenerationConfig {
            max_new_tokens: self.max_new_tokens,
            sampling: self.sampling.sampling(),
            stop_tokens,
            pad_token: 0,
            min_new_tokens: 0,
        };
        print!("{prompt}");
        let mut generated = Vec::new();
        let mut printed = String::new();
        let start = Instant::now();
        let mut first_token = None;
        let mut failure = None;
        let mut print_new = |text: &str| {
            if let Some(new) = text.strip_prefix(printed.as_str()) {
                print!("{new}");
                let _ = std::io::stdout().flush();
                printed = text.to_string();
            }
        };
        generate(&model, std::slice::from_ref(&ids), &config, |step| {
            first_token.get_or_insert_with(|| start.elapsed());
            generated.extend(step[0]);
            // Decoding the whole continuation keeps characters whose bytes span tokens whole:
            // a trailing partial character (decoded as U+FFFD) waits for its next bytes.
            match tokenizer.decode(&generated, true) {
                Ok(text) => print_new(text.trim_end_matches('\u{FFFD}')),
                Err(e) => failure = Some(e.to_string()),
            }
        })
        .map_err(text)?;
        print_new(&tokenizer.decode(&generated, true).map_err(text)?);
        println!();
        if let Some(failure) = failure {
            return Err(failure);
        }
        let total = start.elapsed();
        let prefill = first_token.unwrap_or(total);
        let decoded = generated.len().saturating_sub(1);
        eprintln!(
            "prefill: {} tokens in {:.3} s, {:.1} tokens/s; decode: {decoded} tokens in {:.3} s, \
             {:.1} tokens/s ({} on {})",
            ids.len(),
            prefill.as_secs_f64(),
            ids.len() as f64 / prefill.as_secs_f64(),
            (total - prefill).as_secs_f64(),
            decoded as f64 / (total - prefill).as_secs_f64().max(1e-9),
            policy,
            self.device,
        );
        Ok(())
    }
}

/// Says how the weights are held.
fn say_weights<B: Backend>(model: &CausalLm<B>, weights: Weights) {
    let stored = model.stored_weights();
    let types: Vec<String> = (stored.types().iter())
        .map(|(name, count)| format!("{count} {name}"))
        .collect();
    let kept = format!(
        "{} matrices: {}, {:.1} MB",
        stored.len(),
        types.join(", "),
        stored.stored_bytes() as f64 / 1e6
    );
    match weights {
        Weights::AsStored => {
            eprintln!("weights: as-stored ({kept}; multiplied as stored, other tensors f32)")
        }
        Weights::Bf16 => eprintln!(
            "weights: bf16 ({kept}; widened to f32 as they are multiplied, other tensors f32)"
        ),
        Weights::F32 => eprintln!("weights: f32 (every tensor decoded as it was loaded)"),
    }
}

/// Writes the prompt's ids and logits.
fn write_logits<B: Backend>(model: &CausalLm<B>, ids: &[u32], path: &Path) -> Result<(), String> {
    let out = model
        .forward(TextInput::ids(vec![ids.to_vec()]))
        .map_err(|e| e.to_string())?;
    let [_, tokens, vocab] = out.logits.dims();
    let logits: TensorData = out
        .logits
        .cast(FloatDType::F32)
        .reshape([tokens, vocab])
        .into_data();
    let values = logits
        .as_slice::<f32>()
        .map_err(|e| format!("the model's logits cannot be read: {e}"))?;
    let bad = values.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        let first = values.iter().position(|v| !v.is_finite()).unwrap_or(0) / vocab.max(1);
        return Err(format!(
            "{bad} of the prompt's {} logits are NaN or infinite, from token {} on: the \
             model's weights hold non-finite values, or its arithmetic overflowed (in 16-bit \
             precision, try f32); {} was not written",
            values.len(),
            first + 1,
            path.display()
        ));
    }
    let input_ids: Vec<u8> = ids
        .iter()
        .flat_map(|&id| i64::from(id).to_le_bytes())
        .collect();
    let view = |dtype, shape: Vec<usize>, bytes| {
        safetensors::tensor::TensorView::new(dtype, shape, bytes).map_err(|e| e.to_string())
    };
    let views = vec![
        (
            "input_ids".to_string(),
            view(safetensors::Dtype::I64, vec![tokens], &input_ids)?,
        ),
        (
            "logits".to_string(),
            view(
                safetensors::Dtype::F32,
                vec![tokens, vocab],
                logits.as_bytes(),
            )?,
        ),
    ];
    let bytes = safetensors::serialize(views, None).map_err(|e| e.to_string())?;
    kiln::io::write_atomic(path, &bytes).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {} ({tokens} tokens, vocabulary {vocab})",
        path.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    kiln::log_to_stderr();
    let args = Args::parse();
    let device = args.device;
    let mut files = kiln::io::RunFiles::new();
    if let Some(file) = &args.model {
        files = files.input_file(
            "--model (a GGUF file; a Hugging Face model directory goes to --model-dir)",
            file,
        );
    }
    if let Some(dir) = &args.model_dir {
        files = files.input_dir(
            "--model-dir (a Hugging Face model directory; a GGUF file goes to --model)",
            dir,
        );
    }
    if let Some(path) = &args.logits {
        files = files.output("--logits", path);
    }
    let result = files
        .check()
        .map_err(|e| e.to_string())
        .and_then(|()| device.run(args).map_err(|e| e.to_string()))
        .and_then(|r| r);
    kiln::exit_status(result)
}
