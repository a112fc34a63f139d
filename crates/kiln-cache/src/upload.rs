//! Moving cached 8-bit pixels to a device: rescale and normalisation happen there, in the compute
//! dtype, so the host never holds a float copy of the dataset.

use burn::tensor::backend::{Backend, DTypeUsage};
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use kiln_precision::{Precision, is_host_backend};

use crate::preprocess::Preprocess;

/// Moves 8-bit `[n, 3, H, W]` `pixels` to `device` with `preprocess`'s rescale and
/// normalisation applied in f32 (normalisation is in kiln-precision's keep-in-f32 set), and
/// returns the batch in `precision`.
///
/// On accelerators the bytes travel as u8 (4× less than f32) and the affine map runs on the
/// device. On host backends (Flex, NdArray) a per-channel lookup table maps the bytes straight to
/// f32, which is cheaper there than the backend's broadcast arithmetic; both give the same values.
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
    assert_eq!(pixels.len(), shape.iter().product::<usize>(), "{shape:?}");
    let affine = preprocess.affine();
    let stores_u8 = B::dtype_usage(device, DType::U8).contains(DTypeUsage::Storage);
    let normalised = if is_host_backend::<B>(device) || !stores_u8 {
        through_table::<B>(affine, pixels, shape, device)
    } else {
        on_device::<B>(affine, pixels, shape, device)
    };
    normalised.cast(precision.float_dtype())
}

/// The affine map through a per-channel table of the 256 byte values, on the host; the f32
/// result is uploaded.
fn through_table<B: Backend>(
    (scale, offset): ([f32; 3], [f32; 3]),
    pixels: Vec<u8>,
    shape: [usize; 4],
    device: &B::Device,
) -> Tensor<B, 4> {
    let plane = shape[2] * shape[3];
    let tables: [[f32; 256]; 3] =
        std::array::from_fn(|c| std::array::from_fn(|v| v as f32 * scale[c] + offset[c]));
    let mut values = Vec::with_capacity(pixels.len());
    for (i, channel) in pixels.chunks_exact(plane).enumerate() {
        let table = &tables[i % 3];
        values.extend(channel.iter().map(|&v| table[usize::from(v)]));
    }
    Tensor::from_data(TensorData::new(values, shape), (device, DType::F32))
}

/// The bytes uploaded as u8, widened and mapped on the device.
fn on_device<B: Backend>(
    (scale, offset): ([f32; 3], [f32; 3]),
    pixels: Vec<u8>,
    shape: [usize; 4],
    device: &B::Device,
) -> Tensor<B, 4> {
    let bytes = TensorData::new(pixels, shape);
    let values: Tensor<B, 4> =
        Tensor::<B, 4, Int>::from_data(bytes, (device, DType::U8)).cast(FloatDType::F32);
    let per_channel = |v: [f32; 3]| {
        Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [3]), (device, DType::F32))
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
        let byte = |i: usize| (i * 53 % 256) as u8;
        let pixels: Vec<u8> = (0..120).map(byte).collect();
        let affine = Preprocess::clip(4).affine();
        let table = through_table::<Flex>(affine, pixels.clone(), shape, &device);
        let direct = on_device::<Flex>(affine, pixels, shape, &device);
        let table: Vec<f32> = table.into_data().to_vec().unwrap();
        let direct: Vec<f32> = direct.into_data().to_vec().unwrap();
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
            f32::from(pixels_at(4 * 20)) * scale[1] + offset[1]
        );
    }

    fn pixels_at(i: usize) -> u8 {
        (i * 53 % 256) as u8
    }
}
