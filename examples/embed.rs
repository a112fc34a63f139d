//! Embeds images with a Hugging Face vision checkpoint (CLIP, SigLIP / SigLIP2, DINOv2) and writes
//! the embeddings as safetensors.
//!
//! ```text
//! cargo run --release --example embed -- --model-dir clip-vit-base-patch32 --images photos/ \
//!     --out embeddings.safetensors [--device cpu] [--batch 32] [--policy full] [--save-pixels] \
//!     [--normalize] [--residency device|host]
//! cargo run --release --example embed -- --model-dir DIR --pixels pixels.safetensors --out FILE
//! ```
//!
//! `--model-dir` takes a Hugging Face id too when kiln is built with the `hub` feature
//! (`--features hub`). `--images` decodes and preprocesses with the directory's `preprocessor_config.json` through
//! kiln-cache (once: later runs read the cache), in sorted file order. `--pixels` reads
//! `pixel_values` `[N, 3, H, W]` f32, already normalised. The output holds `embeddings` `[N, D]`
//! f32 (CLIP: image_embeds, SigLIP and DINOv2: pooler_output) and, with `--save-pixels`, the
//! `pixel_values` fed to the model.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use clap::Parser;
use kiln::burn;
use kiln::cache::{DeviceImages, ImageCache, ImageSource, Order, Preprocess, Residency};
use kiln::core::checkpoint_dir;
use kiln::core::{DeviceJob, DeviceSpec, PolicySpec, Precision};
use kiln::vision::VisionModel;

/// mimalloc, keeping the memory it frees for the next step (docs/PERFORMANCE.md).
#[path = "shared/allocator.rs"]
mod allocator;

/// Embed images with a vision checkpoint.
#[derive(Parser)]
struct Args {
    /// A Hugging Face model directory (config.json, model.safetensors or its index,
    /// preprocessor_config.json for --images); with the `hub` feature, also a model id
    /// (org/name[@revision]), fetched into the Hugging Face cache.
    #[arg(long)]
    model_dir: String,
    /// A folder of images (PNG, JPEG, WebP, BMP, GIF), read recursively in path order.
    #[arg(long, conflicts_with = "pixels", required_unless_present = "pixels")]
    images: Option<PathBuf>,
    /// A safetensors file with `pixel_values` [N, 3, H, W] f32, already normalised.
    #[arg(long)]
    pixels: Option<PathBuf>,
    /// Where to write the embeddings.
    #[arg(long)]
    out: PathBuf,
    /// cpu, ndarray, wgpu, vulkan, metal, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Images per forward pass.
    #[arg(long, default_value_t = 32, value_parser = kiln::cli::count, allow_negative_numbers = true)]
    batch: usize,
    /// Precision policy: full, mixed-f16, mixed-bf16, pure-f16, a dtype, or p=..,c=..,o=...
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// Also write the `pixel_values` fed to the model.
    #[arg(long)]
    save_pixels: bool,
    /// L2-normalise each embedding.
    #[arg(long)]
    normalize: bool,
    /// Keep the cached images on the device or stream them (default: planned from the sizes).
    #[arg(long)]
    residency: Option<Residency>,
    /// The most pixels an image may declare (Pillow's limit by default); larger ones are
    /// refused before decoding, as decompression bombs.
    #[arg(long, default_value_t = kiln::cache::DEFAULT_MAX_PIXELS)]
    max_image_pixels: u64,
}

impl DeviceJob for Args {
    type Output = Result<(), String>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = self
            .policy
            .resolve::<B>(device)
            .map_err(|e| e.to_string())?;
        let model = VisionModel::<B>::from_hf_dir(&self.model_dir, device, &policy)
            .map_err(|e| e.to_string())?;
        // Batches are produced while the model runs: streamed from the cache, or sliced.
        let feed;
        let batches: Box<dyn Iterator<Item = Tensor<B, 4>>> = match (&self.images, &self.pixels) {
            (Some(images), _) => {
                feed = cached_feed::<B>(&self, images, device, policy.compute)?;
                Box::new(
                    feed.batches(self.batch, Order::Sequential)
                        .map(|b| b.pixels),
                )
            }
            (None, Some(pixels)) => {
                let all = read_pixels::<B>(pixels, device)?;
                model
                    .check_pixels(all.dims())
                    .map_err(|e| format!("{}: {e}", pixels.display()))?;
                let (count, batch) = (all.dims()[0], self.batch.max(1));
                Box::new(
                    (0..count)
                        .step_by(batch)
                        .map(move |first| all.clone().narrow(0, first, batch.min(count - first))),
                )
            }
            (None, None) => return Err("give --images DIR or --pixels FILE".into()),
        };
        B::sync(device).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let (mut embeddings, mut fed) = (Vec::new(), Vec::new());
        for pixels in batches {
            // Images come in the processor's size, which may not be the model's.
            model
                .check_pixels(pixels.dims())
                .map_err(|e| e.to_string())?;
            if self.save_pixels {
                fed.push(pixels.clone().cast(FloatDType::F32));
            }
            let embedded = policy.cast_output(model.forward(policy.cast_input(pixels)));
            let embedded = embedded.cast(FloatDType::F32);
            embeddings.push(if self.normalize {
                let norm = embedded.clone().powi_scalar(2).sum_dim(1).sqrt();
                embedded / norm
            } else {
                embedded
            });
        }
        let embeddings = Tensor::cat(embeddings, 0).into_data();
        let seconds = start.elapsed().as_secs_f64();
        let images = embeddings.shape[0];
        eprintln!(
            "{images} images in {seconds:.2} s: {:.1} images/s on {} (input and forward)",
            images as f64 / seconds,
            self.device
        );
        let mut tensors = vec![("embeddings", embeddings)];
        if self.save_pixels {
            tensors.push(("pixel_values", Tensor::cat(fed, 0).into_data()));
        }
        write(&self.out, tensors)
    }
}

/// The folder's images through the model directory's processor and kiln-cache, bound to the
/// device as the residency plan (printed) says.
fn cached_feed<B: Backend>(
    args: &Args,
    images: &Path,
    device: &B::Device,
    precision: Precision,
) -> Result<DeviceImages<B>, String> {
    let preprocess =
        Preprocess::from_hf_config(Path::new(&args.model_dir).join("preprocessor_config.json"))
            .map_err(|e| e.to_string())?;
    let cached = ImageCache::new(ImageCache::default_dir())
        .max_image_pixels(args.max_image_pixels)
        .load(&ImageSource::Folder(images.into()), &preprocess)
        .map_err(|e| e.to_string())?;
    eprintln!(
        "{} images ({:?}: {})",
        cached.len(),
        cached.outcome(),
        cached.dir().display()
    );
    let memory = args.device.probe().ok().and_then(|h| h.memory_bytes);
    let plan = cached.plan_residency::<B>(device, precision, 0, memory, args.residency);
    eprintln!("{plan}");
    Ok(cached.to_device::<B>(device, precision, plan.residency))
}

/// `pixel_values` `[N, 3, H, W]` f32 of a safetensors file, on the device.
fn read_pixels<B: Backend>(path: &Path, device: &B::Device) -> Result<Tensor<B, 4>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let bytes = std::fs::read(path).map_err(|e| fail(&e))?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| fail(&e))?;
    let view = tensors.tensor("pixel_values").map_err(|e| fail(&e))?;
    let shape: [usize; 4] = view.shape().try_into().map_err(|_| {
        fail(&format!(
            "pixel_values is {:?}, expected [N, 3, H, W]",
            view.shape()
        ))
    })?;
    if view.dtype() != safetensors::Dtype::F32 {
        return Err(fail(&format!(
            "pixel_values is {:?}, expected F32",
            view.dtype()
        )));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Tensor::from_data(TensorData::new(values, shape), device))
}

/// Writes f32 `tensors` to `path`, whole or not at all.
fn write(path: &Path, tensors: Vec<(&str, TensorData)>) -> Result<(), String> {
    let views = tensors
        .iter()
        .map(|(name, data)| {
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                data.shape.to_vec(),
                data.as_bytes(),
            )
            .map(|view| (name.to_string(), view))
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| e.to_string())?;
    kiln::io::write_atomic(path, &bytes).map_err(|e| e.to_string())
}

/// Refuses an `--out` that is one of the inputs, lies in the model directory or is not a
/// regular file, before any work.
fn check_output(args: &Args) -> Result<(), String> {
    let mut files =
        kiln::io::RunFiles::new().input("the model directory (--model-dir)", &args.model_dir);
    if let Some(images) = &args.images {
        files = files.input("the images (--images)", images);
    }
    if let Some(pixels) = &args.pixels {
        files = files.input("the pixels (--pixels)", pixels);
    }
    files
        .output("--out", &args.out)
        .output_dir(
            "the image cache ($KILN_CACHE_DIR)",
            kiln::cache::ImageCache::default_dir(),
        )
        .check()
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    kiln::log_to_stderr();
    let mut args = Args::parse();
    let device = args.device;
    let result = checkpoint_dir(&args.model_dir)
        .map_err(|e| e.to_string())
        .and_then(|dir| {
            args.model_dir = dir.display().to_string();
            check_output(&args)?;
            device.run(args).map_err(|e| e.to_string())
        })
        .and_then(|r| r);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
