//! Animated GIFs as clips: frames counted from their headers without decoding a pixel, then only
//! the frames up to the last sampled one decoded, each into its own rectangle of one canvas, and
//! only the sampled ones copied out whole.
//!
//! A GIF's frames are rectangles drawn over a canvas (the "logical screen"), each left in place,
//! cleared or undone after it is shown. Compositing every frame onto a fresh full canvas, as
//! decoders that yield whole frames do, costs frames × screen pixels: a 7 KB GIF of 300 one-pixel
//! frames on a 13 000² screen took minutes. Here a frame costs its own rectangle, and a clip is
//! refused when the pixels it must decode exceed [`DECODE_BUDGET_IMAGES`] images' worth.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use gif::{ColorOutput, DecodeOptions, DisposalMethod};
use image::{DynamicImage, RgbImage, RgbaImage};

use crate::decode::{check_budget, to_rgb8};

/// Pixels one clip of a GIF may decode (every frame's rectangle up to the last sampled frame,
/// and a whole canvas for each sampled one), in images of the per-image limit.
pub const DECODE_BUDGET_IMAGES: u64 = 16;

/// What a GIF's headers say: its canvas and each frame's delay and rectangle.
#[derive(Debug)]
pub(crate) struct Scan {
    width: u32,
    height: u32,
    /// Each frame's delay in milliseconds.
    pub delays_ms: Vec<f64>,
    /// Each frame's rectangle in pixels.
    rect_pixels: Vec<u64>,
}

fn open(path: &Path, skip_pixels: bool) -> Result<gif::Decoder<BufReader<File>>, String> {
    let file = File::open(path).map_err(|e| kiln_io::said(&e))?;
    let mut options = DecodeOptions::new();
    options.set_color_output(ColorOutput::RGBA);
    options.skip_frame_decoding(skip_pixels);
    options
        .read_info(BufReader::new(file))
        .map_err(|e| e.to_string())
}

/// Reads the headers of the GIF at `path` (its canvas checked against `max_pixels`).
pub(crate) fn scan(path: &Path, max_pixels: u64) -> Result<Scan, String> {
    let mut decoder = open(path, true)?;
    let (width, height) = (u32::from(decoder.width()), u32::from(decoder.height()));
    check_budget(width, height, max_pixels)?;
    let (mut delays_ms, mut rect_pixels) = (Vec::new(), Vec::new());
    while let Some(frame) = decoder.next_frame_info().map_err(|e| e.to_string())? {
        // Delays are in hundredths of a second.
        delays_ms.push(f64::from(frame.delay) * 10.0);
        rect_pixels.push(u64::from(frame.width) * u64::from(frame.height));
    }
    if delays_ms.is_empty() {
        return Err("a GIF without frames".into());
    }
    Ok(Scan {
        width,
        height,
        delays_ms,
        rect_pixels,
    })
}

/// The frames at `wanted` (ascending frame indices, repeats allowed) of the GIF at `path`,
/// composited as browsers show them: transparent pixels keep what lies below, and the canvas
/// starts transparent (white, once flattened).
pub(crate) fn frames(
    path: &Path,
    scan: &Scan,
    wanted: &[usize],
    max_pixels: u64,
) -> Result<Vec<RgbImage>, String> {
    let Some(&last) = wanted.last() else {
        return Ok(Vec::new());
    };
    let canvas_pixels = u64::from(scan.width) * u64::from(scan.height);
    let decoded: u64 =
        scan.rect_pixels[..=last].iter().sum::<u64>() + wanted.len() as u64 * canvas_pixels;
    let budget = max_pixels.saturating_mul(DECODE_BUDGET_IMAGES);
    if decoded > budget {
        return Err(format!(
            "a clip of frames 1 to {} would decode {decoded} pixels, more than the {budget} a \
             clip may ({DECODE_BUDGET_IMAGES} images of the per-image limit); raise the limit if \
             the video is real (`--max-image-pixels`, `ImageCache::max_image_pixels`)",
            last + 1
        ));
    }
    let mut decoder = open(path, false)?;
    let mut canvas = Canvas::new(scan.width, scan.height);
    let mut kept = Vec::with_capacity(wanted.len());
    let mut pixels = Vec::new();
    for index in 0..=last {
        let Some(frame) = decoder.next_frame_info().map_err(|e| e.to_string())? else {
            return Err(format!("frame {} is missing: the file changed", index + 1));
        };
        let rect = Rect {
            left: u32::from(frame.left),
            top: u32::from(frame.top),
            width: u32::from(frame.width),
            height: u32::from(frame.height),
        };
        check_budget(rect.width, rect.height, max_pixels)
            .map_err(|e| format!("frame {}: {e}", index + 1))?;
        let dispose = frame.dispose;
        pixels.resize(decoder.buffer_size(), 0);
        decoder
            .read_into_buffer(&mut pixels)
            .map_err(|e| format!("frame {}: {e}", index + 1))?;
        let saved = (dispose == DisposalMethod::Previous).then(|| canvas.copy(rect));
        canvas.draw(rect, &pixels);
        let repeats = wanted.iter().filter(|&&w| w == index).count();
        if repeats > 0 {
            let rgb = to_rgb8(DynamicImage::ImageRgba8(canvas.image.clone()));
            kept.extend(std::iter::repeat_n(rgb, repeats));
        }
        match dispose {
            DisposalMethod::Background => canvas.clear(rect),
            DisposalMethod::Previous => canvas.restore(rect, saved.unwrap_or_default()),
            DisposalMethod::Any | DisposalMethod::Keep => {}
        }
    }
    Ok(kept)
}

/// A frame's rectangle on the canvas (it may reach past the canvas: what does is not drawn).
#[derive(Clone, Copy)]
struct Rect {
    left: u32,
    top: u32,
    width: u32,
    height: u32,
}

/// The logical screen, RGBA, transparent where nothing was drawn.
struct Canvas {
    image: RgbaImage,
}

impl Canvas {
    fn new(width: u32, height: u32) -> Self {
        Canvas {
            image: RgbaImage::new(width, height),
        }
    }

    /// The canvas pixels `rect` covers: `(x, y)` in the frame to `(x, y)` on the canvas.
    fn covered(&self, rect: Rect) -> impl Iterator<Item = (u32, u32, u32, u32)> + use<> {
        let (width, height) = self.image.dimensions();
        let columns = rect.width.min(width.saturating_sub(rect.left));
        let rows = rect.height.min(height.saturating_sub(rect.top));
        (0..rows).flat_map(move |y| (0..columns).map(move |x| (x, y, rect.left + x, rect.top + y)))
    }

    /// Draws a frame's RGBA `pixels` (its rectangle, row by row); transparent ones leave the
    /// canvas as it is.
    fn draw(&mut self, rect: Rect, pixels: &[u8]) {
        for (x, y, cx, cy) in self.covered(rect) {
            let at = 4 * (y as usize * rect.width as usize + x as usize);
            if let Some(&[r, g, b, a]) = pixels
                .get(at..at + 4)
                .and_then(|p| <&[u8; 4]>::try_from(p).ok())
                && a != 0
            {
                self.image.put_pixel(cx, cy, image::Rgba([r, g, b, a]));
            }
        }
    }

    fn copy(&self, rect: Rect) -> Vec<image::Rgba<u8>> {
        self.covered(rect)
            .map(|(_, _, cx, cy)| *self.image.get_pixel(cx, cy))
            .collect()
    }

    fn clear(&mut self, rect: Rect) {
        for (_, _, cx, cy) in self.covered(rect) {
            self.image.put_pixel(cx, cy, image::Rgba([0, 0, 0, 0]));
        }
    }

    fn restore(&mut self, rect: Rect, saved: Vec<image::Rgba<u8>>) {
        let spots: Vec<_> = self.covered(rect).collect();
        for ((_, _, cx, cy), pixel) in spots.into_iter().zip(saved) {
            self.image.put_pixel(cx, cy, pixel);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use image::AnimationDecoder;
    use image::codecs::gif::GifDecoder;

    use super::*;

    /// Palette: 0 red, 1 green, 2 blue, 3 white.
    const PALETTE: [u8; 12] = [255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255];

    /// A frame to write: (left, top, width, height), disposal, transparent index.
    type FrameSpec = ((u16, u16, u16, u16), DisposalMethod, Option<u8>);

    /// Writes a GIF of `frames` on a `width × height` screen; each frame's pixels cycle through
    /// the palette.
    fn write(path: &Path, width: u16, height: u16, frames: &[FrameSpec]) {
        let mut bytes = Vec::new();
        {
            let mut encoder = gif::Encoder::new(&mut bytes, width, height, &PALETTE).unwrap();
            for (i, &((left, top, w, h), dispose, transparent)) in frames.iter().enumerate() {
                let indices: Vec<u8> = (0..usize::from(w) * usize::from(h))
                    .map(|p| ((p / 3 + i) % 4) as u8)
                    .collect();
                let frame = gif::Frame {
                    left,
                    top,
                    width: w,
                    height: h,
                    dispose,
                    transparent,
                    delay: 4,
                    buffer: Cow::Owned(indices),
                    ..gif::Frame::default()
                };
                encoder.write_frame(&frame).unwrap();
            }
        }
        std::fs::write(path, bytes).unwrap();
    }

    /// Every frame as `image`'s decoder composites it, flattened the same way.
    fn reference(path: &Path) -> Vec<RgbImage> {
        let file = BufReader::new(File::open(path).unwrap());
        GifDecoder::new(file)
            .unwrap()
            .into_frames()
            .collect_frames()
            .unwrap()
            .into_iter()
            .map(|frame| to_rgb8(DynamicImage::ImageRgba8(frame.into_buffer())))
            .collect()
    }

    #[test]
    fn frames_composite_as_images_decoder_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gif");
        use DisposalMethod::{Any, Background, Keep, Previous};
        let frames = [
            ((0, 0, 12, 9), Keep, None),
            ((2, 1, 5, 4), Background, Some(1)),
            ((4, 3, 6, 5), Previous, Some(0)),
            ((1, 2, 7, 3), Keep, Some(3)),
            ((9, 6, 6, 6), Any, None), // reaches past the screen's corner
            ((0, 0, 3, 3), Previous, None),
            ((3, 3, 2, 2), Keep, None),
        ];
        write(&path, 12, 9, &frames);
        let expected = reference(&path);
        let scan = scan(&path, 1 << 20).unwrap();
        assert_eq!(scan.delays_ms, vec![40.0; frames.len()]);
        let wanted = [0, 1, 2, 2, 3, 4, 5, 6];
        let got = super::frames(&path, &scan, &wanted, 1 << 20).unwrap();
        assert_eq!(got.len(), wanted.len());
        for (image, &index) in got.iter().zip(&wanted) {
            assert_eq!(image, &expected[index], "frame {}", index + 1);
        }
        // Sampling only the last frame still plays the ones before it.
        let last = super::frames(&path, &scan, &[6], 1 << 20).unwrap();
        assert_eq!(last[0], expected[6]);
    }

    /// The GIF, smaller: many one-pixel frames on a large screen cost their pixels,
    /// not a screen each; frames that would decode more than the budget are refused first.
    #[test]
    fn a_clip_costs_the_pixels_it_decodes_within_a_budget() {
        let dir = tempfile::tempdir().unwrap();
        let dots = dir.path().join("dots.gif");
        let frames: Vec<_> = (0..300)
            .map(|i| ((i, i, 1, 1), DisposalMethod::Keep, None))
            .collect();
        write(&dots, 4000, 4000, &frames);
        let scan_dots = scan(&dots, 16_000_000).unwrap();
        assert_eq!(scan_dots.delays_ms.len(), 300);
        let start = std::time::Instant::now();
        let two = super::frames(&dots, &scan_dots, &[150, 299], 16_000_000).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].get_pixel(299, 299).0, [255, 255, 255]); // frame 300: (0 + 299) % 4 = 3
        // Compositing 300 whole screens (4.8 billion pixels) took tens of seconds; this is two.
        assert!(start.elapsed().as_secs() < 30);

        let full = dir.path().join("full.gif");
        let frames: Vec<_> = (0..20)
            .map(|_| ((0, 0, 100, 100), DisposalMethod::Keep, None))
            .collect();
        write(&full, 100, 100, &frames);
        let scan_full = scan(&full, 10_000).unwrap();
        // 16 images of 10 000 pixels: frames 1 to 15 and one canvas fit, frame 20 does not.
        assert!(super::frames(&full, &scan_full, &[14], 10_000).is_ok());
        let refused = super::frames(&full, &scan_full, &[19], 10_000).unwrap_err();
        assert!(
            refused.contains("frames 1 to 20") && refused.contains("--max-image-pixels"),
            "{refused}"
        );
        // A screen over the per-image limit is refused from the header.
        assert!(scan(&full, 9_999).unwrap_err().contains("100 × 100"));
    }
}
