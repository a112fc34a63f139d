//! kiln-text's speed on the SmolLM2-135M shape under kiln-bench: prefill and decode tokens/s at
//! batch 1 and 8. PyTorch's figures for the same work come from `scripts/bench/text_torch.py`;
//! both are in docs/PERFORMANCE.md.
//!
//! ```text
//! cargo bench --bench text                          # Flex, f32
//! cargo bench --bench text -- --filter decode --save main
//! KILN_BENCH_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf cargo bench --bench text -- --filter cold
//! ```
//!
//! The model is randomly initialised (speed does not depend on the weights). `prefill`: one
//! forward of a 512-token prompt per sequence into a new key/value cache, the last token's logits
//! only (as generation's prefill, and transformers' with its default `use_cache`). `decode`: 32
//! steps of one token per sequence through the key/value cache after a 128-token prompt (the
//! prompt is not timed). `cold_start` (with `KILN_BENCH_GGUF` naming a GGUF file): from a fresh
//! process's start to its first generated token — the file opened, its tokenizer and model read,
//! a one-word prompt encoded and one token generated — this program run again per sample with
//! `--first-token FILE` (what a user of the `generate` example waits for).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use kiln::bench::{BenchError, Benchmark, Runner, Suite, Work, cli};
use kiln::burn::backend::Flex;
use kiln::burn::tensor::Tensor;
use kiln::burn::tensor::backend::Backend;
use kiln::core::Policy;
use kiln::core::gguf::GgufFile;
use kiln::text::{
    CausalLm, GenerationConfig, KvCache, TextConfig, TextInput, TextTokenizer, Weights, generate,
};

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "../examples/shared/allocator.rs"]
mod allocator;

const PROMPT: usize = 512;
const DECODE_PROMPT: usize = 128;
const DECODE_STEPS: usize = 32;

/// Token ids of `batch` sequences of `tokens`, different for each variant.
fn ids(batch: usize, tokens: usize, variant: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..batch)
        .map(|b| {
            (0..tokens)
                .map(|t| ((t * 7919 + b * 104_729 + variant * 15_485_863) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// One forward of a `PROMPT`-token prompt per sequence.
struct Prefill<B: Backend> {
    model: CausalLm<B>,
    batch: usize,
}

impl<B: Backend> Benchmark<B> for Prefill<B> {
    type Input = Vec<Vec<u32>>;
    type Output = Tensor<B, 3>;

    fn name(&self) -> String {
        format!("smollm2_135m/prefill,{PROMPT}tok,b={}", self.batch)
    }

    fn work(&self) -> Work {
        Work::items((self.batch * PROMPT) as u64)
    }

    fn prepare(&self, _device: &B::Device, variant: usize) -> Self::Input {
        ids(self.batch, PROMPT, variant, self.model.config().vocab_size)
    }

    fn run(&self, ids: &Self::Input) -> Self::Output {
        let input = TextInput::ids(ids.clone()).with_last_logits_only();
        let mut cache = KvCache::new();
        let output = self.model.forward_cached(input, &mut cache);
        output.expect("valid ids").logits
    }
}

/// `DECODE_STEPS` one-token steps per sequence after a prefilled prompt.
struct Decode<B: Backend> {
    model: CausalLm<B>,
    batch: usize,
}

impl<B: Backend> Benchmark<B> for Decode<B> {
    type Input = (KvCache<B>, Vec<Vec<Vec<u32>>>);
    type Output = Tensor<B, 3>;

    fn name(&self) -> String {
        format!("smollm2_135m/decode,{DECODE_STEPS}steps,b={}", self.batch)
    }

    fn work(&self) -> Work {
        Work::items((self.batch * DECODE_STEPS) as u64)
    }

    fn prepare(&self, _device: &B::Device, variant: usize) -> Self::Input {
        let vocab = self.model.config().vocab_size;
        let mut cache = KvCache::new();
        let prompt = TextInput::ids(ids(self.batch, DECODE_PROMPT, variant, vocab));
        self.model
            .forward_cached(prompt.with_last_logits_only(), &mut cache)
            .expect("valid ids");
        let steps = ids(self.batch, DECODE_STEPS, variant + 1, vocab);
        let steps = (0..DECODE_STEPS)
            .map(|s| steps.iter().map(|row| vec![row[s]]).collect())
            .collect();
        (cache, steps)
    }

    fn run(&self, (cache, steps): &Self::Input) -> Self::Output {
        let mut cache = cache.clone();
        let mut logits = None;
        for step in steps {
            let input = TextInput::ids(step.clone()).with_last_logits_only();
            logits = Some(
                self.model
                    .forward_cached(input, &mut cache)
                    .expect("valid ids")
                    .logits,
            );
        }
        logits.expect("at least one step")
    }
}

/// A fresh process from its start to its first generated token from a GGUF file.
struct ColdStart {
    file: PathBuf,
}

impl<B: Backend> Benchmark<B> for ColdStart {
    type Input = ();
    type Output = ();

    fn name(&self) -> String {
        "smollm2_135m/cold_start,gguf".into()
    }

    fn work(&self) -> Work {
        Work::items(1)
    }

    fn prepare(&self, _device: &B::Device, _variant: usize) {}

    fn run(&self, _: &()) {
        let this = std::env::current_exe().expect("the benchmark's own path");
        let status = Command::new(this)
            .arg(FIRST_TOKEN)
            .arg(&self.file)
            .status()
            .expect("the benchmark runs itself");
        assert!(status.success(), "the first-token process failed");
    }
}

/// The flag that makes this program the process [`ColdStart`] times.
const FIRST_TOKEN: &str = "--first-token";

/// One token generated on the CPU from the GGUF file `path`, as `generate --model` does.
fn first_token(path: &Path) -> Result<(), String> {
    let file = GgufFile::open(path).map_err(|e| e.to_string())?;
    let tokenizer = TextTokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    let model = CausalLm::<Flex>::from_gguf_file(
        file,
        &Default::default(),
        &Policy::full(),
        Weights::AsStored,
    )
    .map_err(|e| e.to_string())?;
    let prompt = tokenizer.encode("Hi").map_err(|e| e.to_string())?;
    generate(&model, &[prompt], &GenerationConfig::greedy(1), |_| {}).map_err(|e| e.to_string())?;
    Ok(())
}

struct Text;

impl Suite for Text {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let (device, policy) = (runner.device(), runner.policy());
        let model = TextConfig::smollm2_135m()
            .init::<B>(device)
            .with_policy(&policy);
        for batch in [1, 8] {
            runner.bench(&Prefill {
                model: model.clone(),
                batch,
            })?;
            runner.bench(&Decode {
                model: model.clone(),
                batch,
            })?;
        }
        if let Some(file) = std::env::var_os("KILN_BENCH_GGUF") {
            runner.bench(&ColdStart { file: file.into() })?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    // kiln's warnings (a library that falls back, say) on stderr; `KILN_LOG=info` for more.
    kiln::log_to_stderr();
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, file] = &args[..]
        && flag == FIRST_TOKEN
    {
        return kiln::exit_status(first_token(Path::new(file)));
    }
    cli::main(Text)
}
