//! fVLM's three training stages at their released budget (`configs/stage{1,2,3}_135M.yaml` as
//! its `train.py` runs them): the data each reads, how its text is tokenised and scored, its
//! batches and its length.

use crate::ReleaseRecipe;

/// One of fVLM's training stages.
///
/// ```
/// use kiln_foveated::ReleaseStage;
/// let stage: ReleaseStage = "2".parse().unwrap();
/// assert_eq!(stage.steps(), 31_250); // 1M samples, 8 × 4 a step
/// assert!(stage.answer_only());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReleaseStage {
    /// Visual alignment: captions, every token of the conversation scored.
    #[default]
    Alignment,
    /// Instruction tuning: the answer scored, still images replicated to 8 frames.
    Instruction,
    /// DPO on preference pairs against the frozen stage-2 model.
    Preference,
}

impl ReleaseStage {
    /// 1, 2 or 3.
    pub fn number(self) -> u8 {
        match self {
            ReleaseStage::Alignment => 1,
            ReleaseStage::Instruction => 2,
            ReleaseStage::Preference => 3,
        }
    }

    /// The stage's rates and schedule for fVLM-135M.
    pub fn recipe_135m(self) -> ReleaseRecipe {
        match self {
            ReleaseStage::Alignment => ReleaseRecipe::stage1_135m(),
            ReleaseStage::Instruction => ReleaseRecipe::stage2_135m(),
            ReleaseStage::Preference => ReleaseRecipe::stage3_135m(),
        }
    }

    /// The samples the stage trains on (`total_samples`): 1M, 1M, and RLAIF-V's 83k pairs once.
    pub fn samples(self) -> u64 {
        match self {
            ReleaseStage::Preference => 83_000,
            _ => 1_000_000,
        }
    }

    /// Samples a micro-batch (`batch_size`): 8, and 4 pairs in stage 3.
    pub fn micro_batch(self) -> usize {
        match self {
            ReleaseStage::Preference => 4,
            _ => 8,
        }
    }

    /// Micro-batches an optimizer step (`grad_accum`): an effective batch of 32 in every stage.
    pub fn accumulation(self) -> usize {
        32 / self.micro_batch()
    }

    /// Optimizer steps: `total_samples // effective batch`, as `train.py` counts them.
    pub fn steps(self) -> u64 {
        self.samples() / (self.micro_batch() * self.accumulation()) as u64
    }

    /// The most tokens a clip's conversation keeps (`tokenization.py` truncates the rest): 512 in
    /// stage 1's `tokenize_stage1`, 1 024 in `tokenize_sft`.
    pub fn caption_tokens(self) -> usize {
        match self {
            ReleaseStage::Alignment => 512,
            _ => 1024,
        }
    }

    /// The most tokens a text-only conversation keeps (`tokenize_sft` in every stage).
    pub fn text_tokens(self) -> usize {
        1024
    }

    /// Whether only the answer is scored (`text_ce_answer_only`, and DPO's answer masks).
    pub fn answer_only(self) -> bool {
        self != ReleaseStage::Alignment
    }

    /// Frames a still image becomes (`replicate_image_frames`).
    pub fn replicate_images(self) -> usize {
        match self {
            ReleaseStage::Alignment => 1,
            _ => 8,
        }
    }
}

impl std::fmt::Display for ReleaseStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stage {}", self.number())
    }
}

impl std::str::FromStr for ReleaseStage {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "1" => Ok(ReleaseStage::Alignment),
            "2" => Ok(ReleaseStage::Instruction),
            "3" => Ok(ReleaseStage::Preference),
            other => Err(format!(
                "`{other}`: 1 (alignment), 2 (instruction tuning) or 3 (DPO)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budgets of fVLM's 135M configs: 31 250 steps of 8 × 4 in stages 1 and 2, 2 593 of
    /// 4 × 8 in stage 3.
    #[test]
    fn budgets_are_fvlms() {
        let stages = [1, 2, 3].map(|n| n.to_string().parse::<ReleaseStage>().unwrap());
        let budgets = stages.map(|s| (s.micro_batch(), s.accumulation(), s.steps()));
        assert_eq!(budgets, [(8, 4, 31_250), (8, 4, 31_250), (4, 8, 2_593)]);
        assert_eq!(stages.map(ReleaseStage::number), [1, 2, 3]);
        assert!("4".parse::<ReleaseStage>().unwrap_err().contains("DPO"));
    }
}
