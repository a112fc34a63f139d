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
//! {"video": "clip7.mp4", "caption": "A man walks his dog.", "source": "webvid"}
//! {"video": "chart.png", "caption": "It rose by 4%.", "user": "How much did sales rise?"}
//! ```
//!
//! For the release variant each line becomes fVLM's conversation: the line's `user` as the
//! user's turn, else its `source`'s prompt ([`fvlm_source_prompt`]), else the tokenizer's
//! default prompt; the caption is the assistant's answer.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use kiln_cache::{ClipSpec, ImageCache, Preprocess, Residency, Resize, VideoSource};
use kiln_core::Precision;
use kiln_text::{Message, TextTokenizer};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::{CaptionedClips, FoveatedError, ReleaseStage};

/// One line of a captions file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caption {
    /// The clip, as the clip cache names it.
    pub video: String,
    /// What the model should say about it.
    pub caption: String,
    /// The user's turn before it (fVLM's shards' `user`; empty or absent: the source's prompt).
    #[serde(default)]
    pub user: Option<String>,
    /// Where the clip comes from (fVLM's shards' `source`: `openvid`, `webvid`, ...), which
    /// picks the user's turn when the line has none.
    #[serde(default)]
    pub source: Option<String>,
}

impl Caption {
    /// The user's turn of fVLM's conversation around this caption: the line's `user`, else its
    /// `source`'s prompt, else `default` (fVLM's `data.py`).
    pub fn user_turn<'a>(&'a self, default: &'a str) -> &'a str {
        match (self.user.as_deref(), self.source.as_deref()) {
            (Some(user), _) if !user.is_empty() => user,
            (_, Some(source)) => fvlm_source_prompt(source),
            _ => default,
        }
    }
}

/// fVLM's user prompt for a sample from `source` with no user turn of its own
/// (`tokenization.py`'s `SOURCE_PROMPTS`, and `DEFAULT_VISUAL_PROMPT` for other sources): the
/// prompt names the caption style each dataset was written in.
///
/// ```
/// assert_eq!(kiln_foveated::fvlm_source_prompt("vript"), "Provide a detailed narration of what happens in this video.");
/// assert_eq!(kiln_foveated::fvlm_source_prompt("cauldron"), "Describe this.");
/// ```
pub fn fvlm_source_prompt(source: &str) -> &'static str {
    match source {
        "openvid" => FVLM_CAPTION_PROMPT,
        "webvid" => "What would be the WebVid caption for this video?",
        "vript" => "Provide a detailed narration of what happens in this video.",
        "sharegpt4video" => "Describe what happens in this video in detail.",
        _ => "Describe this.",
    }
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
    let form = "{\"video\": NAME, \"caption\": TEXT[, \"user\": TEXT][, \"source\": NAME]}";
    read_by_video(path.as_ref(), "caption", form, |c: &Caption| &c.video)
}

/// The lines of the JSON Lines file `path`, each a `what` naming one video by `video`, refusing
/// a line that is not one or names a video an earlier line named, by its 1-based number.
pub(crate) fn read_by_video<T: DeserializeOwned>(
    path: &Path,
    what: &str,
    form: &str,
    video: impl Fn(&T) -> &str,
) -> Result<Vec<T>, FoveatedError> {
    let mut seen = HashMap::new();
    let mut lines = Vec::new();
    for (number, line) in read_lines::<T>(path, &format!("a {what}"), form)? {
        if let Some(first) = seen.insert(video(&line).to_string(), number) {
            return Err(FoveatedError::Data(format!(
                "{}, line {number}: a second {what} for '{}' (the first is on line {first})",
                path.display(),
                video(&line)
            )));
        }
        lines.push(line);
    }
    Ok(lines)
}

/// The caption of each clip in `names` (the clip cache's order), from `captions` (read from
/// `file`): every clip needs one, and every caption needs its clip.
pub fn match_captions<'a, 'c>(
    names: impl IntoIterator<Item = &'a str>,
    captions: &'c [Caption],
    file: &Path,
) -> Result<Vec<&'c Caption>, FoveatedError> {
    match_videos(names, captions, |c| &c.video, file, "caption")
}

/// The line of `lines` (read from `file`, each naming one video by `video`) for each clip in
/// `names`: every clip needs one, and every line its clip.
pub(crate) fn match_videos<'a, 'c, T>(
    names: impl IntoIterator<Item = &'a str>,
    lines: &'c [T],
    video: impl Fn(&T) -> &str,
    file: &Path,
    what: &str,
) -> Result<Vec<&'c T>, FoveatedError> {
    let mut by_video: HashMap<&str, &T> = lines.iter().map(|line| (video(line), line)).collect();
    let matched = names
        .into_iter()
        .map(|name| {
            by_video.remove(name).ok_or_else(|| {
                FoveatedError::Data(format!(
                    "{}: no {what} for the clip '{name}'",
                    file.display()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(orphan) = lines.iter().find(|l| by_video.contains_key(video(l))) {
        return Err(FoveatedError::Data(format!(
            "{}: a {what} for '{}', which is not among the clips (or was skipped as bad)",
            file.display(),
            video(orphan)
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
    /// Tokens cut off the end ([`Conversation::truncated`]).
    pub cut: usize,
}

impl Conversation {
    /// Text scored whole (a research caption): its answer starts at its first token.
    pub fn whole(ids: Vec<u32>) -> Self {
        Conversation {
            ids,
            answer_start: 0,
            cut: 0,
        }
    }

    /// The first `max` tokens, as fVLM's tokenizer call (`truncation=True, max_length=...`)
    /// keeps them; [`Conversation::cut`] says how many went.
    pub fn truncated(mut self, max: usize) -> Self {
        let cut = self.ids.len().saturating_sub(max);
        self.ids.truncate(max);
        self.answer_start = self.answer_start.min(self.ids.len());
        self.cut += cut;
        self
    }

    /// Whether any of the answer is left (truncation can cut it all).
    pub fn has_answer(&self) -> bool {
        self.answer_start < self.ids.len()
    }

    /// Stage 2's loss mask (`tokenize_sft`): the answer's tokens. Stage 1 scores them all.
    pub fn answer_mask(&self) -> Vec<bool> {
        (0..self.ids.len())
            .map(|at| at >= self.answer_start)
            .collect()
    }
}

/// A language model's tokenizer as captions need it. For the research variant: the prompt's
/// ids, and every caption closed by the end-of-sequence token (so the model learns where a
/// caption ends). For the release variant: each caption as the conversation fVLM's training
/// stage makes of it (system prompt, user prompt, the caption as the answer, truncated as fVLM
/// truncates), no prompt before the visual tokens.
pub struct CaptionTokenizer {
    tokenizer: TextTokenizer,
    prompt: Vec<u32>,
    end: u32,
    /// The default user prompt of the release variant's conversations.
    chat: Option<String>,
    /// The release variant's training stage, which says how conversations are truncated.
    stage: ReleaseStage,
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
            stage: ReleaseStage::Alignment,
        })
    }

    /// The release variant's captions: each one fVLM's stage-1 conversation
    /// ([`CaptionTokenizer::conversation`] of the line's user turn, by default `user_prompt`, and
    /// the caption; [`CaptionTokenizer::for_stage`] picks another stage).
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

    /// Conversations as fVLM's `stage` tokenises them: truncated at
    /// [`ReleaseStage::caption_tokens`] (a clip's) or [`ReleaseStage::text_tokens`] (text-only).
    pub fn for_stage(mut self, stage: ReleaseStage) -> Self {
        self.stage = stage;
        self
    }

    /// The training stage conversations are tokenised for.
    pub fn stage(&self) -> ReleaseStage {
        self.stage
    }

    /// The text a clip trains on: research, the caption closed by the end-of-sequence token;
    /// release, fVLM's conversation of the line's [`Caption::user_turn`] and the caption,
    /// truncated as the stage truncates it.
    pub fn clip_text(&self, line: &Caption) -> Result<Conversation, FoveatedError> {
        match &self.chat {
            Some(default) => Ok(self
                .conversation(line.user_turn(default), &line.caption)?
                .truncated(self.stage.caption_tokens())),
            None => {
                let mut ids = self.tokenizer.encode(&line.caption)?;
                ids.push(self.end);
                Ok(Conversation::whole(ids))
            }
        }
    }

    /// The text-only conversations of the JSON Lines file `path` ([`read_text_samples`]), each
    /// as [`CaptionTokenizer::text_sample`] makes it, with a warning counting those truncated.
    ///
    /// # Errors
    /// As [`read_text_samples`]; text the tokenizer refuses; in the answer-only stages, a
    /// conversation whose answer truncation cut off whole.
    pub fn read_text_samples(&self, path: &Path) -> Result<Vec<Conversation>, FoveatedError> {
        let texts = (read_text_samples(path)?.iter())
            .map(|sample| self.text_sample(sample))
            .collect::<Result<Vec<_>, _>>()?;
        self.checked(texts, path, "text")
    }

    /// A text-only conversation as fVLM's stage tokenises it (`tokenize_sft`, truncated at
    /// 1 024 tokens).
    pub fn text_sample(&self, sample: &TextSample) -> Result<Conversation, FoveatedError> {
        Ok(self
            .conversation(&sample.user, &sample.assistant)?
            .truncated(self.stage.text_tokens()))
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
            cut: 0,
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

    /// `caption`'s token ids ([`CaptionTokenizer::clip_text`] of a line with no user turn or
    /// source).
    pub fn caption(&self, caption: &str) -> Result<Vec<u32>, FoveatedError> {
        let line = Caption {
            video: String::new(),
            caption: caption.into(),
            user: None,
            source: None,
        };
        Ok(self.clip_text(&line)?.ids)
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
    /// Conversations longer than the stage keeps are truncated as fVLM truncates them, with a
    /// warning that counts them; in the answer-only stages, a clip whose answer is cut off
    /// whole is refused.
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
        let texts = match_captions(videos.names(), &lines, captions)?
            .iter()
            .map(|caption| self.tokens.clip_text(caption))
            .collect::<Result<Vec<_>, _>>()?;
        let texts = self.tokens.checked(texts, captions, "clip")?;
        let feed = videos.to_device::<B>(device, self.precision, Residency::Host);
        let clips = CaptionedClips::new(
            feed,
            self.tokens.prompt.clone(),
            texts,
            self.tokens.end,
            self.batch_size,
        )?;
        Ok(clips.answer_only(self.tokens.answer_only()))
    }
}

impl CaptionTokenizer {
    /// Whether the stage scores answers alone (the release variant's stages 2 and 3).
    pub fn answer_only(&self) -> bool {
        self.chat.is_some() && self.stage.answer_only()
    }

    /// `texts` (the `what`s of `file`, in order) with a warning counting those truncation
    /// shortened; refuses one whose answer it cut off whole where answers alone are scored.
    pub(crate) fn checked(
        &self,
        texts: Vec<Conversation>,
        file: &Path,
        what: &str,
    ) -> Result<Vec<Conversation>, FoveatedError> {
        let cut: Vec<&Conversation> = texts.iter().filter(|t| t.cut > 0).collect();
        if let Some(longest) = cut.iter().map(|t| t.ids.len() + t.cut).max() {
            log::warn!(
                "{}: {} of {} {what}s' conversations truncated to {} tokens as fVLM's {} \
                 truncates them (the longest had {longest})",
                file.display(),
                cut.len(),
                texts.len(),
                cut[0].ids.len(),
                self.stage
            );
        }
        if self.answer_only()
            && let Some(index) = texts.iter().position(|t| !t.has_answer())
        {
            return Err(FoveatedError::Data(format!(
                "{}: {what} {}: its question fills the {} tokens fVLM's {} keeps, leaving no \
                 answer to learn",
                file.display(),
                index + 1,
                texts[index].ids.len(),
                self.stage
            )));
        }
        Ok(texts)
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
        let matched = match_captions(["a", "b.gif"], &captions, &path).unwrap();
        let texts: Vec<&str> = matched.iter().map(|c| c.caption.as_str()).collect();
        assert_eq!(texts, ["one", "two"]);
    }

    /// fVLM's user turn: the line's own, else its source's prompt, else the default.
    #[test]
    fn each_line_gets_fvlms_user_turn() {
        let (_dir, path) = file(concat!(
            "{\"video\": \"a\", \"caption\": \"x\", \"source\": \"webvid\"}\n",
            "{\"video\": \"b\", \"caption\": \"x\", \"source\": \"coco\"}\n",
            "{\"video\": \"c\", \"caption\": \"x\", \"user\": \"Why?\", \"source\": \"webvid\"}\n",
            "{\"video\": \"d\", \"caption\": \"x\", \"user\": \"\"}\n",
        ));
        let turns: Vec<String> = (read_captions(&path).unwrap().iter())
            .map(|c| c.user_turn("default").to_string())
            .collect();
        assert_eq!(
            turns,
            [
                "What would be the WebVid caption for this video?",
                "Describe this.",
                "Why?",
                "default"
            ]
        );
    }

    /// fVLM's truncation keeps the first tokens; the answer's start moves with it.
    #[test]
    fn truncation_keeps_the_first_tokens_and_counts_the_rest() {
        let asked = Conversation {
            ids: (0..10).collect(),
            answer_start: 6,
            cut: 0,
        };
        let kept = asked.clone().truncated(8);
        assert_eq!((kept.ids.len(), kept.answer_start, kept.cut), (8, 6, 2));
        assert!(kept.has_answer());
        let none = asked.clone().truncated(5);
        assert_eq!((none.answer_start, none.cut), (5, 5));
        assert!(!none.has_answer());
        assert_eq!(asked.clone().truncated(10), asked);
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
