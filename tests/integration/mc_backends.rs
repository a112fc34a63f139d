//! A Monte-Carlo trial gives the same statistics on every backend: Flex and NdArray accumulate
//! in f64 on the device, wgpu reads each batch back and accumulates on the host; the masks are
//! the same everywhere, so only floating-point noise separates them.

use std::path::PathBuf;

use burn::tensor::backend::Backend;
use kiln::cache::{ImageCache, ImageSource, Preprocess, Residency};
use kiln::core::{DeviceJob, DeviceSpec, Policy, Precision};
use kiln::mc::{Accumulation, TrialRunner};
use kiln::vision::{DropoutSites, VisionModel};

use crate::common;

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

/// The 16-bit type a device computes in (f32 where it has none).
struct HalfOf;

impl DeviceJob for HalfOf {
    type Output = Precision;

    fn run<B: Backend>(self, device: &B::Device) -> Precision {
        kiln::core::resolve_half::<B>(device)
    }
}

/// Dropout masks made on the device (burn's CUDA and wgpu backends) or applied in place (the host
/// backends) hold the same values bit for bit, whatever the batch composition, and no mask
/// crosses from the host.
mod masks {
    use burn::tensor::Tensor;
    use burn::tensor::backend::Backend;
    use kiln::core::{DeviceJob, DeviceSpec, Precision, cast};
    use kiln::kernels::host_mask_uploads;
    use kiln::transformer::{Draw, DropoutSites, Pass, PreparedWeights, Settings, Site};

    use super::{HalfOf, common};

    /// `[rows, 3, 37]` of ones through three sites' masks, rows drawn as `items` (pass 2), in
    /// `precision`.
    struct Masks {
        items: Vec<u64>,
        precision: Precision,
    }

    /// Each site's output values, and how many masks were uploaded from the host for them (on
    /// this thread).
    type Outcome = (Vec<Vec<f32>>, u64);

    impl DeviceJob for Masks {
        type Output = Outcome;

        fn run<B: Backend>(self, device: &B::Device) -> Outcome {
            let settings = Settings {
                dropout: DropoutSites::all(0.3),
                ..Settings::default()
            };
            let draw = Draw::pass(11, 2, self.items.iter().copied());
            let pass = Pass::new(&settings, &PreparedWeights::default(), Some(&draw));
            let uploads = host_mask_uploads();
            let ones = Tensor::<B, 3>::ones([self.items.len(), 3, 37], device);
            let ones = cast(ones, self.precision);
            let sites = [Site::Embeddings, Site::MlpHidden, Site::AttentionOutput];
            let values = sites
                .map(|site| {
                    let out = cast(pass.drop(site, ones.clone()), Precision::F32);
                    out.into_data().to_vec::<f32>().unwrap()
                })
                .to_vec();
            (values, host_mask_uploads() - uploads)
        }
    }

    fn check(device: DeviceSpec) {
        let items = vec![4, 9, 1, 7];
        let masks = |items: &[u64], precision| Masks {
            items: items.to_vec(),
            precision,
        };
        let (flex, flex_uploads) = DeviceSpec::Flex.run(masks(&items, Precision::F32)).unwrap();
        let (values, uploads) = device.run(masks(&items, Precision::F32)).unwrap();
        assert_eq!(
            (uploads, flex_uploads),
            (0, 0),
            "{device}: f32 masks uploaded"
        );
        // bf16 on the host takes uploaded masks (the counter counts), with the same values.
        let (half, half_uploads) = DeviceSpec::Flex
            .run(masks(&items, Precision::BF16))
            .unwrap();
        assert_eq!(half_uploads, 3, "Flex uploads a bf16 tensor's masks");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (site, ((ours, host), half)) in values.iter().zip(&flex).zip(&half).enumerate() {
            assert_eq!(bits(ours), bits(host), "{device}: site {site}'s mask");
            let kept = host.iter().filter(|&&v| v > 0.0).count() as f64 / host.len() as f64;
            assert!((kept - 0.7).abs() < 0.06, "site {site} keeps {kept}");
            let zeros = |v: &[f32]| v.iter().map(|&x| x == 0.0).collect::<Vec<_>>();
            assert_eq!(zeros(half), zeros(host), "bf16: site {site}'s mask");
        }
        // The same images in another order and with another beside them: each keeps its rows.
        let regrouped = vec![7, 2, 4];
        let (other, _) = device.run(masks(&regrouped, Precision::F32)).unwrap();
        let row = 3 * 37;
        for (position, item) in regrouped.iter().enumerate() {
            let Some(before) = items.iter().position(|i| i == item) else {
                continue;
            };
            for (site, (now, then)) in other.iter().zip(&values).enumerate() {
                assert_eq!(
                    now[position * row..(position + 1) * row],
                    then[before * row..(before + 1) * row],
                    "{device}: item {item}'s site {site} mask moved with its row"
                );
            }
        }
        // On burn's GPU backends the mask is made in the tensor's own 16-bit type: the host's
        // values rounded to it, none uploaded.
        let gpu = !matches!(device, DeviceSpec::Flex | DeviceSpec::NdArray);
        let device_half = device.run(HalfOf).unwrap();
        if gpu && device_half != Precision::F32 {
            let (ours, uploads) = device.run(masks(&items, device_half)).unwrap();
            assert_eq!(uploads, 0, "{device}: {device_half:?} masks uploaded");
            // Half an ulp at 1/(1 − p) ≈ 1.43: 2⁻⁸ in bf16, 2⁻¹¹ in f16.
            let tolerance = if device_half == Precision::BF16 {
                4e-3
            } else {
                5e-4
            };
            for (site, (ours, host)) in ours.iter().zip(&flex).enumerate() {
                let worst = ours
                    .iter()
                    .zip(host)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= tolerance,
                    "{device}: site {site}'s {device_half:?} mask off by {worst}"
                );
            }
        }
    }

    backend_tests!("dropout masks"; cpu, ndarray, wgpu, cuda);
}

/// Attention with dropout on its probabilities as kiln's fused kernel on burn's CUDA and wgpu
/// backends (one launch, no probabilities in memory) gives what the host kernel gives with the
/// same masks, in f32 and in the device's 16-bit type.
mod attention {
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use kiln::core::{DeviceJob, DeviceSpec, Precision, cast};
    use kiln::kernels::fused_attention_launches;
    use kiln::transformer::{Draw, DropoutSites, Pass, PreparedWeights, Settings};

    use super::{HalfOf, common};

    /// Three batch rows of `q_tokens` queries over `kv_tokens` keys, `heads` heads of
    /// `head_dim`; inputs rounded to `precision`, and computed in it unless `widen` (then in
    /// f32).
    #[derive(Clone, Copy, Debug)]
    struct Attend {
        heads: usize,
        head_dim: usize,
        q_tokens: usize,
        kv_tokens: usize,
        precision: Precision,
        widen: bool,
    }

    impl DeviceJob for Attend {
        /// The output's values, and the fused kernel's launches for it (on this thread).
        type Output = (Vec<f32>, u64);

        fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
            let settings = Settings {
                dropout: DropoutSites::all(0.3),
                ..Settings::default()
            };
            let draw = Draw::pass(11, 2, [4, 9, 1]);
            let pass = Pass::new(&settings, &PreparedWeights::default(), Some(&draw));
            let width = self.heads * self.head_dim;
            let tensor = |k: usize, tokens: usize| {
                let values = (0..3 * tokens * width)
                    .map(|i| ((k * 7919 + i) as f32 * 0.61).sin())
                    .collect::<Vec<_>>();
                let x =
                    Tensor::<B, 3>::from_data(TensorData::new(values, [3, tokens, width]), device);
                let rounded = cast(x, self.precision);
                if self.widen {
                    cast(rounded, Precision::F32)
                } else {
                    rounded
                }
            };
            let launches = fused_attention_launches();
            let (kv, q) = (self.kv_tokens, self.q_tokens);
            let out = pass.attention(tensor(0, q), tensor(1, kv), tensor(2, kv), self.heads);
            let values = cast(out, Precision::F32)
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            (values, fused_attention_launches() - launches)
        }
    }

    fn check(device: DeviceSpec) {
        // Cross-attention over two key tiles and part of a third, narrow heads; self-attention
        // at the towers' head width.
        let f32_shapes = [(3, 8, 5, 71), (2, 64, 37, 37)].map(|(heads, head_dim, q, kv)| Attend {
            heads,
            head_dim,
            q_tokens: q,
            kv_tokens: kv,
            precision: Precision::F32,
            widen: false,
        });
        let half = device.run(HalfOf).unwrap();
        let half_shapes = (half != Precision::F32).then_some(Attend {
            precision: half,
            ..f32_shapes[1]
        });
        if half_shapes.is_none() {
            common::say(&format!("{device} computes in no 16-bit type: f32 only"));
        }
        for shape in f32_shapes.into_iter().chain(half_shapes) {
            let reference = Attend {
                widen: true,
                ..shape
            };
            let (host, _) = DeviceSpec::Flex.run(reference).unwrap();
            let (ours, launches) = device.run(shape).unwrap();
            let diff = common::max_abs_diff(
                &ours.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
                &host.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
            );
            common::say(&format!("{device} {shape:?}: |Δ| {diff:.1e}"));
            // The output's own rounding: half an ulp of values up to ~1.5.
            let tolerance = match shape.precision {
                Precision::BF16 => 1e-2,
                Precision::F16 => 2e-3,
                _ => 1e-5 * common::tf32_slack(device),
            };
            assert!(diff <= tolerance, "{device} {shape:?}: off by {diff:e}");
            assert_eq!(launches, 1, "{device} {shape:?}: fused launches");
        }
    }

    backend_tests!("fused attention"; wgpu, cuda);
}
