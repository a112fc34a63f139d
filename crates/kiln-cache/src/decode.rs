//! Decoding image files into 8-bit RGB the way transformers' processors see them: EXIF
//! orientation applied, grayscale replicated, 16-bit rounded to 8, transparency composited onto
//! white (transformers' `convert_to_rgb`).

use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage, RgbaImage};

use crate::CacheError;
use crate::jpeg::{self, Jpeg};

/// File extensions read from folders (lower case).
pub const IMAGE_EXTENSIONS: [&str; 6] = ["png", "jpg", "jpeg", "webp", "bmp", "gif"];

/// The most pixels an image may declare before it is decoded: Pillow's limit (twice its
/// `Image.MAX_IMAGE_PIXELS`, beyond which it raises `DecompressionBombError`). A few kilobytes of
/// PNG can declare 30 000 × 30 000 pixels, gigabytes once decoded.
pub const DEFAULT_MAX_PIXELS: u64 = 2 * 89_478_485;

/// Decodes the image at `path` (its format guessed from its bytes) into 8-bit RGB; an image
/// that declares more than `max_pixels` pixels is refused before any pixel is decoded. JPEGs go
/// through libjpeg-turbo's decoder, as in Pillow (see [`crate::jpeg`]).
pub fn decode(path: &Path, max_pixels: u64) -> Result<RgbImage, CacheError> {
    let bad = |reason: String| CacheError::BadImage {
        path: path.to_path_buf(),
        reason,
    };
    let reader = ImageReader::open(path)
        .map_err(|e| CacheError::io(path, e))?
        .with_guessed_format()
        .map_err(|e| CacheError::io(path, e))?;
    if reader.format() == Some(ImageFormat::Jpeg) {
        // The format guess read the file's first bytes and seeked back to its start.
        let Jpeg {
            mut image,
            orientation,
        } = jpeg::decode(reader.into_inner(), max_pixels).map_err(bad)?;
        image.apply_orientation(orientation);
        return Ok(to_rgb8(image));
    }
    let mut decoder = reader.into_decoder().map_err(|e| bad(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    check_budget(width, height, max_pixels).map_err(bad)?;
    let orientation = decoder.orientation().map_err(|e| bad(e.to_string()))?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(|e| bad(e.to_string()))?;
    image.apply_orientation(orientation);
    Ok(to_rgb8(image))
}

/// Refuses an image (or video frame) that declares `width × height` pixels, more than
/// `max_pixels`, saying how to raise the limit.
pub(crate) fn check_budget(width: u32, height: u32, max_pixels: u64) -> Result<(), String> {
    if u64::from(width) * u64::from(height) <= max_pixels {
        return Ok(());
    }
    Err(format!(
        "declares {width} × {height} pixels, more than the {max_pixels} an image may have (a \
         decompression bomb?); raise the limit if the image is real (`--max-image-pixels`, \
         `ImageCache::max_image_pixels`)"
    ))
}

/// 8-bit RGB: alpha composited onto white, everything else converted by `image` (16-bit values
/// `v` become `round(v / 257)`, grayscale is replicated).
pub fn to_rgb8(image: DynamicImage) -> RgbImage {
    if image.color().has_alpha() {
        composite_on_white(&image.into_rgba8())
    } else {
        image.into_rgb8()
    }
}

/// `c·a + 255·(1 − a)` per channel, rounded: Pillow's `alpha_composite` over an opaque white
/// background.
fn composite_on_white(rgba: &RgbaImage) -> RgbImage {
    RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let a = u32::from(a);
        let blend = |c: u8| ((u32::from(c) * a + 255 * (255 - a) + 127) / 255) as u8;
        image::Rgb([blend(r), blend(g), blend(b)])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transparency_becomes_white_and_opacity_keeps_the_colour() {
        let rgba =
            RgbaImage::from_raw(3, 1, vec![10, 20, 30, 0, 10, 20, 30, 255, 0, 100, 200, 128])
                .unwrap();
        let rgb = composite_on_white(&rgba);
        assert_eq!(rgb.get_pixel(0, 0).0, [255, 255, 255]);
        assert_eq!(rgb.get_pixel(1, 0).0, [10, 20, 30]);
        // (0·128 + 255·127) / 255 = 127; (100·128 + 255·127) / 255 = 177.2; 200 → 227.4
        assert_eq!(rgb.get_pixel(2, 0).0, [127, 177, 227]);
    }

    #[test]
    fn sixteen_bit_rounds_to_eight() {
        let deep =
            image::ImageBuffer::<image::Luma<u16>, _>::from_raw(4, 1, vec![0u16, 128, 129, 65535])
                .unwrap();
        let rgb = to_rgb8(DynamicImage::ImageLuma16(deep));
        let values: Vec<u8> = rgb.pixels().map(|p| p.0[0]).collect();
        // round(v / 257): 0, 0.498 -> 0, 0.502 -> 1, 255
        assert_eq!(values, [0, 0, 1, 255]);
        assert!(rgb.pixels().all(|p| p.0[0] == p.0[1] && p.0[1] == p.0[2]));
    }
}
