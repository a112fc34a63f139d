//! The parameters the foveated model adds between DINOv2 and the LM (fVLM's names).

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{FoveatedConfig, FrameHead, Variant};

/// The queries, the readout's projections, the two connectors, the research variant's mode
/// tokens and the per-frame head.
#[derive(Module, Debug)]
pub struct Connectors<B: Backend> {
    /// The query every frame is read with in the coarse pass, `[1, query_dim]`.
    pub q_static: Param<Tensor<B, 2>>,
    /// The fine pass's query for the first frame, `[1, query_dim]`.
    pub q_init: Param<Tensor<B, 2>>,
    /// Query → DINOv2 width, no bias (a bias swamps small queries: fVLM's BUG-002).
    pub query_input_proj: Linear<B>,
    /// The readout's output projection.
    pub output_proj: Linear<B>,
    /// Visual token → LM embedding (then scaled by [`FoveatedConfig::visual_scale`]).
    pub dino_to_llm: Linear<B>,
    /// LM hidden state → next frame's query.
    pub llm_to_query: Linear<B>,
    /// Marks the coarse pass's visual tokens, `[lm_hidden]` (the research variant's).
    pub coarse_token: Option<Param<Tensor<B, 1>>>,
    /// Marks the fine pass's visual tokens, `[lm_hidden]` (the research variant's).
    pub fine_token: Option<Param<Tensor<B, 1>>>,
    /// The per-frame classifier, when the config has one.
    pub frame_head: Option<Linear<B>>,
}

impl<B: Backend> Connectors<B> {
    /// Newly initialised connectors between a DINOv2 of width `vision` and an LM of width
    /// `lm`: queries with std 1 (fVLM's BUG-001 fix; std 0.02 gave near-uniform attention),
    /// the research variant's mode tokens with std `visual_scale`, linear layers as burn initialises them.
    pub fn init(config: &FoveatedConfig, vision: usize, lm: usize, device: &B::Device) -> Self {
        let query = config.query_dim;
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let research = config.variant == Variant::Research;
        let mode_token = || research.then(|| normal(config.visual_scale).init([lm], device));
        let linear = |inputs, outputs| LinearConfig::new(inputs, outputs).init(device);
        Connectors {
            q_static: normal(1.0).init([1, query], device),
            q_init: normal(1.0).init([1, query], device),
            query_input_proj: LinearConfig::new(query, vision)
                .with_bias(false)
                .init(device),
            output_proj: linear(vision, vision),
            dino_to_llm: linear(vision, lm),
            llm_to_query: linear(lm, query),
            coarse_token: mode_token(),
            fine_token: mode_token(),
            frame_head: match config.frame_head {
                FrameHead::None => None,
                FrameHead::Classes(n) => Some(linear(lm, n)),
            },
        }
    }
}
