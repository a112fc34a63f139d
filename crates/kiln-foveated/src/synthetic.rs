//! "Cue then read": seeded synthetic clips on which only a model that chooses where to look can
//! answer (issue 25's proof task).
//!
//! A frame is a `grid × grid` board of cells. Frame 1 lights one cell (the cue; random per
//! clip). Frames 2..T fill every cell with a glyph of one of `classes` classes, each class in
//! equally many cells, shuffled afresh for every frame; the target of frame t ≥ 2 is the class of
//! the glyph in the cued cell. Balanced boards keep a frame's glyph counts from hinting at the
//! target: a model that summarises the frame instead of looking at the cued cell stays at chance.
//! (When `classes` does not divide the cell count, the cells left over get distinct random
//! classes, and the classes with an extra cell are slightly likelier targets in that frame.)
//! A query fixed in advance reads each frame alone and cannot know which cell matters; a query
//! made from what the model saw in frame 1 can. Each clip's caption is one token, the cued
//! cell's index: its loss teaches the LM where the cue is (without it, a first-frame token read
//! by a fixed query carries the cue's position at a few per cent of its norm, and no query made
//! from it points anywhere within any budget tried: docs/FOVEATED.md); the release variant,
//! which scores text from text, reads it after a lead token ([`CueCaption`]). [`SyntheticClips`]
//! serves the clips to kiln-train.

use std::ops::Range;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use kiln_cache::{
    IMAGENET_MEAN, IMAGENET_STD, Normalize, Order, Prefetch, PreparedPixels, Preprocess,
};
use kiln_core::Precision;
use kiln_text::TextConfig;
use kiln_train::{Loader, OptimizerConfig, Schedule, TrainConfig};
use kiln_vision::Dinov2Config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{ClipBatch, FoveatedConfig, FoveatedError, FoveatedModel, FrameHead};

/// The task's shape and seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CueThenRead {
    /// Cells per side of the board.
    pub grid: usize,
    /// Pixels per side of a cell (a glyph fills it but for a one-pixel margin).
    pub cell: usize,
    /// Frames per clip, the cue frame included.
    pub frames: usize,
    /// Glyph classes.
    pub classes: usize,
    /// Seeds every clip (with its index) and the glyphs' shapes.
    pub seed: u64,
    /// What each clip's text says ([`CueCaption::Cue`] unless [`CueThenRead::with_caption`]).
    pub caption: CueCaption,
    glyphs: Vec<Vec<bool>>,
}

/// Each clip's text: what, of the cue, the LM is asked to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CueCaption {
    /// One token, the cued cell's index. The research variant scores it (from the last visual
    /// token); the release variant scores text from text only, so for it this says nothing.
    Cue,
    /// A lead token (0), then the cued cell's index + 1: fVLM's text opens with its chat
    /// template, which the lead token stands for, so the release variant scores the cue from
    /// the text before it, as it scores a caption.
    LedCue,
    /// The lead token alone: nothing about the cue to say, only the per-frame answers.
    Lead,
}

impl CueCaption {
    /// The text of a clip whose cue is `cue`.
    fn tokens(self, cue: usize) -> Vec<u32> {
        match self {
            CueCaption::Cue => vec![cue as u32],
            CueCaption::LedCue => vec![0, cue as u32 + 1],
            CueCaption::Lead => vec![0],
        }
    }
}

/// One clip of the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticClip {
    /// 8-bit RGB frames `[frames, 3, H, W]`, `H = W = grid · cell`.
    pub pixels: Vec<u8>,
    /// The cued cell (row-major).
    pub cue: usize,
    /// Per frame, the glyph class in each cell (empty for the cue frame).
    pub glyphs: Vec<Vec<usize>>,
    /// Per frame, the class the model should give: the glyph in the cued cell; −1 (no target)
    /// for the cue frame.
    pub targets: Vec<i64>,
}

/// A batch of clips made on the host, pixels ready for the device.
struct HostClips {
    pixels: PreparedPixels,
    shape: [usize; 5],
    captions: Vec<Vec<u32>>,
    frame_targets: Vec<Vec<i64>>,
}

impl HostClips {
    /// The batch on `device`.
    fn upload<B: Backend>(self, device: &B::Device) -> ClipBatch<B> {
        let pixels = self.pixels.upload::<B>(device, Precision::F32);
        ClipBatch::new(pixels.reshape(self.shape))
            .with_target(self.captions)
            .with_frame_targets(self.frame_targets)
    }
}

impl CueThenRead {
    /// The task with `classes` glyph shapes drawn from `seed` (each a random pattern at least a
    /// quarter of its pixels away from every other).
    ///
    /// # Errors
    /// Shapes that leave no room: fewer than 2 cells, cells under 4 pixels, fewer than 2 frames
    /// or 2 classes.
    pub fn new(
        grid: usize,
        cell: usize,
        frames: usize,
        classes: usize,
        seed: u64,
    ) -> Result<Self, FoveatedError> {
        if grid * grid < 2 || cell < 4 || frames < 2 || classes < 2 {
            return Err(FoveatedError::Config(format!(
                "cue-then-read needs at least 2 cells, 4-pixel cells, 2 frames and 2 classes \
                 (got a {grid}×{grid} grid of {cell}-pixel cells, {frames} frames, {classes} \
                 classes)"
            )));
        }
        let side = cell - 2;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6c79_7068_7321);
        let mut glyphs: Vec<Vec<bool>> = Vec::with_capacity(classes);
        let apart = side * side / 4;
        for attempt in 0.. {
            if glyphs.len() == classes {
                break;
            }
            if attempt > 10_000 {
                return Err(FoveatedError::Config(format!(
                    "{classes} glyph classes do not fit {side}×{side}-pixel glyphs: use larger \
                     cells"
                )));
            }
            let glyph: Vec<bool> = (0..side * side).map(|_| rng.random_bool(0.5)).collect();
            let distance =
                |other: &Vec<bool>| glyph.iter().zip(other).filter(|(a, b)| a != b).count();
            if glyphs.iter().all(|other| distance(other) >= apart) {
                glyphs.push(glyph);
            }
        }
        Ok(CueThenRead {
            grid,
            cell,
            frames,
            classes,
            seed,
            caption: CueCaption::Cue,
            glyphs,
        })
    }

    /// The same task with `caption` as each clip's text.
    pub fn with_caption(self, caption: CueCaption) -> Self {
        CueThenRead { caption, ..self }
    }

    /// Height and width of a frame.
    pub fn image_size(&self) -> usize {
        self.grid * self.cell
    }

    /// The shape of class `class`'s glyph, `(cell − 2)²` pixels row-major.
    pub fn glyph(&self, class: usize) -> &[bool] {
        &self.glyphs[class]
    }

    /// Clip `index` (the same for the same seed and index, on every machine).
    pub fn clip(&self, index: u64) -> SyntheticClip {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        let cells = self.grid * self.grid;
        let size = self.image_size();
        let frame_len = 3 * size * size;
        let mut pixels = vec![0u8; self.frames * frame_len];
        let cue = rng.random_range(0..cells);
        self.fill_cell(&mut pixels[..frame_len], cue, |_, _| Some([255, 64, 64]));
        let mut glyphs = vec![Vec::new()];
        let mut targets = vec![-1];
        for t in 1..self.frames {
            // A shuffled balanced board: every class in ⌊cells / K⌋ cells, the remaining cells
            // distinct classes drawn at random.
            let whole = cells - cells % self.classes;
            let mut extra: Vec<usize> = (0..self.classes).collect();
            for i in 0..cells % self.classes {
                extra.swap(i, rng.random_range(i..self.classes));
            }
            let mut classes: Vec<usize> = (0..whole).map(|i| i % self.classes).collect();
            classes.extend(&extra[..cells - whole]);
            for i in (1..cells).rev() {
                classes.swap(i, rng.random_range(0..=i));
            }
            let frame = &mut pixels[t * frame_len..(t + 1) * frame_len];
            for (cell, &class) in classes.iter().enumerate() {
                let glyph = &self.glyphs[class];
                let side = self.cell - 2;
                self.fill_cell(frame, cell, |y, x| {
                    let inside = (1..=side).contains(&y) && (1..=side).contains(&x);
                    (inside && glyph[(y - 1) * side + (x - 1)]).then_some([255, 255, 255])
                });
            }
            targets.push(classes[cue] as i64);
            glyphs.push(classes);
        }
        SyntheticClip {
            pixels,
            cue,
            glyphs,
            targets,
        }
    }

    /// Clips `indices` as a batch on `device`: frames normalised there with ImageNet's mean and
    /// std (as DINOv2's processor does), per-frame targets, and the caption ([`CueCaption`]: the
    /// LM's vocabulary needs `grid²` tokens at least, one more with a lead token).
    pub fn batch<B: Backend>(&self, indices: Range<u64>, device: &B::Device) -> ClipBatch<B> {
        self.prepare::<B>(indices, device).upload(device)
    }

    /// The host's part of [`CueThenRead::batch`] (a background thread's, in [`SyntheticClips`]):
    /// the clips drawn and their pixels made ready for `device`.
    fn prepare<B: Backend>(&self, indices: Range<u64>, device: &B::Device) -> HostClips {
        let clips: Vec<SyntheticClip> = indices.map(|index| self.clip(index)).collect();
        let size = self.image_size();
        let pixels: Vec<u8> = clips
            .iter()
            .flat_map(|clip| clip.pixels.iter().copied())
            .collect();
        let preprocess = Preprocess {
            resize: None,
            center_crop: None,
            normalize: Some(Normalize {
                mean: IMAGENET_MEAN,
                std: IMAGENET_STD,
            }),
            ..Preprocess::clip(size as u32)
        };
        let shape = [clips.len() * self.frames, 3, size, size];
        HostClips {
            pixels: PreparedPixels::new::<B>(&preprocess, pixels, shape, device),
            shape: [clips.len(), self.frames, 3, size, size],
            captions: clips
                .iter()
                .map(|clip| self.caption.tokens(clip.cue))
                .collect(),
            frame_targets: clips.into_iter().map(|clip| clip.targets).collect(),
        }
    }

    /// Paints the pixels of `cell` in a `[3, H, W]` frame that `colour(y, x)` (cell coordinates)
    /// gives a colour.
    fn fill_cell(
        &self,
        frame: &mut [u8],
        cell: usize,
        colour: impl Fn(usize, usize) -> Option<[u8; 3]>,
    ) {
        let size = self.image_size();
        let (top, left) = (
            (cell / self.grid) * self.cell,
            (cell % self.grid) * self.cell,
        );
        for y in 0..self.cell {
            for x in 0..self.cell {
                if let Some(rgb) = colour(y, x) {
                    for (channel, value) in rgb.into_iter().enumerate() {
                        frame[(channel * size + top + y) * size + left + x] = value;
                    }
                }
            }
        }
    }
}

/// Clips of a [`CueThenRead`] task in batches, for kiln-train: `clips` clips from index `first`
/// per epoch, each batch's clips drawn and normalised on a background thread up to two batches
/// ahead (the caller only uploads them). In shuffled order every epoch takes new clips (epoch
/// `e` starts at `first + e · clips`: an endless stream, never the same clip twice); in
/// sequential order (evaluation) the same ones.
#[derive(Debug, Clone)]
pub struct SyntheticClips<B: Backend> {
    task: CueThenRead,
    first: u64,
    clips: usize,
    batch: usize,
    device: B::Device,
}

impl<B: Backend> SyntheticClips<B> {
    /// `clips` clips from index `first` in batches of `batch` (at least 1; a last partial batch
    /// is dropped).
    pub fn new(
        task: CueThenRead,
        first: u64,
        clips: usize,
        batch: usize,
        device: B::Device,
    ) -> Self {
        SyntheticClips {
            task,
            first,
            clips,
            batch: batch.max(1),
            device,
        }
    }
}

impl<B: Backend> Loader for SyntheticClips<B> {
    type Batch = ClipBatch<B>;

    fn batches_per_epoch(&self) -> usize {
        self.clips / self.batch
    }

    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = ClipBatch<B>> + '_> {
        let start = match order {
            Order::Sequential => self.first,
            Order::Shuffled { epoch, .. } => self.first + epoch * self.clips as u64,
        };
        let order = Arc::new((0..self.batches_per_epoch()).collect());
        let (task, device, batch) = (self.task.clone(), self.device.clone(), self.batch as u64);
        let prepared = Prefetch::start(order, 1, first, 1, 2, move |chunk: &[usize]| {
            let from = start + chunk[0] as u64 * batch;
            task.prepare::<B>(from..from + batch, &device)
        });
        Box::new(prepared.map(|clips| clips.upload(&self.device)))
    }
}

impl CueThenRead {
    /// A small DINOv2 and LM from scratch for this task (DINOv2's position table has a row for
    /// each cell of its boards; other boards read it resized): the visual token is narrow
    /// (`token_width`, 8 in the example, 2 heads), so one static token cannot carry every cell's
    /// glyph (16 wide, it learned to carry part of the board: docs/FOVEATED.md). The position
    /// table starts at std 1, not transformers' 0.02: a trained tower's positions are plain to
    /// see, and a from-scratch one's at 0.02 are not, so no query could point at a cell
    /// (docs/FOVEATED.md). The LM's vocabulary is at least `vocab` and the board's cells (the
    /// captions name the cued cell). The connectors are `config`'s (its variant, readout and
    /// λ) with 16-wide queries and a per-frame head over the task's classes. Weights come from
    /// the backend's generator.
    ///
    /// Under [`Variant::Release`](crate::Variant::Release) the caption is never scored (fVLM
    /// predicts text from text, and a one-token caption has nothing after it): the model is
    /// not told where the cue is.
    pub fn model<B: Backend>(
        &self,
        token_width: usize,
        vocab: usize,
        config: FoveatedConfig,
        device: &B::Device,
    ) -> Result<FoveatedModel<B>, FoveatedError> {
        let dino = Dinov2Config {
            hidden_size: token_width,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            mlp_ratio: 4,
            image_size: self.image_size(),
            patch_size: self.cell,
            initializer_range: 1.0,
            ..Dinov2Config::default()
        }
        .init(device);
        let lm = TextConfig {
            vocab_size: vocab
                .max(self.grid * self.grid + usize::from(self.caption != CueCaption::Cue)),
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 1024,
            ..TextConfig::smollm2_135m()
        }
        .init(device);
        let config = FoveatedConfig {
            query_dim: 16,
            frame_head: FrameHead::Classes(self.classes),
            ..config
        };
        FoveatedModel::new(dino, lm, config, device)
    }
}

/// A curriculum for the task: `start_steps` optimizer steps on `start_grid × start_grid` boards,
/// then `steps` on the task's own. From scratch no readout learns to point on 4×4 boards; on 2×2
/// ones it does within a few hundred steps, and keeps pointing as the board grows
/// (docs/FOVEATED.md).
///
/// ```
/// use kiln_foveated::synthetic::{CueThenRead, Curriculum};
/// let task = CueThenRead::new(4, 6, 4, 24, 0)?;
/// let curriculum = Curriculum { start_grid: 2, start_steps: 750, steps: 4000 };
/// let stages = curriculum.stages(&task)?;
/// assert_eq!((stages[0].task.grid, stages[0].steps, stages[0].starting), (2, 750, true));
/// assert_eq!((stages[1].task.grid, stages[1].steps, stages[1].starting), (4, 4000, false));
/// // The same 4 750 steps, 1 000 of them on the small boards.
/// assert_eq!(curriculum.split_at(1000).stages(&task)?[1].steps, 3750);
/// # Ok::<(), kiln_foveated::FoveatedError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Curriculum {
    /// Cells per side of the starting boards.
    pub start_grid: usize,
    /// Optimizer steps on the starting boards (0: start on the task's).
    pub start_steps: u64,
    /// Optimizer steps on the task's boards.
    pub steps: u64,
}

/// One stage of a [`Curriculum`]: `steps` steps on the boards of `task`.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The task of this stage (its boards' size).
    pub task: CueThenRead,
    /// Its optimizer steps.
    pub steps: u64,
    /// Whether these are the starting boards (else the task's own).
    pub starting: bool,
}

impl Curriculum {
    /// The stages for `task`: the starting boards (unless there are no steps for them or they
    /// are the task's own), then the task's boards. The starting task is `task` on smaller
    /// boards (the same cells, frames, classes and seed).
    ///
    /// # Errors
    /// Starting boards larger than the task's.
    pub fn stages(&self, task: &CueThenRead) -> Result<Vec<Stage>, FoveatedError> {
        if self.start_grid > task.grid {
            return Err(FoveatedError::Config(format!(
                "the curriculum starts on {0}×{0} boards, larger than the task's {1}×{1}: it \
                 starts on smaller boards",
                self.start_grid, task.grid
            )));
        }
        let mut stages = Vec::with_capacity(2);
        if self.start_steps > 0 && self.start_grid != task.grid {
            stages.push(Stage {
                task: CueThenRead::new(
                    self.start_grid,
                    task.cell,
                    task.frames,
                    task.classes,
                    task.seed,
                )?
                .with_caption(task.caption),
                steps: self.start_steps,
                starting: true,
            });
        }
        stages.push(Stage {
            task: task.clone(),
            steps: self.steps,
            starting: false,
        });
        Ok(stages)
    }

    /// The same steps in all with `start` of them (at most half) on the starting boards — for a
    /// model that learns its lookup on the final boards late. A curriculum without starting
    /// steps stays as it is.
    pub fn split_at(&self, start: u64) -> Curriculum {
        if self.start_steps == 0 {
            return *self;
        }
        let total = self.start_steps + self.steps;
        let start_steps = start.min(total / 2);
        Curriculum {
            start_steps,
            steps: total - start_steps,
            ..*self
        }
    }
}

/// The synthetic task's training recipe: AdamW at peak `lr` (weight decay 0.01), warm-up over
/// the first 5% of `steps`, cosine to `end` × `lr`, clipping at 1.0.
pub fn recipe(steps: u64, lr: f64, end: f64) -> TrainConfig {
    let mut config = TrainConfig::new(steps, lr);
    config.optimizer = OptimizerConfig::adamw(lr).with_weight_decay(0.01);
    config.schedule = Schedule::warmup_cosine(steps / 20, 0.0, end, steps);
    config.max_grad_norm = Some(1.0);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> CueThenRead {
        CueThenRead::new(3, 6, 4, 4, 11).unwrap()
    }

    /// The class whose glyph the pixels of `cell` in frame `t` show, read back from the pixels
    /// (`None` when they match no glyph).
    fn read_cell(task: &CueThenRead, clip: &SyntheticClip, t: usize, cell: usize) -> Option<usize> {
        let size = task.image_size();
        let frame = &clip.pixels[t * 3 * size * size..];
        let (top, left) = (
            (cell / task.grid) * task.cell,
            (cell % task.grid) * task.cell,
        );
        let side = task.cell - 2;
        let shown: Vec<bool> = (0..side * side)
            .map(|i| frame[(top + 1 + i / side) * size + left + 1 + i % side] == 255)
            .collect();
        (0..task.classes).find(|&k| task.glyph(k) == shown.as_slice())
    }

    #[test]
    fn clips_are_reproducible_and_differ() {
        let task = task();
        assert_eq!(task.clip(5), task.clip(5));
        assert_eq!(
            CueThenRead::new(3, 6, 4, 4, 11).unwrap().clip(5),
            task.clip(5)
        );
        assert_ne!(task.clip(5).pixels, task.clip(6).pixels);
        assert_ne!(
            CueThenRead::new(3, 6, 4, 4, 12).unwrap().clip(5),
            task.clip(5)
        );
    }

    /// The pixels say what the clip's fields say: one lit cell in frame 1 (the cue), a readable
    /// glyph in every cell after it, and each target the glyph in the cued cell.
    #[test]
    fn pixels_show_the_cue_and_the_targets() {
        let task = task();
        let size = task.image_size();
        for index in 0..50 {
            let clip = task.clip(index);
            let lit: Vec<usize> = (0..task.grid * task.grid)
                .filter(|&cell| {
                    let (y, x) = (
                        (cell / task.grid) * task.cell,
                        (cell % task.grid) * task.cell,
                    );
                    clip.pixels[y * size + x] == 255
                })
                .collect();
            assert_eq!(lit, [clip.cue]);
            assert_eq!(clip.targets[0], -1);
            for t in 1..task.frames {
                for cell in 0..task.grid * task.grid {
                    assert_eq!(read_cell(&task, &clip, t, cell), Some(clip.glyphs[t][cell]));
                }
                assert_eq!(
                    clip.targets[t],
                    read_cell(&task, &clip, t, clip.cue).unwrap() as i64
                );
            }
        }
    }

    /// A batch carries each clip's frames in order, its targets and its caption (the cue).
    #[test]
    fn batches_hold_the_clips_targets_and_captions() {
        let task = task();
        let device = Default::default();
        let batch = task.batch::<burn::backend::Flex>(7..10, &device);
        let size = task.image_size();
        assert_eq!(batch.pixels.dims(), [3, task.frames, 3, size, size]);
        for (row, index) in (7..10).enumerate() {
            let clip = task.clip(index);
            assert_eq!(batch.target[row], [clip.cue as u32]);
            assert_eq!(batch.frame_targets[row], clip.targets);
        }
        assert!(batch.prompt.is_empty());
        // The release variant's texts: a lead token, then the cue shifted past it (or nothing).
        for (caption, text) in [
            (CueCaption::LedCue, vec![0, task.clip(7).cue as u32 + 1]),
            (CueCaption::Lead, vec![0]),
        ] {
            let batch = task
                .clone()
                .with_caption(caption)
                .batch::<burn::backend::Flex>(7..8, &device);
            assert_eq!(batch.target[0], text);
        }
    }

    /// The loader (its clips drawn on a background thread) serves the batches `batch` makes:
    /// in evaluation the same clips every pass, in training new ones every epoch, from any batch
    /// on (a resumed run), the last partial batch dropped.
    #[test]
    fn the_loader_serves_each_epochs_clips_in_order() {
        type B = burn::backend::Flex;
        let task = task();
        let device = Default::default();
        let clips = SyntheticClips::<B>::new(task.clone(), 100, 7, 3, device);
        assert_eq!(clips.batches_per_epoch(), 2);
        let served = |order, first| -> Vec<Vec<i64>> {
            clips
                .batches(order, first)
                .flat_map(|batch| batch.frame_targets)
                .collect()
        };
        let made = |indices: Range<u64>| -> Vec<Vec<i64>> {
            task.batch::<B>(indices, &device).frame_targets
        };
        assert_eq!(served(Order::Sequential, 0), made(100..106));
        assert_eq!(served(Order::Sequential, 1), made(103..106));
        let epoch = |epoch| Order::Shuffled { seed: 5, epoch };
        assert_eq!(served(epoch(2), 0), made(114..120));
        assert_eq!(served(epoch(2), 1), made(117..120));
        assert!(served(epoch(2), 2).is_empty());
        let pixels = |batch: ClipBatch<B>| batch.pixels.into_data().to_vec::<f32>().unwrap();
        let first = clips.batches(epoch(3), 0).next().unwrap();
        assert_eq!(pixels(first), pixels(task.batch::<B>(121..124, &device)));
    }

    /// Cues and targets are uniform (counts within 4.5 standard deviations of their expectation
    /// over 4 000 clips), so chance is 1/classes, and every board holds each class equally
    /// often, so nothing but the cue predicts a target.
    #[test]
    fn cues_and_targets_are_balanced() {
        let task = task();
        let clips = 4_000;
        let mut cues = vec![0usize; 9];
        let mut classes = vec![0usize; task.classes];
        for index in 0..clips {
            let clip = task.clip(index);
            cues[clip.cue] += 1;
            classes[clip.targets[1] as usize] += 1;
            for board in &clip.glyphs[1..] {
                let mut counts = vec![0; task.classes];
                board.iter().for_each(|&k| counts[k] += 1);
                assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            }
        }
        let within = |counts: &[usize]| {
            let p = 1.0 / counts.len() as f64;
            let (mean, sd) = (clips as f64 * p, (clips as f64 * p * (1.0 - p)).sqrt());
            counts.iter().all(|&c| (c as f64 - mean).abs() < 4.5 * sd)
        };
        assert!(within(&cues), "{cues:?}");
        assert!(within(&classes), "{classes:?}");
    }

    #[test]
    fn impossible_shapes_are_refused() {
        assert!(CueThenRead::new(1, 6, 4, 4, 0).is_err());
        assert!(CueThenRead::new(3, 3, 4, 4, 0).is_err());
        let crowded = CueThenRead::new(3, 4, 4, 64, 0).unwrap_err().to_string();
        assert!(crowded.contains("larger cells"), "{crowded}");
    }
}
