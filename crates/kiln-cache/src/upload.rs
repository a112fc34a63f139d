//! Moving cached 8-bit pixels to a device: rescale and normalisation happen there, in the compute
//! dtype, so the host never holds a float copy of the dataset.

use burn::tensor::backend::{Backend, DTypeUsage};
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use kiln_core::{Precision, is_host_backend};

use crate::preprocess::Preprocess;
use crate::store::Stored;

/// Moves 8-bit `[n, 3, H, W]` `pixels` to `device` with `preprocess`'s rescale and
/// normalisation applied in f32 (normalisation is in kiln-core's keep-in-f32 set), and
/// returns the batch in `precision`.
///
/// On accelerators with u8 storage the bytes travel as u8 (4× less than f32) and the affine map
/// runs on the device. On host backends (Flex, NdArray), and on devices without u8 storage
/// (wgpu), a per-channel lookup table maps the bytes straight to f32 on the host, which is cheaper
/// there than the backend's broadcast arithmetic; both give the same values.
///
/// # Panics
/// If `pixels` does not hold `shape`'s elements.
pub fn normalize_on_device<B: Backend>(
    preprocess: &Preprocess,
    pixels: Vec<u8>,
    shape: [usize; 4],
    device: &B::Device,
    precision: Precision,
) -> Tensor<B, 4> {
    PreparedPixels::new::<B>(preprocess, pixels, shape, device).upload(device, precision)
}

/// [`normalize_on_device`] in two halves: the host's part (for host backends the whole
/// normalisation) in [`PreparedPixels::new`], which a background thread can run while the
/// device computes, then [`PreparedPixels::upload`].
///
/// ```
/// use burn::backend::Flex;
/// use kiln_cache::{PreparedPixels, Preprocess};
/// use kiln_core::Precision;
///
/// let device = Default::default();
/// let preprocess = Preprocess::clip(2);
/// let prepared = PreparedPixels::new::<Flex>(&preprocess, vec![255; 12], [1, 3, 2, 2], &device);
/// let pixels = std::thread::spawn(move || prepared).join().unwrap();
/// assert_eq!(pixels.upload::<Flex>(&device, Precision::F32).dims(), [1, 3, 2, 2]);
/// ```
#[derive(Debug)]
pub struct PreparedPixels {
    batch: HostBatch,
    affine: ([f32; 3], [f32; 3]),
}

impl PreparedPixels {
    /// 8-bit `[n, 3, H, W]` `pixels` made ready for `device` with `preprocess`'s rescale and
    /// normalisation.
    ///
    /// # Panics
    /// If `pixels` does not hold `shape`'s elements.
    pub fn new<B: Backend>(
        preprocess: &Preprocess,
        pixels: Vec<u8>,
        shape: [usize; 4],
        device: &B::Device,
    ) -> Self {
        assert_eq!(pixels.len(), shape.iter().product::<usize>(), "{shape:?}");
        let affine = preprocess.affine();
        let on_host = normalises_on_host::<B>(device);
        PreparedPixels {
            batch: HostBatch::prepare(affine, Stored::U8, pixels, shape, on_host),
            affine,
        }
    }

    /// The pixels on `device` in `precision` (the device given to [`PreparedPixels::new`]).
    pub fn upload<B: Backend>(self, device: &B::Device, precision: Precision) -> Tensor<B, 4> {
        self.batch.upload(self.affine, device, precision)
    }
}

/// Whether batches for `device` are normalised on the host (through the lookup table) rather
/// than uploaded as bytes and mapped on the device.
pub(crate) fn normalises_on_host<B: Backend>(device: &B::Device) -> bool {
    is_host_backend::<B>(device) || !B::dtype_usage(device, DType::U8).contains(DTypeUsage::Storage)
}

/// A batch made ready on the host (gathered, and normalised where that happens on the host), so
/// that a background thread can do this part while the device computes.
#[derive(Debug)]
pub(crate) enum HostBatch {
    /// Normalised values, f32.
    Values(Vec<f32>, [usize; 4]),
    /// 8-bit values, normalised on the device.
    Bytes(Vec<u8>, [usize; 4]),
}

impl HostBatch {
    /// Prepares `bytes` (stored as `stored`, `shape` values) for a device that normalises on
    /// the host (`on_host`) or not.
    pub(crate) fn prepare(
        affine: ([f32; 3], [f32; 3]),
        stored: Stored,
        bytes: Vec<u8>,
        shape: [usize; 4],
        on_host: bool,
    ) -> Self {
        match stored {
            Stored::U8 if on_host => {
                HostBatch::Values(normalise_bytes(affine, &bytes, shape), shape)
            }
            Stored::U8 => HostBatch::Bytes(bytes, shape),
            Stored::F16 => HostBatch::Values(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                shape,
            ),
            Stored::F32 => HostBatch::Values(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                shape,
            ),
        }
    }

    /// Uploads the batch, finishes the normalisation where it happens on the device, and casts
    /// to `precision`.
    pub(crate) fn upload<B: Backend>(
        self,
        affine: ([f32; 3], [f32; 3]),
        device: &B::Device,
        precision: Precision,
    ) -> Tensor<B, 4> {
        let normalised = match self {
            HostBatch::Values(values, shape) => {
                Tensor::from_data(TensorData::new(values, shape), (device, DType::F32))
            }
            HostBatch::Bytes(bytes, shape) => normalise_on_device(
                Tensor::from_data(TensorData::new(bytes, shape), (device, DType::U8)),
                affine,
            ),
        };
        normalised.cast(precision.float_dtype())
    }
}

/// The affine map through a per-channel table of the 256 byte values: f32 values of `bytes`
/// (`[n, 3, H, W]`).
pub(crate) fn normalise_bytes(
    (scale, offset): ([f32; 3], [f32; 3]),
    bytes: &[u8],
    shape: [usize; 4],
) -> Vec<f32> {
    let plane = shape[2] * shape[3];
    let tables: [[f32; 256]; 3] =
        std::array::from_fn(|c| std::array::from_fn(|v| v as f32 * scale[c] + offset[c]));
    let mut values = Vec::with_capacity(bytes.len());
    for (i, channel) in bytes.chunks_exact(plane).enumerate() {
        let table = &tables[i % 3];
        values.extend(channel.iter().map(|&v| table[usize::from(v)]));
    }
    values
}

/// The affine map on the device: u8 `bytes` (`[n, 3, H, W]`) widened to f32 and mapped.
pub(crate) fn normalise_on_device<B: Backend>(
    bytes: Tensor<B, 4, Int>,
    (scale, offset): ([f32; 3], [f32; 3]),
) -> Tensor<B, 4> {
    let device = bytes.device();
    let values: Tensor<B, 4> = bytes.cast(FloatDType::F32);
    let per_channel = |v: [f32; 3]| {
        Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [3]), (&device, DType::F32))
            .reshape([1, 3, 1, 1])
    };
    values * per_channel(scale) + per_channel(offset)
}

/// Interleaved RGB (`H × W × 3`) to planar (`3 × H × W`), the layout models take.
pub fn to_chw(image: &image::RgbImage) -> Vec<u8> {
    let plane = (image.width() * image.height()) as usize;
    let mut chw = vec![0u8; 3 * plane];
    for (i, pixel) in image.pixels().enumerate() {
        for (c, value) in pixel.0.into_iter().enumerate() {
            chw[c * plane + i] = value;
        }
    }
    chw
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    /// The device path runs where u8 storage exists (CUDA); Flex stores u8 too, so both paths
    /// can be compared here.
    #[test]
    fn table_and_device_paths_agree() {
        let device = Default::default();
        let shape = [2, 3, 4, 5];
        let pixels: Vec<u8> = (0..120).map(|i| (i * 53 % 256) as u8).collect();
        let affine = Preprocess::clip(4).affine();
        let table = normalise_bytes(affine, &pixels, shape);
        let bytes = Tensor::<Flex, 4, Int>::from_data(
            TensorData::new(pixels.clone(), shape),
            (&device, DType::U8),
        );
        let direct: Vec<f32> = normalise_on_device(bytes, affine)
            .into_data()
            .to_vec()
            .unwrap();
        let worst = table
            .iter()
            .zip(&direct)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= 1e-6, "{worst}");
        // Channel 1 of image 1, pixel 0: the 4th plane.
        let (scale, offset) = affine;
        assert_eq!(
            table[4 * 20],
            f32::from(pixels[4 * 20]) * scale[1] + offset[1]
        );
    }
}
