//! Frames of an MP4's H.264 track, decoded by OpenH264 (built from source with the `video`
//! feature; no system FFmpeg). Decoding runs from the first frame to the last sampled one, since
//! H.264 frames depend on earlier ones; only the sampled frames are kept.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::ops::ControlFlow;
use std::path::Path;

use image::RgbImage;
use mp4::{MediaType, Mp4Reader, Mp4Track};
use openh264::decoder::{DecodedYUV, Decoder};
use openh264::formats::YUVSource;

use crate::decode::check_budget;
use crate::video::ClipSpec;

/// The frames `spec` samples from `path`'s first H.264 track, as RGB; a track
/// declaring frames of more than `max_pixels` pixels is refused before decoding.
pub(crate) fn sampled_frames(
    path: &Path,
    spec: &ClipSpec,
    max_pixels: u64,
) -> Result<Vec<RgbImage>, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let file = NoCircles {
        inner: file,
        position: 0,
        reads: HashMap::new(),
    };
    let reader = Mp4Reader::read_header(BufReader::new(file), size).map_err(|e| e.to_string())?;
    let track = reader
        .tracks()
        .values()
        .find(|track| matches!(track.media_type(), Ok(MediaType::H264)))
        .ok_or("no H.264 video track (kiln decodes H.264 MP4 only)")?;
    check_budget(
        u32::from(track.width()),
        u32::from(track.height()),
        max_pixels,
    )?;
    let samples = Samples::of(track, size)?;
    let count = samples.count as usize;
    if count == 0 {
        return Err("a video track without frames".into());
    }
    let mut annex_b = AnnexB::for_track(track)?;
    let fps = Some(track.frame_rate()).filter(|fps| fps.is_finite() && *fps > 0.0);
    let wanted = spec.sampled(count, fps)?;
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
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let (mut sample, mut packet) = (Vec::new(), Vec::new());
    samples.visit(|number, offset, length| {
        if decoded > last {
            return Ok(ControlFlow::Break(()));
        }
        sample.resize(length as usize, 0);
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut sample))
            .map_err(|e| format!("frame {number}: {e}"))?;
        annex_b.convert(&sample, &mut packet)?;
        if let Some(picture) = decoder
            .decode(&packet)
            .map_err(|e| format!("frame {number}: {e}"))?
        {
            keep(&picture, decoded);
            decoded += 1;
        }
        Ok(ControlFlow::Continue(()))
    })?;
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

/// Where a track's samples lie, from its `stsz`, `stsc` and `stco` / `co64` boxes, each range
/// checked against the file as it is visited. (The mp4 crate's own `read_sample` panics where
/// these tables and the timing table disagree, and sizes its buffer from the table alone.)
struct Samples<'a> {
    count: u32,
    /// Every sample's size, or `None` for a table of sizes.
    fixed_size: Option<u32>,
    sizes: &'a [u32],
    /// `(first chunk, samples per chunk)`, first chunks 1-based and increasing.
    runs: Vec<(u32, u32)>,
    chunk_offsets: Vec<u64>,
    file_size: u64,
}

impl<'a> Samples<'a> {
    fn of(track: &'a Mp4Track, file_size: u64) -> Result<Self, String> {
        let stbl = &track.trak.mdia.minf.stbl;
        let chunk_offsets = match (&stbl.stco, &stbl.co64) {
            (Some(stco), _) => stco.entries.iter().map(|&o| u64::from(o)).collect(),
            (None, Some(co64)) => co64.entries.clone(),
            (None, None) => return Err("the video track has no chunk offsets (stco)".into()),
        };
        let runs: Vec<(u32, u32)> = stbl
            .stsc
            .entries
            .iter()
            .map(|entry| (entry.first_chunk, entry.samples_per_chunk))
            .collect();
        if runs.first().is_some_and(|&(first, _)| first != 1)
            || runs.windows(2).any(|pair| pair[1].0 <= pair[0].0)
        {
            return Err("the video track's sample-to-chunk table (stsc) is out of order".into());
        }
        let stsz = &stbl.stsz;
        let fixed_size = (stsz.sample_size != 0).then_some(stsz.sample_size);
        if fixed_size.is_none() && stsz.sample_sizes.len() != stsz.sample_count as usize {
            return Err("the video track's sample-size table (stsz) is incomplete".into());
        }
        Ok(Samples {
            count: stsz.sample_count,
            fixed_size,
            sizes: &stsz.sample_sizes,
            runs,
            chunk_offsets,
            file_size,
        })
    }

    /// Calls `visit(number, offset, length)` for samples 1, 2, … in order until it breaks or
    /// every sample is visited; a sample outside the file, or tables that place fewer samples
    /// than they count, are errors.
    fn visit(
        &self,
        mut visit: impl FnMut(u32, u64, u32) -> Result<ControlFlow<()>, String>,
    ) -> Result<(), String> {
        let mut placed = 0u32;
        let mut run = 0;
        for (chunk, &chunk_offset) in (1u32..).zip(&self.chunk_offsets) {
            while self
                .runs
                .get(run + 1)
                .is_some_and(|&(first, _)| first <= chunk)
            {
                run += 1;
            }
            let per_chunk = self.runs.get(run).map_or(0, |&(_, per_chunk)| per_chunk);
            let mut offset = chunk_offset;
            for _ in 0..per_chunk {
                if placed == self.count {
                    return Ok(());
                }
                let length = self
                    .fixed_size
                    .unwrap_or_else(|| self.sizes[placed as usize]);
                let number = placed + 1;
                let end = offset
                    .checked_add(u64::from(length))
                    .filter(|&end| end <= self.file_size)
                    .ok_or_else(|| format!("frame {number} lies outside the file"))?;
                if visit(number, offset, length)?.is_break() {
                    return Ok(());
                }
                offset = end;
                placed = number;
            }
        }
        if placed < self.count {
            return Err(format!(
                "the track's tables place {placed} of its {} frames",
                self.count
            ));
        }
        Ok(())
    }
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

/// How often one byte position of an MP4 may be read from; a valid file needs a few.
const MAX_READS_AT_ONE_POSITION: u32 = 64;

/// A file that refuses to be read at one position more than [`MAX_READS_AT_ONE_POSITION`]
/// times. The mp4 crate's parser goes round in circles on some malformed files (a box of size 0
/// inside a container is re-read for ever); a parser that loops over a finite file must read
/// some position again and again, so this bounds every such loop, in time linear in the file.
struct NoCircles<R> {
    inner: R,
    position: u64,
    reads: HashMap<u64, u32>,
}

impl<R: Read> Read for NoCircles<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let reads = self.reads.entry(self.position).or_insert(0);
        *reads += 1;
        if *reads > MAX_READS_AT_ONE_POSITION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "its boxes send the MP4 parser in circles at byte {} (a box of size 0 \
                     inside another?)",
                    self.position
                ),
            ));
        }
        let read = self.inner.read(buf)?;
        self.position += read as u64;
        Ok(read)
    }
}

impl<R: Seek> Seek for NoCircles<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.position = self.inner.seek(to)?;
        Ok(self.position)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video");
        dir.join("moving.mp4")
    }

    /// Every byte of the `moov` box (the structure) and every 29th of the rest, each flipped in
    /// three ways: an error or frames, never a panic or a hang. One flip once made the mp4
    /// crate loop for ever.
    #[test]
    fn damaged_mp4s_give_errors_not_panics_or_hangs() {
        let bytes = std::fs::read(fixture()).unwrap();
        let moov = bytes.windows(4).position(|w| w == b"moov").unwrap() - 4;
        let dir = tempfile::tempdir().unwrap();
        let damaged = dir.path().join("damaged.mp4");
        let spec = crate::ClipSpec::new(2, crate::Preprocess::siglip(8));
        let mut errors = 0;
        for i in (0..moov).step_by(29).chain(moov..bytes.len()) {
            for flip in [0xFF, 0x80, 0x01] {
                let mut copy = bytes.clone();
                copy[i] ^= flip;
                std::fs::write(&damaged, &copy).unwrap();
                errors += usize::from(super::sampled_frames(&damaged, &spec, 1 << 28).is_err());
            }
        }
        assert!(errors > 0, "no flip was noticed");
        // The flip that looped: `mvhd`'s size from 108 to 236.
        let mut copy = bytes.clone();
        copy[moov + 11] ^= 0x80;
        std::fs::write(&damaged, &copy).unwrap();
        let err = super::sampled_frames(&damaged, &spec, 1 << 28).unwrap_err();
        assert!(err.contains("in circles"), "{err}");
    }
}
