//! The models of a run: presets of released architectures with random weights, or checkpoint
//! directories; each loaded with its dataset cached and bound to the device.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::backend::Backend;
use kiln::burn;
use kiln::cache::{CachedImages, DeviceImages, ImageCache, ImageSource, Preprocess, Residency};
use kiln::core::{Policy, checkpoint_dir, is_host_backend, weights_identity};
use kiln::mc::{batch_rows, preprocess};
use kiln::vision::{DropoutSites, Preset, VisionConfig, VisionModel};

use crate::Args;
use crate::report::Clock;

/// A model to run: its name (which enters the trial seeds), how its images are preprocessed,
/// its architecture and where its weights come from.
pub struct ModelSpec {
    pub name: String,
    pub config: VisionConfig,
    pub preprocess: Preprocess,
    /// A checkpoint directory, or `None` for random weights.
    pub dir: Option<PathBuf>,
}

impl ModelSpec {
    /// A released architecture with random weights (kiln-vision's presets).
    pub fn preset(name: &str) -> Result<Self, String> {
        let preset = Preset::named(name).map_err(|e| format!("{e} (or give --model-dir)"))?;
        Ok(ModelSpec {
            name: name.to_string(),
            config: preset.config,
            preprocess: preprocess(preset.processor),
            dir: None,
        })
    }

    /// A checkpoint directory (or hub id): its config and processor are read now, so a
    /// directory that cannot load fails before any long work.
    pub fn checkpoint(model: &str) -> Result<Self, String> {
        let dir = checkpoint_dir(model).map_err(|e| e.to_string())?;
        let config = VisionConfig::from_hf_config(&dir).map_err(|e| e.to_string())?;
        let preprocess = Preprocess::from_hf_config(dir.join("preprocessor_config.json"))
            .map_err(|e| format!("{model}: {e}"))?;
        let base = Path::new(model.trim_end_matches('/'))
            .file_name()
            .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
        let name = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        Ok(ModelSpec {
            name,
            config,
            preprocess,
            dir: Some(dir),
        })
    }

    /// What identifies the weights: the checkpoint's path, size and modification time, or the
    /// random initialisation's seed.
    pub fn weights_id(&self, seed: u64) -> String {
        match &self.dir {
            None => format!("random init, seed {seed}"),
            Some(dir) => weights_identity(dir),
        }
    }

    /// The model on `device` under `policy`, with the dropout sites.
    pub fn load<B: Backend>(
        &self,
        device: &B::Device,
        policy: &Policy,
        dropout: DropoutSites,
        seed: u64,
    ) -> Result<VisionModel<B>, String> {
        let model = match &self.dir {
            Some(dir) => {
                VisionModel::from_hf_dir(dir, device, policy).map_err(|e| e.to_string())?
            }
            None => {
                B::seed(device, seed);
                VisionModel::from_config(&self.config, device).with_policy(policy)
            }
        };
        model.with_dropout(dropout).map_err(|e| e.to_string())
    }
}

/// The seed of model `index`'s random weights.
pub fn weights_seed(master: u64, index: usize) -> u64 {
    master ^ (0x5eed_0000 + index as u64)
}

/// The models asked for: checkpoint directories, else presets.
pub fn model_specs(args: &Args) -> Result<Vec<ModelSpec>, String> {
    let specs: Vec<ModelSpec> = if args.model_dir.is_empty() {
        args.model
            .iter()
            .map(|m| ModelSpec::preset(m.trim()))
            .collect::<Result<_, _>>()?
    } else {
        let specs: Vec<ModelSpec> = args
            .model_dir
            .iter()
            .map(|m| ModelSpec::checkpoint(m.trim()))
            .collect::<Result<_, _>>()?;
        eprintln!("weights: from the checkpoint directories");
        specs
    };
    if args.model_dir.is_empty() {
        eprintln!(
            "weights: RANDOM (no --model-dir): the numbers show the method and its speed, not a \
             trained model's uncertainty"
        );
    }
    let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("two models are named `{}`", pair[0]));
    }
    Ok(specs)
}

/// A model ready to run: loaded, its dataset cached and bound to the device.
pub struct Loaded<'a, B: Backend> {
    pub spec: &'a ModelSpec,
    pub feed: DeviceImages<B>,
    pub model: VisionModel<B>,
    pub rows: usize,
}

impl<'a, B: Backend> Loaded<'a, B> {
    pub fn of<'m>(models: &'m [Loaded<'a, B>], name: &str) -> &'m Loaded<'a, B> {
        models
            .iter()
            .find(|m| m.spec.name == name)
            .expect("a model of the experiment")
    }
}

/// Every model loaded and its images cached and bound to the device, before any long work (the
/// times go to `clock`).
pub fn load_models<'a, B: Backend>(
    args: &Args,
    specs: &'a [ModelSpec],
    images: &Path,
    device: &B::Device,
    policy: &Policy,
    dropout: DropoutSites,
    clock: &mut Clock,
) -> Result<Vec<Loaded<'a, B>>, String> {
    let memory = args.device.probe().ok().and_then(|h| h.memory_bytes);
    let mut models = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let t = Instant::now();
        let cached = ImageCache::new(ImageCache::default_dir())
            .max_image_pixels(args.max_image_pixels)
            .load(&ImageSource::Folder(images.to_path_buf()), &spec.preprocess)
            .map_err(|e| format!("{}: {e}", images.display()))?;
        clock.cache += t.elapsed().as_secs_f64();
        eprintln!(
            "{}: {} images ({:?}, {})",
            spec.name,
            cached.len(),
            cached.outcome(),
            cached.dir().display()
        );
        let t = Instant::now();
        let model = spec
            .load::<B>(device, policy, dropout, weights_seed(args.seed, index))
            .map_err(|e| format!("{}: {e}", spec.name))?;
        clock.load += t.elapsed().as_secs_f64();
        let model_bytes = (model.num_params() * policy.param.size_of()) as u64;
        let (residency, reserved, reason) =
            residency::<B>(args, &cached, device, policy, memory, model_bytes);
        let (width, height) = cached.size();
        let per_row =
            spec.config
                .activation_bytes(height as usize, width as usize, policy.compute.size_of());
        let rows = args
            .batch
            .unwrap_or_else(|| batch_rows::<B>(device, per_row, memory, reserved));
        eprintln!("{}: {reason}; {rows} rows per batch", spec.name);
        models.push(Loaded {
            spec,
            feed: cached.to_device::<B>(device, policy.compute, residency),
            model,
            rows,
        });
    }
    Ok(models)
}

/// Where the images live while the trials run, the device bytes taken beside activations (model
/// and resident dataset), and why. Every pass reads the same images, so on the host too they
/// are normalised once and kept when they take at most an eighth of the memory.
fn residency<B: Backend>(
    args: &Args,
    cached: &CachedImages,
    device: &B::Device,
    policy: &Policy,
    memory: Option<u64>,
    model_bytes: u64,
) -> (Residency, u64, String) {
    let plan =
        cached.plan_residency::<B>(device, policy.compute, model_bytes, memory, args.residency);
    if args.residency.is_none()
        && is_host_backend::<B>(device)
        && memory.is_some_and(|m| plan.dataset_bytes * 8 <= m)
    {
        let reason = format!(
            "residency: normalised once and kept in host memory ({:.2} GiB; --residency host \
             streams instead)",
            plan.dataset_bytes as f64 / f64::from(1u32 << 30)
        );
        return (Residency::Device, model_bytes, reason);
    }
    let dataset = match plan.residency {
        Residency::Device => plan.dataset_bytes,
        Residency::Host => 0,
    };
    (plan.residency, model_bytes + dataset, plan.to_string())
}
