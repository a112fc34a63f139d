//! Clips with captions, for training on real data: a captions file matched to a kiln-cache clip
//! feed (decoded once, normalised on the device), the text tokenised once, batches for
//! kiln-train.
//!
//! [`CaptionedClipReader`] does it all for a folder of clips and its captions file; the pieces
//! ([`read_captions`], [`match_captions`], [`CaptionTokenizer`], [`CaptionedClips::new`]) serve
//! other sources.
//!
//! A captions file is JSON Lines, one clip per line, named as the clip cache names it (a frame
//! folder's or a video file's name below the clips folder):
//!
//! ```text
//! {"video": "dog_runs.gif", "caption": "A dog runs across a field."}
//! {"video": "kettle", "caption": "Steam rises from a kettle."}
//! ```

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_cache::{ClipSpec, ImageCache, Preprocess, Residency, Resize, VideoSource};
use kiln_core::Precision;
use kiln_text::{Message, TextTokenizer};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::{CaptionedClips, FoveatedError};

/// One line of a captions file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caption {
    /// The clip, as the clip cache names it.
    pub video: String,
    /// What the model should say about it.
    pub caption: String,
}

/// One line of a file of text-only conversations: fVLM's text samples (`user` / `assistant`,
/// as its shards' JSON names them), trained without frames to keep the LM's chat.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextSample {
    /// What the user asks.
    pub user: String,
    /// The answer.
    pub assistant: String,
}

/// The lines of the JSON Lines file `path` as `T`, with their 1-based numbers (blank lines
/// skipped), refusing a line that is not a `what`, which `form` shows.
pub(crate) fn read_lines<T: DeserializeOwned>(
    path: &Path,
    what: &str,
    form: &str,
) -> Result<Vec<(usize, T)>, FoveatedError> {
    let text = kiln_io::read_text(path).map_err(|e| FoveatedError::Data(e.to_string()))?;
    (text.lines().enumerate())
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let number = index + 1;
            let value = serde_json::from_str(line).map_err(|e| {
                FoveatedError::Data(format!(
                    "{}, line {number}: not {what} ({e}); each line is {form}",
                    path.display()
                ))
            })?;
            Ok((number, value))
        })
        .collect()
}

/// The text-only conversations of a JSON Lines file, `{"user": TEXT, "assistant": TEXT}` a line
/// (blank lines skipped), refusing a line that is not one by its 1-based number.
pub fn read_text_samples(path: impl AsRef<Path>) -> Result<Vec<TextSample>, FoveatedError> {
    let form = "{\"user\": TEXT, \"assistant\": TEXT}";
    let lines = read_lines(path.as_ref(), "a conversation", form)?;
    Ok(lines.into_iter().map(|(_, sample)| sample).collect())
}

/// The captions of a JSON Lines file (blank lines skipped), refusing a line that is not a
/// caption or names a video an earlier line named, by its 1-based number.
pub fn read_captions(path: impl AsRef<Path>) -> Result<Vec<Caption>, FoveatedError> {
    let path = path.as_ref();
    let form = "{\"video\": NAME, \"caption\": TEXT}";
    let mut seen = HashMap::new();
    let mut captions = Vec::new();
    for (number, caption) in read_lines::<Caption>(path, "a caption", form)? {
        if let Some(first) = seen.insert(caption.video.clone(), number) {
            return Err(FoveatedError::Data(format!(
                "{}, line {number}: a second caption for '{}' (the first is on line {first})",
                path.display(),
                caption.video
            )));
        }
        captions.push(caption);
    }
    Ok(captions)
}

/// The caption of each clip in `names` (the clip cache's order), from `captions` (read from
/// `file`): every clip needs one, and every caption needs its clip.
pub fn match_captions<'a>(
    names: impl IntoIterator<Item = &'a str>,
    captions: &[Caption],
    file: &Path,
) -> Result<Vec<String>, FoveatedError> {
    let mut by_video: HashMap<&str, &str> = captions
        .iter()
        .map(|c| (c.video.as_str(), c.caption.as_str()))
        .collect();
    let matched = names
        .into_iter()
        .map(|name| {
            by_video.remove(name).map(str::to_string).ok_or_else(|| {
                FoveatedError::Data(format!(
                    "{}: no caption for the clip '{name}'",
                    file.display()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(orphan) = captions
        .iter()
        .find(|c| by_video.contains_key(c.video.as_str()))
    {
        return Err(FoveatedError::Data(format!(
            "{}: a caption for '{}', which is not among the clips (or was skipped as bad)",
            file.display(),
            orphan.video
        )));
    }
    Ok(matched)
}

/// fVLM's system prompt (`tokenization.py`'s `SYSTEM_PROMPT`).
pub const FVLM_SYSTEM_PROMPT: &str = "You are a helpful AI assistant.";

/// fVLM's user prompt for captions (`tokenize_stage1`'s default; OpenVid's source prompt).
pub const FVLM_CAPTION_PROMPT: &str = "Write a brief caption for this video.";

/// A conversation as fVLM tokenises it (`tokenization.py`): `[system, user, assistant]` rendered
/// by the LM's chat template and tokenised with no special tokens added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// The token ids.
    pub ids: Vec<u32>,
    /// Where the assistant's answer starts: the length of `[system, user]` rendered with the
    /// assistant's turn opened.
    pub answer_start: usize,
}

impl Conversation {
    /// Stage 2's loss mask (`tokenize_sft`): the answer's tokens. Stage 1 scores them all.
    pub fn answer_mask(&self) -> Vec<bool> {
        (0..self.ids.len())
            .map(|at| at >= self.answer_start)
            .collect()
    }
}

/// A language model's tokenizer as captions need it. For the research variant: the prompt's
/// ids, and every caption closed by the end-of-sequence token (so the model learns where a
/// caption ends). For the release variant: each caption as fVLM's stage-1 conversation (system
/// prompt, user prompt, the caption as the answer), no prompt before the visual tokens.
pub struct CaptionTokenizer {
    tokenizer: TextTokenizer,
    prompt: Vec<u32>,
    end: u32,
    /// The user prompt of the release variant's conversations.
    chat: Option<String>,
}

impl CaptionTokenizer {
    /// The tokenizer of the Hugging Face LM directory `lm`, with `prompt` (the text before every
    /// clip's visual tokens) tokenised once: the research variant's captions.
    ///
    /// # Errors
    /// A directory without a tokenizer, or one that names no end-of-sequence token.
    pub fn from_lm_dir(lm: impl AsRef<Path>, prompt: &str) -> Result<Self, FoveatedError> {
        let lm = lm.as_ref();
        let tokenizer = TextTokenizer::from_hf_dir(lm)?;
        let end = tokenizer
            .special("eos_token")
            .and_then(|token| tokenizer.token_id(token))
            .ok_or_else(|| {
                FoveatedError::Config(format!(
                    "{}: the tokenizer names no end-of-sequence token (eos_token) to end captions",
                    lm.display()
                ))
            })?;
        let prompt = tokenizer.encode(prompt)?;
        Ok(CaptionTokenizer {
            tokenizer,
            prompt,
            end,
            chat: None,
        })
    }

    /// The release variant's captions: each one fVLM's stage-1 conversation
    /// ([`CaptionTokenizer::conversation`] of `user_prompt` and the caption).
    ///
    /// # Errors
    /// As [`CaptionTokenizer::from_lm_dir`], and a tokenizer without a chat template.
    pub fn chat_from_lm_dir(
        lm: impl AsRef<Path>,
        user_prompt: &str,
    ) -> Result<Self, FoveatedError> {
        let lm = lm.as_ref();
        let mut tokens = Self::from_lm_dir(lm, "")?;
        if !tokens.tokenizer.has_chat_template() {
            return Err(FoveatedError::Config(format!(
                "{}: the tokenizer has no chat template, which fVLM's conversations need",
                lm.display()
            )));
        }
        tokens.prompt.clear();
        tokens.chat = Some(user_prompt.to_string());
        Ok(tokens)
    }

    /// fVLM's `tokenize_sft(user, answer)` (and `tokenize_stage1`, whose ids are the same):
    /// `[system: FVLM_SYSTEM_PROMPT, user, assistant: answer]` through the chat template.
    pub fn conversation(&self, user: &str, answer: &str) -> Result<Conversation, FoveatedError> {
        let system = Message::new("system", FVLM_SYSTEM_PROMPT);
        let user = Message::new("user", user);
        let whole = [system, user.clone(), Message::new("assistant", answer)];
        let text = self.tokenizer.apply_chat_template(&whole, false)?;
        let ids = self.tokenizer.encode_without_special_tokens(&text)?;
        let asked = self.question(&user.content)?;
        Ok(Conversation {
            answer_start: asked.len().min(ids.len()),
            ids,
        })
    }

    /// What fVLM's `generate_captions.py` asks a clip with: `[system: FVLM_SYSTEM_PROMPT,
    /// user]` through the chat template with the assistant's turn opened, no special tokens
    /// added; the answer is generated after it ([`FoveatedModel::generate`](crate::FoveatedModel)).
    pub fn question(&self, user: &str) -> Result<Vec<u32>, FoveatedError> {
        let asked = [
            Message::new("system", FVLM_SYSTEM_PROMPT),
            Message::new("user", user),
        ];
        let text = self.tokenizer.apply_chat_template(&asked, true)?;
        Ok(self.tokenizer.encode_without_special_tokens(&text)?)
    }

    /// A multiple-choice question as fVLM's `benchmark.py` tokenises it: the length of
    /// `[system, user: question]` with the assistant's turn opened, and each option's whole
    /// conversation `[system, user, assistant: option]`, each rendered by the chat template and
    /// encoded with the tokenizer's special tokens (its `tokenizer.encode(text)`). These are
    /// [`FoveatedModel::option_losses`](crate::FoveatedModel)'s `answer_start` and `options`.
    pub fn options(
        &self,
        question: &str,
        options: &[&str],
    ) -> Result<(usize, Vec<Vec<u32>>), FoveatedError> {
        let asked = [
            Message::new("system", FVLM_SYSTEM_PROMPT),
            Message::new("user", question),
        ];
        let text = self.tokenizer.apply_chat_template(&asked, true)?;
        let answer_start = self.tokenizer.encode(&text)?.len();
        let ids = options
            .iter()
            .map(|option| {
                let whole = [
                    asked[0].clone(),
                    asked[1].clone(),
                    Message::new("assistant", option),
                ];
                let text = self.tokenizer.apply_chat_template(&whole, false)?;
                Ok(self.tokenizer.encode(&text)?)
            })
            .collect::<Result<_, FoveatedError>>()?;
        Ok((answer_start, ids))
    }

    /// The padding id fVLM's scoring leaves out of its sums: the tokenizer's `pad_token`, else
    /// the end-of-sequence token (as fVLM sets it).
    pub fn pad(&self) -> u32 {
        self.tokenizer
            .special("pad_token")
            .and_then(|token| self.tokenizer.token_id(token))
            .unwrap_or(self.end)
    }

    /// The text of generated `ids`, special tokens left out (as fVLM's script decodes them).
    pub fn decode(&self, ids: &[u32]) -> Result<String, FoveatedError> {
        Ok(self.tokenizer.decode(ids, true)?)
    }

    /// The prompt's token ids (none for the release variant's conversations).
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The end-of-sequence token closing every research caption (and padding shorter texts).
    pub fn end(&self) -> u32 {
        self.end
    }

    /// `caption`'s token ids: the end-of-sequence token last, or for the release variant its
    /// whole conversation (every token scored, as fVLM's stage 1 does).
    pub fn caption(&self, caption: &str) -> Result<Vec<u32>, FoveatedError> {
        if let Some(user) = &self.chat {
            return Ok(self.conversation(user, caption)?.ids);
        }
        let mut ids = self.tokenizer.encode(caption)?;
        ids.push(self.end);
        Ok(ids)
    }
}

/// How a folder of clips and its captions file become [`CaptionedClips`]: each clip decoded once
/// into `cache` as `spec` says (kiln-cache: later runs read the decoded frames), the captions
/// matched to the clips by name and tokenised once, the frames kept on the host and uploaded in
/// `precision` batch by batch.
pub struct CaptionedClipReader {
    /// Where decoded clips are kept.
    pub cache: ImageCache,
    /// Which frames of each clip, and how they are resized and normalised.
    pub spec: ClipSpec,
    /// The language model's tokenizer and the prompt.
    pub tokens: CaptionTokenizer,
    /// Clips per batch.
    pub batch_size: usize,
    /// The dtype frames are uploaded in.
    pub precision: Precision,
}

impl CaptionedClipReader {
    /// The clips directly below the folder `clips` (frame folders, GIFs, MP4 with kiln-cache's
    /// `video` feature) with the captions of the JSON Lines file `captions`, for `device`.
    ///
    /// # Errors
    /// A clip that cannot be decoded, a captions file that does not match the clips (by name
    /// and 1-based line), a caption the tokenizer refuses.
    pub fn read<B: Backend>(
        &self,
        clips: &Path,
        captions: &Path,
        device: &B::Device,
    ) -> Result<CaptionedClips<B>, FoveatedError> {
        let lines = read_captions(captions)?;
        let videos = self
            .cache
            .load_clips(&VideoSource::Folder(clips.into()), &self.spec)?;
        let ids = match_captions(videos.names(), &lines, captions)?
            .iter()
            .map(|caption| self.tokens.caption(caption))
            .collect::<Result<Vec<_>, _>>()?;
        let feed = videos.to_device::<B>(device, self.precision, Residency::Host);
        CaptionedClips::new(
            feed,
            self.tokens.prompt.clone(),
            ids,
            self.tokens.end,
            self.batch_size,
        )
    }
}

/// How frames are resized and normalised for the DINOv2 directory `dino`: its
/// `preprocessor_config.json`, else (a directory without one) DINOv2's processor at
/// `image_size` (the shorter edge resized to it, then a centre crop) with ImageNet's mean and
/// std.
pub fn dinov2_frames(
    dino: impl AsRef<Path>,
    image_size: usize,
) -> Result<Preprocess, FoveatedError> {
    let processor = dino.as_ref().join("preprocessor_config.json");
    if processor.is_file() {
        Ok(Preprocess::from_hf_config(&processor)?)
    } else {
        Ok(Preprocess::dinov2(image_size as u32, image_size as u32))
    }
}

/// How fVLM fits a frame to DINOv2's square. Its training shards were centre-cropped when they
/// were made (`download_openvid.py`, `process_video_datasets.py`, `download_webvid.py` and
/// `data.py`'s fallback all run ffmpeg's `scale=224:224:force_original_aspect_ratio=increase,
/// crop=224:224`); its evaluation squashes (`benchmark.py`'s `Resize((224, 224))`,
/// `generate_captions.py`'s `img.resize((224, 224))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFit {
    /// The shorter edge scaled to the side (bicubic, ffmpeg's default scaler), then the centre
    /// square: what fVLM trained on.
    Crop,
    /// Scaled to the square whatever the aspect ratio (bicubic, Pillow's default): what fVLM's
    /// evaluation reads. Nothing is cropped away.
    Squash,
}

impl FrameFit {
    /// Frames fitted to `image_size × image_size`, then ImageNet's mean and std.
    pub fn preprocess(self, image_size: usize) -> Preprocess {
        let side = u32::try_from(image_size).unwrap_or(u32::MAX);
        let cropped = Preprocess::dinov2(side, side);
        match self {
            FrameFit::Crop => cropped,
            FrameFit::Squash => Preprocess {
                resize: Some(Resize::Exact {
                    height: side,
                    width: side,
                }),
                center_crop: None,
                ..cropped
            },
        }
    }
}

impl std::str::FromStr for FrameFit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "crop" => Ok(FrameFit::Crop),
            "squash" => Ok(FrameFit::Squash),
            other => Err(format!(
                "`{other}`: `crop` (fVLM's training shards) or `squash` (its evaluation)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("captions.jsonl");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn captions_are_read_and_matched_in_clip_order() {
        let (_dir, path) = file(
            "{\"video\": \"b.gif\", \"caption\": \"two\"}\n\n{\"video\": \"a\", \"caption\": \"one\"}\n",
        );
        let captions = read_captions(&path).unwrap();
        assert_eq!(captions.len(), 2);
        assert_eq!(
            match_captions(["a", "b.gif"], &captions, &path).unwrap(),
            ["one", "two"]
        );
    }

    /// A byte-order mark (Excel's "CSV UTF-8", Notepad) is read past; bytes that are not UTF-8
    /// are named by line and column.
    #[test]
    fn a_byte_order_mark_is_read_past_and_other_encodings_are_named() {
        let (_dir, path) = file("\u{feff}{\"video\": \"a\", \"caption\": \"one\"}\n");
        assert_eq!(read_captions(&path).unwrap()[0].video, "a");
        let dir = tempfile::tempdir().unwrap();
        let latin1 = dir.path().join("latin1.jsonl");
        std::fs::write(&latin1, b"{\"video\": \"a\", \"caption\": \"caf\xe9\"}\n").unwrap();
        let err = read_captions(&latin1).unwrap_err().to_string();
        assert!(
            err.ends_with("line 1, column 31: not UTF-8 text (byte 0xe9)"),
            "{err}"
        );
    }

    #[test]
    fn bad_lines_and_mismatches_are_named() {
        let (_dir, path) = file("{\"video\": \"a\", \"caption\": \"one\"}\n{\"video\": \"a\"}\n");
        let err = read_captions(&path).unwrap_err().to_string();
        assert!(err.contains("line 2: not a caption"), "{err}");
        let (_dir, path) = file(
            "{\"video\": \"a\", \"caption\": \"one\"}\n{\"video\": \"a\", \"caption\": \"1\"}\n",
        );
        let err = read_captions(&path).unwrap_err().to_string();
        assert!(
            err.contains("line 2: a second caption for 'a' (the first is on line 1)"),
            "{err}"
        );

        let (_dir, path) = file("{\"video\": \"a\", \"caption\": \"one\"}\n");
        let captions = read_captions(&path).unwrap();
        let err = match_captions(["a", "b"], &captions, &path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no caption for the clip 'b'"), "{err}");
        let err = match_captions(std::iter::empty(), &captions, &path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a caption for 'a', which is not among the clips"),
            "{err}"
        );
    }

    /// fVLM's evaluation squashes a wide frame: both halves stay, where its training shards
    /// (and DINOv2's processor) crop the sides.
    #[test]
    fn squashed_frames_keep_what_cropped_ones_lose() {
        let wide = image::RgbImage::from_fn(40, 10, |x, _| match x {
            0..10 => image::Rgb([255, 0, 0]),
            30.. => image::Rgb([0, 0, 255]),
            _ => image::Rgb([0, 255, 0]),
        });
        let squashed = FrameFit::Squash
            .preprocess(8)
            .resize_and_crop(&wide)
            .unwrap();
        assert_eq!(squashed.dimensions(), (8, 8));
        assert_eq!(squashed.get_pixel(0, 4).0, [255, 0, 0]);
        assert_eq!(squashed.get_pixel(7, 4).0, [0, 0, 255]);
        let cropped = FrameFit::Crop.preprocess(8).resize_and_crop(&wide).unwrap();
        assert_eq!(cropped.dimensions(), (8, 8));
        assert_eq!(cropped.get_pixel(0, 4).0, [0, 255, 0]);
        assert_eq!("squash".parse(), Ok(FrameFit::Squash));
        assert!(
            "stretch"
                .parse::<FrameFit>()
                .unwrap_err()
                .contains("`crop`")
        );
    }
}
