//! JPEGs decoded by libjpeg-turbo's code (through the `mozjpeg` crate, built from C source with
//! no assembler), the library Pillow links: the same integer IDCT and "fancy" chroma upsampling,
//! so the same 8-bit pixels, which is what transformers' processors see.

use std::cell::Cell;
use std::io::{self, BufRead, Read};
use std::panic::{self, AssertUnwindSafe};

use image::metadata::Orientation;
use image::{DynamicImage, GrayImage, RgbImage};
use mozjpeg::{ColorSpace, Decompress, Marker};

use crate::decode::check_budget;

/// A JPEG decoded, before EXIF orientation and RGB conversion.
pub(crate) struct Jpeg {
    /// 8-bit grayscale or RGB pixels.
    pub image: DynamicImage,
    /// The EXIF orientation, identity when absent.
    pub orientation: Orientation,
}

/// Decodes a JPEG of 1, 3 or 4 components into 8-bit grayscale or RGB, as Pillow decodes it and
/// transformers converts it (`Image.convert("RGB")`): 4-component (CMYK, YCCK) files are read as
/// Adobe-inverted CMYK, Pillow's assumption, and converted with Pillow's formula. An image
/// declaring more than `max_pixels` is refused from its header; so is one whose file ends before
/// its end-of-image marker, as Pillow refuses it ("image file is truncated"), where libjpeg alone
/// would fill the missing rows with grey.
pub(crate) fn decode<R: BufRead>(file: R, max_pixels: u64) -> Result<Jpeg, String> {
    let ended = Cell::new(false);
    let reader = EndWatch {
        inner: file,
        ended: &ended,
    };
    // libjpeg reports fatal errors by unwinding (resume_unwind, no panic message) through its C
    // frames, built for it; they become this image's error.
    let decoded = panic::catch_unwind(AssertUnwindSafe(|| -> Result<Jpeg, String> {
        let decompress = Decompress::builder()
            .with_markers(&[Marker::APP(1)])
            .from_reader(reader)
            .map_err(|e| e.to_string())?;
        let (width, height) = (decompress.width() as u32, decompress.height() as u32);
        check_budget(width, height, max_pixels)?;
        let output = match decompress.color_space() {
            ColorSpace::JCS_GRAYSCALE => ColorSpace::JCS_GRAYSCALE,
            ColorSpace::JCS_YCbCr | ColorSpace::JCS_RGB => ColorSpace::JCS_RGB,
            ColorSpace::JCS_CMYK | ColorSpace::JCS_YCCK => ColorSpace::JCS_CMYK,
            _ => {
                let components = decompress.components().len();
                return Err(format!(
                    "{components}-component JPEGs are not images (Pillow refuses them too)"
                ));
            }
        };
        let orientation = decompress
            .markers()
            .find_map(|marker| marker.data.strip_prefix(b"Exif\0\0"))
            .and_then(Orientation::from_exif_chunk)
            .unwrap_or(Orientation::NoTransforms);
        let mut started = decompress
            .to_colorspace(output)
            .map_err(|e| e.to_string())?;
        let pixels = started.read_scanlines::<u8>().map_err(|e| e.to_string())?;
        started.finish().map_err(|e| e.to_string())?;
        if ended.get() {
            return Err("image file is truncated: it ends before its end-of-image marker".into());
        }
        let image = match output {
            ColorSpace::JCS_GRAYSCALE => {
                GrayImage::from_raw(width, height, pixels).map(DynamicImage::ImageLuma8)
            }
            ColorSpace::JCS_RGB => {
                RgbImage::from_raw(width, height, pixels).map(DynamicImage::ImageRgb8)
            }
            _ => RgbImage::from_raw(width, height, inverted_cmyk_to_rgb(&pixels))
                .map(DynamicImage::ImageRgb8),
        };
        let image = image.ok_or("libjpeg returned fewer pixels than the header declares")?;
        Ok(Jpeg { image, orientation })
    }));
    decoded.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "libjpeg failed".into());
        Err(message
            .trim_start_matches("libjpeg fatal error: ")
            .to_owned())
    })
}

/// Pillow's reading of a 4-component JPEG as RGB: each byte inverted (its "CMYK;I" raw mode),
/// then `cmyk2rgb` (`nk = 255 − k`, channel `nk − round(c·nk / 255)`, its exact `MULDIV255`).
fn inverted_cmyk_to_rgb(cmyk: &[u8]) -> Vec<u8> {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    cmyk.chunks_exact(4)
        .flat_map(|p| {
            let [c, m, y, k] = [p[0], p[1], p[2], p[3]].map(|v| u32::from(255 - v));
            let nk = 255 - k;
            [c, m, y].map(|v| (nk - muldiv255(v, nk)) as u8)
        })
        .collect()
}

/// A reader that notes when it is asked for bytes past the end of the file: libjpeg then fakes
/// an end-of-image marker and carries on, so this is how truncation shows.
struct EndWatch<'a, R> {
    inner: R,
    ended: &'a Cell<bool>,
}

impl<R: Read> Read for EndWatch<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<R: BufRead> BufRead for EndWatch<'_, R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let buf = self.inner.fill_buf()?;
        if buf.is_empty() {
            self.ended.set(true);
        }
        Ok(buf)
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jpeg");
        std::fs::read(dir.join(name)).unwrap()
    }

    fn decoded(bytes: &[u8]) -> Result<Jpeg, String> {
        decode(bytes, crate::DEFAULT_MAX_PIXELS)
    }

    /// Every prefix of a baseline and a progressive file is refused, as Pillow refuses it, and
    /// none panics; the whole file decodes.
    #[test]
    fn truncated_files_are_refused_at_every_length() {
        for name in ["q75-420.jpg", "gray-q80-progressive.jpg"] {
            let bytes = fixture(name);
            assert!(decoded(&bytes).is_ok(), "{name}");
            for length in 0..bytes.len() {
                let err = decoded(&bytes[..length]).err();
                assert!(err.is_some(), "{name} cut to {length} bytes was accepted");
            }
            // Only the end marker missing: every pixel is there, and still Pillow refuses it.
            let err = decoded(&bytes[..bytes.len() - 2]).err().unwrap_or_default();
            assert!(err.contains("image file is truncated"), "{name}: {err}");
        }
    }

    /// Bytes flipped inside the entropy-coded data or the headers give an error or an image,
    /// never a panic or an abort.
    #[test]
    fn corrupted_files_never_panic() {
        let bytes = fixture("q85-420-progressive.jpg");
        for (i, flip) in (0..bytes.len())
            .step_by(7)
            .zip([0xFFu8, 0x01, 0x80].iter().cycle())
        {
            let mut damaged = bytes.clone();
            damaged[i] ^= flip;
            let _ = decoded(&damaged);
        }
    }

    /// A header declaring 65 000 × 65 000 pixels is refused before libjpeg allocates for it.
    #[test]
    fn a_jpeg_bomb_is_refused_from_its_header() {
        let mut bytes = fixture("q90-444.jpg");
        let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        bytes[sof + 5..sof + 9].copy_from_slice(&[0xFD, 0xE8, 0xFD, 0xE8]);
        let err = decoded(&bytes).err().unwrap_or_default();
        assert!(err.starts_with("declares 65000 × 65000 pixels"), "{err}");
    }

    #[test]
    fn exif_orientation_is_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/processors/images");
        let bytes = std::fs::read(dir.join("rotated.jpg")).unwrap();
        let jpeg = decoded(&bytes).unwrap();
        assert_eq!(
            Some(jpeg.orientation),
            Orientation::from_exif(6),
            "as Pillow reads it"
        );
    }
}
