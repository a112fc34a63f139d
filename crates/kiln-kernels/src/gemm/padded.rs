//! A convolution's input as AMX reads it in place: an NHWC image rounded to bf16 once, with a
//! border of zeros, so that each 16-row tile of a convolution's windows (16 neighbouring output
//! pixels, 32 channels of one tap) is 16 rows of 64 bytes a fixed stride apart in memory. A
//! window's values are then never packed: a 3 × 3 convolution's windows hold every pixel nine
//! times, and packing them was most of the U-Net's rounding and copying.

use rayon::prelude::*;

use super::bf16::{K_STEP, TILE};
use super::lines::Lines;
use crate::host::conv::{Nhwc, Windows};

/// An NHWC image in bf16 with `border` zero pixels on every side.
#[derive(Debug)]
pub struct PaddedImage {
    values: Lines<u16>,
    /// The image's own `[batch, height, width, channels]`.
    shape: Nhwc,
    border: usize,
}

impl PaddedImage {
    /// `x` (NHWC `shape`) rounded to bf16, inside a border of `border` zero pixels.
    ///
    /// Panics when `x` is not of `shape`.
    pub fn new(x: &[f32], shape: Nhwc, border: usize) -> PaddedImage {
        let [batch, height, width, channels] = shape;
        assert_eq!(
            x.len(),
            batch * height * width * channels,
            "PaddedImage: shape"
        );
        let [padded_height, padded_width] = [height, width].map(|size| size + 2 * border);
        let row = padded_width * channels;
        let mut values = Lines::zeros(batch * padded_height * row);
        (values.par_chunks_mut(row.max(1)).enumerate()).for_each(|(line, to)| {
            let y = line % padded_height;
            if (border..border + height).contains(&y) && width > 0 {
                let b = line / padded_height;
                let from = &x[(b * height + y - border) * width * channels..][..width * channels];
                super::bf16::round_row(from, &mut to[border * channels..][..width * channels]);
            }
        });
        PaddedImage {
            values,
            shape,
            border,
        }
    }

    /// The image all of `windows` read (one convolution's, or a transposed convolution's
    /// phases), padded for [`super::bf16::image_product`] to read each of them in place, where
    /// AMX is the chosen instruction set and the image and the windows have the shapes
    /// [`Self::serves`] asks; else `None` (their windows are then packed).
    pub fn for_windows(windows: &[&Windows]) -> Option<PaddedImage> {
        let first = windows.first()?;
        let fits = |w: &&Windows| {
            std::ptr::eq(w.x, first.x)
                && w.shape == first.shape
                && w.shape[3].is_multiple_of(K_STEP)
                && w.out[1].is_multiple_of(TILE)
        };
        if super::Bf16Isa::chosen() != Some(super::Bf16Isa::Amx) || !windows.iter().all(fits) {
            return None;
        }
        let border = windows.iter().map(|w| Self::border_for(w)).max()?;
        Some(PaddedImage::new(first.x, first.shape, border))
    }

    /// The border `windows` need around their image: how far the taps reach outside it.
    pub fn border_for(windows: &Windows) -> usize {
        (0..2)
            .map(|a| {
                let first = -windows.origin[a];
                let reach = windows.origin[a]
                    + ((windows.out[a].max(1) - 1) * windows.stride[a] + windows.kernel[a])
                        as isize
                    - windows.shape[1 + a] as isize;
                first.max(reach).max(0) as usize
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether a product of `windows` reads this image in place: the windows' image, channels
    /// in whole tile rows (32), output rows in whole tiles (16 pixels), taps inside the border.
    pub fn serves(&self, windows: &Windows) -> bool {
        windows.shape == self.shape
            && self.shape[3].is_multiple_of(K_STEP)
            && windows.out[1].is_multiple_of(TILE)
            && Self::border_for(windows) <= self.border
    }

    /// Bytes from one tile row to the next: an output pixel's step along its row.
    pub(super) fn row_stride(&self, windows: &Windows) -> usize {
        windows.stride[1] * self.shape[3] * size_of::<u16>()
    }

    /// Where `windows`' tiles lie: for output pixel `pixel` (a row of the product), where its
    /// first value lies, and for each inner-dimension step (32 values of the windows' rows: a
    /// tap's channels `32 s ..`), how far that step's values lie past it. The two add up, so a
    /// block's tiles are found with one addition a step (computing each address whole took
    /// integer divisions a tile, more time than the tile's products).
    pub(super) fn tile_rows<'a>(&'a self, windows: &'a Windows) -> TileRows<'a> {
        let [_, height, width, channels] = self.shape;
        let [padded_height, padded_width] = [height, width].map(|size| size + 2 * self.border);
        let chunks = channels / K_STEP;
        let kernel_width = windows.kernel[1];
        let steps = windows.kernel[0] * kernel_width * chunks;
        let offsets = (0..steps)
            .map(|step| {
                let (tap, chunk) = (step / chunks, step % chunks);
                let (ky, kx) = (tap / kernel_width, tap % kernel_width);
                (ky * padded_width + kx) * channels + chunk * K_STEP
            })
            .collect();
        TileRows {
            values: self.values.as_ptr(),
            windows,
            padded: [padded_height, padded_width],
            channels,
            border: self.border as isize,
            offsets,
        }
    }
}

/// [`PaddedImage::tile_rows`]: each output pixel's first value, each step's offset from it.
pub(super) struct TileRows<'a> {
    values: *const u16,
    windows: &'a Windows<'a>,
    padded: [usize; 2],
    channels: usize,
    border: isize,
    /// Each step's values past the pixel's first value.
    pub(super) offsets: Vec<usize>,
}

impl TileRows<'_> {
    /// Where output pixel `pixel`'s first value (its window's first tap, first channel) lies.
    pub(super) fn pixel(&self, pixel: usize) -> *const u16 {
        let windows = self.windows;
        let [out_height, out_width] = windows.out;
        let (b, oy, ox) = (
            pixel / (out_height * out_width),
            pixel / out_width % out_height,
            pixel % out_width,
        );
        // Inside the padded image: `serves` checked that every tap lies in the border.
        let y = (windows.origin[0] + (oy * windows.stride[0]) as isize + self.border) as usize;
        let x = (windows.origin[1] + (ox * windows.stride[1]) as isize + self.border) as usize;
        let [padded_height, padded_width] = self.padded;
        (self.values).wrapping_add(((b * padded_height + y) * padded_width + x) * self.channels)
    }
}
