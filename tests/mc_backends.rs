//! A Monte-Carlo trial gives the same statistics on every backend: Flex and NdArray accumulate
//! in f64 on the device, wgpu reads each batch back and accumulates on the host; the masks are
//! the same everywhere, so only floating-point noise separates them.

use std::path::PathBuf;

use burn::tensor::backend::Backend;
use kiln::cache::{ImageCache, ImageSource, Preprocess, Residency};
use kiln::mc::{Accumulation, TrialRunner};
use kiln::precision::{DeviceJob, DeviceSpec, Policy, Precision};
use kiln::vision::{DropoutSites, VisionModel};

#[macro_use]
mod common;

use common::{fixtures, relative};

/// One trial of the tiny CLIP fixture over the fixture images, 3 passes, 4 rows a batch (so
/// images' passes meet across batches).
struct Trial {
    cache: PathBuf,
}

struct Outcome {
    accumulation: Accumulation,
    means: Vec<f64>,
    variances: Vec<f64>,
}

impl DeviceJob for Trial {
    type Output = Outcome;

    fn run<B: Backend>(self, device: &B::Device) -> Outcome {
        let dir = fixtures().join("clip_vision");
        let preprocess = Preprocess::from_hf_config(dir.join("preprocessor_config.json")).unwrap();
        let images = ImageCache::new(self.cache)
            .load(&ImageSource::Folder(fixtures().join("images")), &preprocess)
            .unwrap();
        let feed = images.to_device::<B>(device, Precision::F32, Residency::Host);
        let model = VisionModel::<B>::from_hf_dir(&dir, device, &Policy::full())
            .unwrap()
            .with_dropout(DropoutSites::all(0.1))
            .unwrap();
        let trial = TrialRunner::new(&model, &feed)
            .batch(4)
            .run(3, 7, &mut |_| {})
            .unwrap();
        Outcome {
            accumulation: Accumulation::for_device::<B>(device),
            means: trial.stats.means().to_vec(),
            variances: trial.stats.variances(),
        }
    }
}

fn check(device: DeviceSpec) {
    let cache = tempfile::tempdir().unwrap();
    let trial = || Trial {
        cache: cache.path().to_path_buf(),
    };
    let flex = DeviceSpec::Flex.run(trial()).unwrap();
    assert_eq!(flex.accumulation, Accumulation::Device);
    let ours = device.run(trial()).unwrap();
    common::say(&format!(
        "{device}: accumulation on the {:?}",
        ours.accumulation
    ));
    let slack = common::tf32_slack(device);
    let means = relative(&ours.means, &flex.means);
    assert!(means <= 1e-4 * slack, "{device}: means {means}");
    let variances = relative(&ours.variances, &flex.variances);
    assert!(variances <= 1e-3 * slack, "{device}: variances {variances}");
    assert!(flex.variances.iter().all(|&v| v > 0.0));
}

backend_tests!("Monte-Carlo trial"; ndarray, wgpu, cuda);
