//! Batches of captioned clips for kiln-train, collated as fVLM's `collate.py` does: clips of
//! varying length (sampled one a second) padded to the batch's longest with their frame lengths,
//! still images replicated to a clip (`replicate_image_frames`), and text-only batches mixed in
//! (`text_interleave.py`: 14% of fVLM's batches keep the language model's chat).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_cache::{Batch, CachedImages, DeviceImages, Order};
use kiln_train::Loader;

use crate::{ClipBatch, Conversation, FoveatedError};

/// Cached clips with their captions' token ids, in batches of a fixed size: frames
/// `[n, T, 3, H, W]` from the feed (resident on the device or prefetched), the same prompt for
/// every clip and the captions padded to the batch's longest (the padding outside the loss;
/// with [`CaptionedClips::answer_only`], the questions too). Clips of varying length are padded
/// to the batch's longest, their frame lengths said.
#[derive(Debug)]
pub struct CaptionedClips<B: Backend> {
    feed: DeviceImages<B>,
    prompt: Vec<u32>,
    captions: Vec<Conversation>,
    pad: u32,
    batch_size: usize,
    replicate_images: usize,
    text_only: Option<TextOnly>,
    answer_only: bool,
}

/// Conversations trained without frames, a share of the batches.
#[derive(Debug)]
struct TextOnly {
    texts: Vec<Conversation>,
    ratio: f64,
}

impl<B: Backend> CaptionedClips<B> {
    /// `captions[i]` (token ids, tokenised once) is the caption of the feed's clip `i`; `pad`
    /// fills shorter captions.
    pub fn new(
        feed: DeviceImages<B>,
        prompt: Vec<u32>,
        captions: Vec<Conversation>,
        pad: u32,
        batch_size: usize,
    ) -> Result<Self, FoveatedError> {
        let clips = feed.images().len();
        if captions.len() != clips {
            return Err(FoveatedError::Data(format!(
                "{} captions for {clips} clips",
                captions.len()
            )));
        }
        if let Some(empty) = captions.iter().position(|c| c.ids.is_empty()) {
            return Err(FoveatedError::Data(format!(
                "clip {}: an empty caption (nothing to learn)",
                empty + 1
            )));
        }
        if batch_size == 0 {
            return Err(FoveatedError::Config(
                "the batch size must be at least 1".into(),
            ));
        }
        Ok(CaptionedClips {
            feed,
            prompt,
            captions,
            pad,
            batch_size,
            replicate_images: 1,
            text_only: None,
            answer_only: false,
        })
    }

    /// Whether the text loss scores each conversation's answer alone (fVLM's stages 2 and 3:
    /// `loss_mask` from [`Conversation::answer_start`]) rather than every token.
    pub fn answer_only(mut self, answer_only: bool) -> Self {
        self.answer_only = answer_only;
        self
    }

    /// A clip of one frame (a still image, or a video shorter than a second sampled one a
    /// second) becomes `frames` copies of it: fVLM's `replicate_image_frames` (8 in its stages
    /// 2 and 3, 1 otherwise). 0 is taken as 1.
    pub fn replicating_images(mut self, frames: usize) -> Self {
        self.replicate_images = frames.max(1);
        self
    }

    /// With text-only batches, `ratio` of all batches (fVLM's `text_ratio`: 0.14): each holds
    /// `batch size` of `texts` (token ids, tokenised once: fVLM's conversations, every token
    /// scored as in its stage 1) and no frame (one padding frame a sample, its visual token
    /// zero, as fVLM's `_wrap_text_batch_as_vision`). They take `round(clip batches · ratio /
    /// (1 − ratio))` places of each epoch, shuffled among the clip batches by the epoch's order
    /// (in sequential order, last); each epoch goes on through the texts in its own order.
    ///
    /// # Errors
    /// A ratio outside `[0, 1)`, no texts, an empty text.
    pub fn with_text_only(
        mut self,
        texts: Vec<Conversation>,
        ratio: f64,
    ) -> Result<Self, FoveatedError> {
        if !(0.0..1.0).contains(&ratio) {
            return Err(FoveatedError::Config(format!(
                "a text-only share of {ratio}: it lies in [0, 1) (fVLM's is 0.14)"
            )));
        }
        if texts.is_empty() {
            return Err(FoveatedError::Data(
                "text-only batches without texts".into(),
            ));
        }
        if let Some(empty) = texts.iter().position(|t| t.ids.is_empty()) {
            return Err(FoveatedError::Data(format!(
                "text {}: empty (nothing to learn)",
                empty + 1
            )));
        }
        self.text_only = Some(TextOnly { texts, ratio });
        Ok(self)
    }

    /// Refuses a caption or text that does not fit the model: longer than `room` tokens
    /// ([`crate::FoveatedModel::target_room`]), naming the clip or text (1-based) and the sizes.
    pub fn check_room(&self, room: usize) -> Result<(), FoveatedError> {
        let over = |all: &[Conversation], what: &'static str| {
            let index = all.iter().position(|text| text.ids.len() > room)?;
            Some((what, index, all[index].ids.len()))
        };
        let texts = self.text_only.as_ref().map_or(&[][..], |t| &t.texts);
        let Some((what, index, length)) =
            over(&self.captions, "clip").or_else(|| over(texts, "text"))
        else {
            return Ok(());
        };
        Err(FoveatedError::Data(format!(
            "{what} {}: a caption of {length} tokens (with its end token, or as a conversation \
             with its prompts); after the prompt and the visual tokens the language model has \
             room for {room} (its max_position_embeddings): shorten the caption, the prompt or \
             --frames",
            index + 1
        )))
    }

    /// Clips in the dataset.
    pub fn len(&self) -> usize {
        self.captions.len()
    }

    /// The cached frames: their count per clip, size and how the cache served them.
    pub fn images(&self) -> &CachedImages {
        self.feed.images()
    }

    /// Whether the dataset is empty.
    pub fn is_empty(&self) -> bool {
        self.captions.is_empty()
    }

    /// Batches of clips in an epoch.
    pub(crate) fn clip_batches(&self) -> usize {
        self.captions.len().div_ceil(self.batch_size)
    }

    /// Text-only batches in an epoch.
    fn text_batches(&self) -> usize {
        self.text_only.as_ref().map_or(0, |text| {
            let clips = self.clip_batches() as f64;
            (clips * text.ratio / (1.0 - text.ratio)).round() as usize
        })
    }

    /// The model's batch of the feed's `batch`: clips of one length as they are, others padded.
    fn clip_batch(&self, batch: Batch<B>) -> ClipBatch<B> {
        let images = self.feed.images();
        let (height, width) = images.size();
        let [height, width] = [height as usize, width as usize];
        let lengths: Vec<usize> = (batch.frames.iter())
            .map(|&frames| match frames {
                1 => self.replicate_images,
                frames => frames,
            })
            .collect();
        let clips = batch.indices.len();
        let longest = lengths.iter().copied().max().unwrap_or(1);
        let padded = images.varies() || lengths != batch.frames;
        let pixels = match padded {
            false => batch.pixels.reshape([clips, longest, 3, height, width]),
            true => {
                let mut first = 0;
                let clips = (batch.frames.iter().zip(&lengths))
                    .map(|(&frames, &length)| {
                        let clip = batch.pixels.clone().narrow(0, first, frames);
                        first += frames;
                        let clip = match length == frames {
                            true => clip,
                            false => clip.repeat_dim(0, length),
                        };
                        match length < longest {
                            true => {
                                let padding = clip.clone().narrow(0, 0, 1).zeros_like();
                                Tensor::cat(vec![clip, padding.repeat_dim(0, longest - length)], 0)
                            }
                            false => clip,
                        }
                    })
                    .collect();
                Tensor::stack(clips, 0)
            }
        };
        let captions: Vec<&Conversation> =
            batch.indices.iter().map(|&i| &self.captions[i]).collect();
        let out = self.with_text(ClipBatch::new(pixels), &captions);
        match padded {
            true => out.with_frame_lengths(lengths),
            false => out,
        }
    }

    /// The epoch's batches of clips in `order` from batch `first` on (no text-only batch), each
    /// with its clips' indices.
    pub(crate) fn indexed_clip_batches(
        &self,
        order: Order,
        first: usize,
    ) -> impl Iterator<Item = (Vec<usize>, ClipBatch<B>)> + '_ {
        (self.feed.batches_from(self.batch_size, order, first)).map(|batch| {
            let indices = batch.indices.clone();
            (indices, self.clip_batch(batch))
        })
    }

    /// Text-only batch `number` of the epoch, its texts from `order` (each epoch's own, going
    /// round).
    fn text_batch(&self, texts: &[Conversation], order: &[usize], number: usize) -> ClipBatch<B> {
        let (height, width) = self.feed.images().size();
        let n = self.batch_size;
        let chosen: Vec<&Conversation> = (0..n)
            .map(|k| &texts[order[(number * n + k) % order.len()]])
            .collect();
        let pixels = Tensor::<B, 5>::zeros(
            [n, 1, 3, height as usize, width as usize],
            self.feed.device(),
        )
        .cast(self.feed.precision().float_dtype());
        let batch = ClipBatch::new(pixels).with_frame_lengths(vec![0; n]);
        self.with_text(batch, &chosen)
    }

    /// `batch` with `texts` after its visual tokens (their answers' loss mask where answers
    /// alone are scored) and the prompt before them.
    pub(crate) fn with_text(&self, batch: ClipBatch<B>, texts: &[&Conversation]) -> ClipBatch<B> {
        let ids = texts.iter().map(|text| text.ids.clone()).collect();
        let batch = batch.with_captions(ids, self.pad);
        let batch = match self.answer_only {
            true => {
                let longest = batch.target.first().map_or(0, Vec::len);
                let masks = (texts.iter())
                    .map(|text| {
                        let mut mask = text.answer_mask();
                        mask.resize(longest, false);
                        mask
                    })
                    .collect();
                batch.with_loss_mask(masks)
            }
            false => batch,
        };
        match self.prompt.is_empty() {
            true => batch,
            false => {
                let clips = batch.clips();
                batch.with_prompt(vec![self.prompt.clone(); clips])
            }
        }
    }
}

impl<B: Backend> Loader for CaptionedClips<B> {
    type Batch = ClipBatch<B>;

    fn batches_per_epoch(&self) -> usize {
        self.clip_batches() + self.text_batches()
    }

    fn sizes(&self) -> Option<(usize, usize)> {
        Some((self.captions.len(), self.batch_size))
    }

    fn batches(&self, order: Order, first: usize) -> Box<dyn Iterator<Item = ClipBatch<B>> + '_> {
        let clip_batches = self.clip_batches();
        let total = clip_batches + self.text_batches();
        // Place s holds a text-only batch where the epoch's permutation sends it past the clips.
        let places = order.indices(total);
        let is_text = move |place: usize| places[place] >= clip_batches;
        let first = first.min(total);
        let texts_before = (0..first).filter(|&place| is_text(place)).count();
        let mut clips = (self.feed)
            .batches_from(self.batch_size, order, first - texts_before)
            .map(|batch| self.clip_batch(batch));
        let text_order = self
            .text_only
            .as_ref()
            .map(|t| order.indices(t.texts.len()));
        let mut texts_done = texts_before;
        Box::new((first..total).map(move |place| {
            match (is_text(place), &self.text_only) {
                (true, Some(text)) => {
                    let order = text_order.as_deref().unwrap_or_default();
                    texts_done += 1;
                    self.text_batch(&text.texts, order, texts_done - 1)
                }
                _ => clips
                    .next()
                    .expect("a clip batch for every place that is not text"),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use kiln_cache::{ClipSpec, ImageCache, Residency, VideoSource};
    use kiln_core::Precision;

    use super::*;

    /// Clips of 3, 1 and 2 frames (frame folders, taken as one a second) and a still image, each
    /// frame 4×4 of one grey level that names its clip and frame; in a temporary folder.
    fn clips(dir: &std::path::Path) -> DeviceImages<Flex> {
        let grey = |clip: u8, t: u8| {
            image::RgbImage::from_pixel(4, 4, image::Rgb([40 * clip + 10 * t; 3]))
        };
        let root = dir.join("clips");
        for (clip, name, frames) in [(0, "a", 3), (1, "b", 1), (3, "d", 2)] {
            std::fs::create_dir_all(root.join(name)).unwrap();
            for t in 0..frames {
                grey(clip, t)
                    .save(root.join(format!("{name}/{t:03}.png")))
                    .unwrap();
            }
        }
        grey(2, 0).save(root.join("c.png")).unwrap();
        let spec = ClipSpec::per_second(4, crate::FrameFit::Squash.preprocess(4));
        let images = ImageCache::new(dir.join("cache"))
            .load_clips(&VideoSource::Folder(root), &spec)
            .unwrap();
        assert_eq!(images.names().collect::<Vec<_>>(), ["a", "b", "c.png", "d"]);
        images.to_device(&Default::default(), Precision::F32, Residency::Host)
    }

    /// Each frame's grey level (its first value, de-normalised from ImageNet's red channel),
    /// per clip; `None` for an all-zero padding frame.
    fn greys(batch: &ClipBatch<Flex>) -> Vec<Vec<Option<u8>>> {
        let [clips, frames, ..] = batch.pixels.dims();
        let values = batch.pixels.clone().into_data().to_vec::<f32>().unwrap();
        let per_frame = values.len() / (clips * frames);
        (0..clips)
            .map(|c| {
                (0..frames)
                    .map(|t| {
                        let frame = &values[(c * frames + t) * per_frame..][..per_frame];
                        let level = (frame[0] * 0.229 + 0.485) * 255.0;
                        frame.iter().any(|&v| v != 0.0).then(|| level.round() as u8)
                    })
                    .collect()
            })
            .collect()
    }

    fn captioned(dir: &std::path::Path) -> CaptionedClips<Flex> {
        let captions = (1..=4)
            .map(|c| Conversation::whole(vec![c; c as usize]))
            .collect();
        CaptionedClips::new(clips(dir), Vec::new(), captions, 0, 2).unwrap()
    }

    /// fVLM's `collate_foveated`: clips padded with zero frames to the batch's longest, their
    /// lengths said; a one-frame clip replicated (`replicate_image_frames`).
    #[test]
    fn clips_of_different_lengths_are_padded_and_still_images_replicated() {
        let dir = tempfile::tempdir().unwrap();
        let clips = captioned(dir.path()).replicating_images(2);
        let batches: Vec<_> = clips.batches(Order::Sequential, 0).collect();
        assert_eq!(batches.len(), 2);
        let (first, second) = (&batches[0], &batches[1]);
        assert_eq!(first.frame_lengths, [3, 2]);
        assert_eq!(
            greys(first),
            [
                vec![Some(0), Some(10), Some(20)],
                vec![Some(40), Some(40), None]
            ]
        );
        assert_eq!(second.frame_lengths, [2, 2]);
        assert_eq!(
            greys(second),
            [[Some(80), Some(80)], [Some(120), Some(130)]]
        );
        assert_eq!(first.target, [vec![1, 0], vec![2, 2]]);
        assert_eq!(first.target_lengths, [1, 2]);
    }

    /// fVLM's `InterleavedDataLoader`: a share of the batches hold text alone (one padding frame
    /// a sample); their places follow the epoch's order, and a resumed epoch gives the rest of
    /// the same batches.
    #[test]
    fn text_only_batches_take_their_share_and_resume_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let texts = [vec![7], vec![8, 8], vec![9]].map(Conversation::whole);
        let clips = (captioned(dir.path()).with_text_only(texts.to_vec(), 0.5)).unwrap();
        assert_eq!(clips.batches_per_epoch(), 4);
        let summary = |batch: &ClipBatch<Flex>| (batch.frame_lengths.clone(), batch.target.clone());
        let order = Order::Shuffled { seed: 5, epoch: 1 };
        let epoch: Vec<_> = clips.batches(order, 0).collect();
        let text: Vec<_> = epoch.iter().filter(|b| b.frame_lengths == [0, 0]).collect();
        assert_eq!(text.len(), 2);
        for batch in &text {
            assert_eq!(batch.pixels.dims(), [2, 1, 3, 4, 4]);
            assert_eq!(greys(batch), [[None], [None]]);
        }
        // Four text samples drawn from three: every text once, then round again.
        let mut drawn: Vec<Vec<u32>> = (text.iter())
            .flat_map(|b| b.target.iter().zip(&b.target_lengths))
            .map(|(ids, &length)| ids[..length].to_vec())
            .collect();
        assert_eq!(drawn.len(), 4);
        drawn.sort();
        drawn.dedup();
        assert_eq!(drawn, [vec![7], vec![8, 8], vec![9]]);
        for first in 0..4 {
            let rest: Vec<_> = clips.batches(order, first).map(|b| summary(&b)).collect();
            let expected: Vec<_> = epoch[first..].iter().map(summary).collect();
            assert_eq!(rest, expected, "from batch {first}");
        }
        // In order, the text comes last.
        let last = clips.batches(Order::Sequential, 2).map(|b| b.frame_lengths);
        assert_eq!(last.collect::<Vec<_>>(), [[0, 0], [0, 0]]);
        let refused = captioned(dir.path()).with_text_only(vec![Conversation::whole(vec![1])], 1.0);
        assert!(refused.unwrap_err().to_string().contains("[0, 1)"));
    }

    /// fVLM's stages 2 and 3 score the answer alone: each conversation's loss mask starts at
    /// its answer, the padding outside it; text-only batches too.
    #[test]
    fn answer_only_batches_mask_the_question() {
        let dir = tempfile::tempdir().unwrap();
        let asked = |ids: Vec<u32>, answer_start| Conversation {
            ids,
            answer_start,
            cut: 0,
        };
        let captions = vec![
            asked(vec![1, 2, 3], 2),
            asked(vec![4, 5], 1),
            asked(vec![6], 0),
            asked(vec![7, 8, 9, 10], 3),
        ];
        let clips = CaptionedClips::new(clips(dir.path()), Vec::new(), captions, 0, 2)
            .unwrap()
            .answer_only(true)
            .with_text_only(vec![asked(vec![11, 12], 1)], 0.5)
            .unwrap();
        let batches: Vec<_> = clips.batches(Order::Sequential, 0).collect();
        assert_eq!(batches[0].target, [vec![1, 2, 3], vec![4, 5, 0]]);
        assert_eq!(
            batches[0].loss_mask,
            [vec![false, false, true], vec![false, true, false]]
        );
        assert_eq!(batches[2].loss_mask, [vec![false, true], vec![false, true]]);
        let all = captioned(dir.path());
        let first = all.batches(Order::Sequential, 0).next().unwrap();
        assert!(first.loss_mask.is_empty());
    }
}
