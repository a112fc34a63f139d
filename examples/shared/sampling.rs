//! The sampling flags of the examples that generate text: `--temperature`, `--top-p`, `--seed`.

use kiln::text::Sampling;

/// How each new token is chosen.
#[derive(clap::Args)]
pub struct SamplingFlags {
    /// Sampling temperature; 0 decodes greedily.
    #[arg(long, default_value_t = 0.0, value_parser = kiln::cli::non_negative, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Nucleus sampling's probability mass (with a temperature above 0).
    #[arg(long, default_value_t = 1.0, value_parser = kiln::cli::probability, allow_negative_numbers = true)]
    pub top_p: f64,
    /// Seeds sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingFlags {
    /// Greedy decoding at temperature 0, else nucleus sampling.
    pub fn sampling(&self) -> Sampling {
        if self.temperature > 0.0 {
            Sampling::Sample {
                temperature: self.temperature,
                top_p: self.top_p,
                seed: self.seed,
            }
        } else {
            Sampling::Greedy
        }
    }
}
