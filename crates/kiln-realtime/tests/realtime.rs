//! kiln-realtime against mirage-hello's own modules (scripts/fixtures/realtime.py): the
//! benchmarked U-Net and the live-stream diffusion model, frame by frame, on both of their
//! paths: Flex runs kiln's host layers (NHWC images, convolutions as products), Flex under
//! autodiff runs burn's operations (the path every other backend takes).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use kiln_core::PolicySpec;
use kiln_realtime::{FrameError, FrameLoop, LiveStreamDiffusion, LsdConfig, UNet, UNetConfig};

type B = Flex;
/// Flex under autodiff: kiln's host layers step aside (they would cut a gradient's path), so
/// burn's operations run.
type Ops = Autodiff<Flex>;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The tensors of a references file, by name.
struct References(Vec<u8>);

impl References {
    fn open(name: &str) -> Self {
        References(std::fs::read(fixtures().join(name)).expect("fixtures are committed"))
    }

    fn tensor<B: Backend, const D: usize>(&self, name: &str) -> Tensor<B, D> {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).expect("a safetensors file");
        let view = tensors.tensor(name).expect("the reference is there");
        let values: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            safetensors::Dtype::I64 => view
                .data()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f32)
                .collect(),
            other => panic!("{name}: unexpected {other:?}"),
        };
        Tensor::from_data(
            TensorData::new(values, view.shape().to_vec()),
            &Default::default(),
        )
    }
}

/// `max |got − want| ≤ tolerance · max |want|`.
fn assert_close<B: Backend, const D: usize>(
    got: Tensor<B, D>,
    want: Tensor<B, D>,
    tolerance: f32,
    what: &str,
) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    let scale: f32 = want.clone().abs().max().into_scalar().elem();
    let error: f32 = (got - want).abs().max().into_scalar().elem();
    assert!(
        error <= tolerance * scale,
        "{what}: max error {error:e} over max {scale:e} (tolerance {tolerance:e} relative)"
    );
}

fn fixture_unet<B: Backend>() -> UNet<B> {
    UNetConfig::new(4, 3, 16)
        .init::<B>(&Default::default())
        .with_weights(&fixtures().join("unet"))
        .expect("the fixture U-Net loads")
}

fn fixture_lsd<B: Backend>() -> LiveStreamDiffusion<B> {
    LsdConfig::new(3, 32, 8, 32, 32)
        .init::<B>(&Default::default())
        .with_weights(&fixtures().join("lsd"))
        .expect("the fixture model loads")
}

fn unet_matches_the_systems_unet<B: Backend>() {
    let refs = References::open("unet_references.safetensors");
    let unet = fixture_unet::<B>();
    let input: Tensor<B, 4> = refs.tensor("input");
    let out = unet.forward(input.clone());
    assert_close(out, refs.tensor("out"), 1e-5, "U-Net output");
    // `denoise` appends the timestep plane as `Day2Model.forward` does (the first item's is
    // 0.5).
    let rgb = input.narrow(1, 0, 3);
    let first = unet.denoise(rgb.narrow(0, 0, 1), 50.0).unwrap();
    let want: Tensor<B, 4> = refs.tensor("out");
    assert_close(first, want.narrow(0, 0, 1), 1e-5, "U-Net denoise at t = 50");
}

#[test]
fn the_unet_matches_the_systems_unet() {
    unet_matches_the_systems_unet::<B>();
    unet_matches_the_systems_unet::<Ops>();
}

/// mirage's benchmark loop (`comprehensive_day2_benchmark` around `Day2Model.forward`, run by
/// the fixture script): three frames of two streams, six forwards each, every forward reading
/// the incoming frame; kiln's default loop gives each frame's output, and the chained variant
/// does not.
fn unet_frames_are_the_systems_loop<B: Backend>() {
    let refs = References::open("unet_loop_references.safetensors");
    let unet = fixture_unet::<B>();
    let frames: Tensor<B, 5> = refs.tensor("frames");
    let want: Tensor<B, 5> = refs.tensor("out");
    let timesteps = [50.0, 40.0, 30.0, 20.0, 10.0, 0.0];
    for i in 0..frames.dims()[0] {
        let frame = |t: Tensor<B, 5>| t.narrow(0, i, 1).squeeze_dim::<4>(0);
        let got = unet.frame(frame(frames.clone()), &timesteps, FrameLoop::Mirage);
        let what = format!("frame {}", i + 1);
        assert_close(got.unwrap(), frame(want.clone()), 1e-5, &what);
        let chained = unet.frame(frame(frames.clone()), &timesteps, FrameLoop::Chain);
        let apart: f32 = (chained.unwrap() - frame(want.clone()))
            .abs()
            .max()
            .into_scalar()
            .elem();
        assert!(apart > 1e-2, "{what}: the chained loop gives other frames");
    }
    let none = unet.frame(
        frames.narrow(0, 0, 1).squeeze_dim::<4>(0),
        &[],
        FrameLoop::Mirage,
    );
    assert_eq!(none.unwrap_err(), FrameError::NoSteps);
}

#[test]
fn unet_frames_are_the_systems_frame_loop() {
    unet_frames_are_the_systems_loop::<B>();
    unet_frames_are_the_systems_loop::<Ops>();
}

/// The fixture's ten-frame stream (the eight-slot bank wraps around at the ninth), frame `i`
/// through `model(i)`, each output the system's within `tolerance` of its largest value.
fn stream_matches_the_system<'m, B: Backend>(
    model: impl Fn(usize) -> &'m LiveStreamDiffusion<B>,
    tolerance: f32,
) {
    let refs = References::open("lsd_references.safetensors");
    let frames: Tensor<B, 4> = refs.tensor("frames");
    let timesteps: Tensor<B, 1> = refs.tensor("timesteps");
    let timesteps: Vec<f32> = timesteps.into_data().convert::<f32>().to_vec().unwrap();
    let want: Tensor<B, 4> = refs.tensor("out");
    let mut stream = model(0).stream(1);
    for (index, &t) in timesteps.iter().enumerate() {
        let frame = frames.clone().narrow(0, index, 1);
        let out = model(index).next_frame(&mut stream, frame, &[t]).unwrap();
        let out = out.cast(burn::tensor::DType::F32);
        let expected = want.clone().narrow(0, index, 1);
        assert_close(out, expected, tolerance, &format!("frame {}", index + 1));
    }
}

fn live_stream_model_matches_the_system<B: Backend>() {
    let model = fixture_lsd::<B>();
    stream_matches_the_system(|_| &model, 1e-5);
}

#[test]
fn the_live_stream_model_matches_the_system_frame_by_frame() {
    live_stream_model_matches_the_system::<B>();
    live_stream_model_matches_the_system::<Ops>();
}

/// A stream carried from one path to the other keeps its bank: frames 1–3 on the host (f32),
/// 4–7 through burn's operations (the same weights converted to f16, whose inputs the host
/// layers do not take: the bank goes from the host's NHWC to tensors), 8–10 on the host again
/// (back from tensors), every frame the system's within 1% (f16's rounding stays under 0.5%; the
/// bank handed over in NCHW order unconverted, 2.4%).
#[test]
fn a_stream_moves_between_the_host_and_burns_operations() {
    let on_host = fixture_lsd::<B>();
    let half: PolicySpec = "pure-f16".parse().unwrap();
    let half = half.resolve::<B>(&Default::default()).unwrap();
    let through_burn = fixture_lsd::<B>().with_policy(half);
    let model = |index| match index {
        3..7 => &through_burn,
        _ => &on_host,
    };
    stream_matches_the_system(model, 1e-2);
}

/// Policy `name`, one the realtime example documents, on the host layers (`B`: a bf16 policy
/// runs them with bf16 products where the CPU has them) and through burn's operations (`Ops`):
/// the U-Net's frames in the system's loop (six denoising forwards each) and the live-stream
/// model's ten frames, each within the policy's rounding of the system's f32 outputs.
fn policy_runs_both_models(name: &str) {
    fn on<B: Backend>(name: &str) {
        let policy = name.parse::<PolicySpec>().unwrap();
        let policy = policy.resolve::<B>(&Default::default()).unwrap();
        let tolerance = if name == "full" { 1e-5 } else { 3e-2 };
        let refs = References::open("unet_loop_references.safetensors");
        let frames: Tensor<B, 5> = refs.tensor("frames");
        let want: Tensor<B, 5> = refs.tensor("out");
        let unet = fixture_unet::<B>().with_policy(policy);
        let timesteps = [50.0, 40.0, 30.0, 20.0, 10.0, 0.0];
        for i in 0..frames.dims()[0] {
            let frame = |t: Tensor<B, 5>| t.narrow(0, i, 1).squeeze_dim::<4>(0);
            let got = unet.frame(frame(frames.clone()), &timesteps, FrameLoop::Mirage);
            let got = got.unwrap().cast(burn::tensor::DType::F32);
            let what = format!("{name}: U-Net frame {}", i + 1);
            assert_close(got, frame(want.clone()), tolerance, &what);
        }
        let lsd = fixture_lsd::<B>().with_policy(policy);
        stream_matches_the_system(|_| &lsd, tolerance);
    }
    on::<B>(name);
    on::<Ops>(name);
}

#[test]
fn the_full_policy_runs_both_models() {
    policy_runs_both_models("full");
}

#[test]
fn the_mixed_bf16_policy_runs_both_models() {
    policy_runs_both_models("mixed-bf16");
}

#[test]
fn the_mixed_f16_policy_runs_both_models() {
    policy_runs_both_models("mixed-f16");
}

#[test]
fn the_bf16_policy_runs_both_models() {
    policy_runs_both_models("bf16");
}

#[test]
fn the_f16_policy_runs_both_models() {
    policy_runs_both_models("f16");
}

#[test]
fn streams_in_one_batch_are_the_streams_run_alone() {
    let refs = References::open("lsd_references.safetensors");
    let model = fixture_lsd::<B>();
    let frames: Tensor<B, 4> = refs.tensor("frames");
    let [a, b] = [0, 5].map(|start| frames.clone().narrow(0, start, 5));
    let (mut alone_a, mut alone_b, mut both) = (model.stream(1), model.stream(1), model.stream(2));
    for index in 0..5 {
        let [fa, fb] = [&a, &b].map(|f| f.clone().narrow(0, index, 1));
        let t = [10.0 - index as f32];
        let out_a = model.next_frame(&mut alone_a, fa.clone(), &t).unwrap();
        let out_b = model.next_frame(&mut alone_b, fb.clone(), &t).unwrap();
        let out = model
            .next_frame(&mut both, Tensor::cat(vec![fa, fb], 0), &t)
            .unwrap();
        assert_close(out, Tensor::cat(vec![out_a, out_b], 0), 1e-6, "two streams");
    }
}

#[test]
fn parameter_counts_are_the_systems() {
    let counts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("counts.json")).unwrap())
            .unwrap();
    let device = Default::default();
    let unet = UNetConfig::mirage().init::<B>(&device);
    assert_eq!(
        unet.num_params() as u64,
        counts["unet_base_96"].as_u64().unwrap()
    );
    // The bank is a buffer in the system's count (parameters only) and a parameter in kiln's.
    let lsd = LsdConfig::mirage().init::<B>(&device);
    let bank = lsd.context_memory.frame_memory.num_params();
    assert_eq!(
        (lsd.num_params() - bank) as u64,
        counts["lsd_hidden_128"].as_u64().unwrap()
    );
}

#[test]
fn a_state_dict_for_another_frame_size_is_refused() {
    let model = LsdConfig::new(3, 32, 8, 64, 64).init::<B>(&Default::default());
    let error = model
        .with_weights(&fixtures().join("lsd"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("frame_memory"), "{error}");
    let unet = UNetConfig::new(4, 3, 24).init::<B>(&Default::default());
    let error = unet
        .with_weights(&fixtures().join("unet"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("conv_in.weight"), "{error}");
}

#[test]
fn frames_the_models_cannot_read_are_errors() {
    let device = Default::default();
    let model = fixture_lsd::<B>();
    let mut stream = model.stream(1);
    let wrong = Tensor::<B, 4>::zeros([1, 3, 16, 32], &device);
    let error = model.next_frame(&mut stream, wrong, &[1.0]).unwrap_err();
    assert!(
        matches!(
            error,
            FrameError::Shape {
                got: [1, 3, 16, 32],
                ..
            }
        ),
        "{error}"
    );
    let two = Tensor::<B, 4>::zeros([2, 3, 32, 32], &device);
    let error = model.next_frame(&mut stream, two, &[1.0]).unwrap_err();
    assert_eq!(
        error,
        FrameError::Streams {
            streams: 1,
            batch: 2
        }
    );
    let one = Tensor::<B, 4>::zeros([1, 3, 32, 32], &device);
    assert_eq!(
        model.next_frame(&mut stream, one, &[]).unwrap_err(),
        FrameError::NoSteps
    );
    let unet = fixture_unet::<B>();
    let odd = Tensor::<B, 4>::zeros([1, 3, 18, 16], &device);
    assert!(matches!(
        unet.denoise(odd, 10.0),
        Err(FrameError::Shape { .. })
    ));
}

/// The sizes the live-stream model's config accepts are the sizes it runs at: an odd side
/// cannot be halved by the block's stride-2 convolution and doubled back, and panicked inside
/// the model before `LsdConfig::validate` refused it.
#[test]
fn the_live_stream_models_config_accepts_the_sizes_it_runs_at() {
    let device = Default::default();
    for (height, width) in [
        (1, 2),
        (2, 2),
        (3, 4),
        (4, 6),
        (7, 8),
        (8, 10),
        (10, 9),
        (12, 12),
    ] {
        let config = LsdConfig::new(3, 32, 2, height, width);
        let runs = std::panic::catch_unwind(|| {
            let model = config.init::<B>(&device);
            let mut stream = model.stream(1);
            let frame = Tensor::<B, 4>::zeros([1, 3, height, width], &device);
            for _ in 0..3 {
                model
                    .next_frame(&mut stream, frame.clone(), &[1.0])
                    .unwrap();
            }
        })
        .is_ok();
        assert_eq!(config.validate().is_ok(), runs, "{height} × {width}");
    }
}
