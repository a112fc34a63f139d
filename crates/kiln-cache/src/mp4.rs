//! Frames of an MP4's H.264 track, decoded by OpenH264 (built from source with the `video`
//! feature; no system FFmpeg). Decoding runs from the first frame to the last sampled one, since
//! H.264 frames depend on earlier ones; only the sampled frames are kept.

use std::io::BufReader;
use std::path::Path;

use image::RgbImage;
use mp4::{MediaType, Mp4Reader, Mp4Track};
use openh264::decoder::{DecodedYUV, Decoder};
use openh264::formats::YUVSource;

use crate::video::sample_frames;

/// Frames `sample_frames(count, frames)` of `path`'s first H.264 track, as RGB.
pub(crate) fn sampled_frames(path: &Path, frames: u32) -> Result<Vec<RgbImage>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut reader =
        Mp4Reader::read_header(BufReader::new(file), size).map_err(|e| e.to_string())?;
    let track = reader
        .tracks()
        .values()
        .find(|track| matches!(track.media_type(), Ok(MediaType::H264)))
        .ok_or("no H.264 video track (kiln decodes H.264 MP4 only)")?;
    let (track_id, count) = (track.track_id(), track.sample_count() as usize);
    if count == 0 {
        return Err("a video track without frames".into());
    }
    let mut annex_b = AnnexB::for_track(track)?;
    let wanted = sample_frames(count, frames);
    let last = wanted[wanted.len() - 1];
    let mut decoder = Decoder::new().map_err(|e| format!("OpenH264: {e}"))?;
    let mut decoded = 0;
    let mut kept = Vec::with_capacity(wanted.len());
    let mut keep = |picture: &DecodedYUV<'_>, index: usize| {
        let repeats = wanted.iter().filter(|&&w| w == index).count();
        if repeats > 0 {
            let rgb = to_rgb(picture);
            kept.extend(std::iter::repeat_n(rgb, repeats));
        }
    };
    let mut packet = Vec::new();
    for sample_id in 1..=count as u32 {
        if decoded > last {
            break;
        }
        let Some(sample) = reader
            .read_sample(track_id, sample_id)
            .map_err(|e| e.to_string())?
        else {
            continue;
        };
        annex_b.convert(&sample.bytes, &mut packet)?;
        if let Some(picture) = decoder
            .decode(&packet)
            .map_err(|e| format!("frame {sample_id}: {e}"))?
        {
            keep(&picture, decoded);
            decoded += 1;
        }
    }
    for picture in decoder.flush_remaining().map_err(|e| e.to_string())? {
        keep(&picture, decoded);
        decoded += 1;
    }
    if kept.len() < wanted.len() {
        return Err(format!(
            "{decoded} of {count} frames could be decoded, frame {last} was wanted"
        ));
    }
    Ok(kept)
}

fn to_rgb(picture: &DecodedYUV<'_>) -> RgbImage {
    let (width, height) = picture.dimensions();
    let mut rgb = vec![0; width * height * 3];
    picture.write_rgb8(&mut rgb);
    RgbImage::from_raw(width as u32, height as u32, rgb).expect("w·h·3 bytes")
}

/// MP4 stores H.264 as length-prefixed NAL units with the parameter sets in the track header;
/// OpenH264 reads Annex B: start codes, parameter sets in the stream.
struct AnnexB {
    length_size: usize,
    parameter_sets: Option<Vec<u8>>,
}

const START_CODE: [u8; 4] = [0, 0, 0, 1];

impl AnnexB {
    fn for_track(track: &Mp4Track) -> Result<Self, String> {
        let avc = track
            .trak
            .mdia
            .minf
            .stbl
            .stsd
            .avc1
            .as_ref()
            .ok_or("the H.264 track has no avcC configuration")?;
        let config = &avc.avcc;
        let mut parameter_sets = Vec::new();
        for nal in config
            .sequence_parameter_sets
            .iter()
            .chain(&config.picture_parameter_sets)
        {
            parameter_sets.extend(START_CODE);
            parameter_sets.extend(&nal.bytes);
        }
        Ok(AnnexB {
            length_size: usize::from(config.length_size_minus_one & 3) + 1,
            parameter_sets: Some(parameter_sets),
        })
    }

    /// `sample` in Annex B form into `out`, the parameter sets before the first one.
    fn convert(&mut self, mut sample: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        out.clear();
        if let Some(parameter_sets) = self.parameter_sets.take() {
            out.extend(parameter_sets);
        }
        while !sample.is_empty() {
            if sample.len() < self.length_size {
                return Err("a truncated NAL unit length".into());
            }
            let (length, rest) = sample.split_at(self.length_size);
            let length = length
                .iter()
                .fold(0usize, |n, &byte| (n << 8) | usize::from(byte));
            if rest.len() < length {
                return Err("a NAL unit longer than its sample".into());
            }
            out.extend(START_CODE);
            out.extend(&rest[..length]);
            sample = &rest[length..];
        }
        Ok(())
    }
}
