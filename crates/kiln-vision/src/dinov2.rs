//! DINOv2 (transformers `Dinov2Model`): a conv patch embedding, a CLS token, learned position
//! embeddings resized bicubically to the input's patch grid as transformers does, pre-LN layers
//! with LayerScale and exact GELU, a final LayerNorm. Outputs the CLS vector (pooler) and every
//! token (the foveated model reads the patch tokens). Field names mirror the checkpoint's keys.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use crate::TowerSettings;
use crate::VisionError;
use crate::config::{TowerConfig, TowerShape};
use crate::encoder::Mlp;
use crate::patches::{check_pixels, patch_tokens};
use crate::tower::{Tower, in_compute_dtype};
use kiln_transformer::projection::{Then, project, project_dropped, self_attention};
use kiln_transformer::run_layers;
use kiln_transformer::{Activation, PreparedWeights};
use kiln_transformer::{Draw, Pass, Site};
use serde::{Deserialize, Serialize};

/// The family's name as its paper gives it.
const FAMILY: &str = "DINOv2";

/// DINOv2 (transformers `Dinov2Config`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Dinov2Config {
    /// Token width.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width over token width.
    pub mlp_ratio: usize,
    /// Input channels.
    pub num_channels: usize,
    /// Side in pixels the position table was trained for (other sizes interpolate it).
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Initial LayerScale (the checkpoint holds the trained values).
    pub layerscale_value: f64,
    /// MLP activation.
    pub hidden_act: Activation,
    /// Whether query, key and value have biases.
    pub qkv_bias: bool,
    /// SwiGLU MLPs (DINOv2 giant), which kiln does not implement.
    pub use_swiglu_ffn: bool,
    /// Std of the CLS token and position table at initialisation (a model trained from
    /// scratch; the linear layers take burn's defaults).
    pub initializer_range: f64,
}

impl Default for Dinov2Config {
    /// transformers' defaults: ViT-B/14 shapes.
    fn default() -> Self {
        Dinov2Config {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            mlp_ratio: 4,
            num_channels: 3,
            image_size: 224,
            patch_size: 14,
            layer_norm_eps: 1e-6,
            layerscale_value: 1.0,
            hidden_act: Activation::Gelu,
            qkv_bias: true,
            use_swiglu_ffn: false,
            initializer_range: 0.02,
        }
    }
}

impl Dinov2Config {
    /// facebook/dinov2-small.
    pub fn small() -> Self {
        Dinov2Config {
            hidden_size: 384,
            num_attention_heads: 6,
            image_size: 518,
            ..Self::default()
        }
    }

    /// facebook/dinov2-base.
    pub fn base() -> Self {
        Dinov2Config {
            image_size: 518,
            ..Self::default()
        }
    }

    /// facebook/dinov2-large.
    pub fn large() -> Self {
        Dinov2Config {
            hidden_size: 1024,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            image_size: 518,
            ..Self::default()
        }
    }

    /// MLP width.
    pub fn intermediate_size(&self) -> usize {
        // Saturating: a config is checked against the stated limits after this is read.
        self.hidden_size.saturating_mul(self.mlp_ratio)
    }
}

/// The patch projection (`embeddings.patch_embeddings`).
#[derive(Module, Debug)]
pub struct PatchEmbeddings<B: Backend> {
    projection: Conv2d<B>,
}

/// Position tables resized to patch grids, by `(rows, cols, dtype)`: computed once per
/// resolution, shared by clones, emptied when the weights change. The tables are stored
/// type-erased because burn 0.21's `Module` derive treats a skipped field whose type names the
/// backend as a sub-module.
#[derive(Clone, Default)]
struct ResizedPositions(Arc<Mutex<HashMap<GridKey, Box<dyn Any + Send>>>>);

/// `(rows, cols, dtype)` of a resized table.
type GridKey = (usize, usize, DType);

impl std::fmt::Debug for ResizedPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResizedPositions")
    }
}

impl ResizedPositions {
    /// The table for `key`, made by `resize` the first time.
    fn get_or_insert<B: Backend>(
        &self,
        key: GridKey,
        resize: impl FnOnce() -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let mut tables = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(table) = tables
            .get(&key)
            .and_then(|t| t.downcast_ref::<Tensor<B, 3>>())
        {
            return table.clone();
        }
        let table = resize();
        tables.insert(key, Box::new(table.clone()));
        table
    }
}

/// CLS token, patches and positions (`embeddings`).
#[derive(Module, Debug)]
pub struct Dinov2Embeddings<B: Backend> {
    cls_token: Param<Tensor<B, 3>>,
    position_embeddings: Param<Tensor<B, 3>>,
    patch_embeddings: PatchEmbeddings<B>,
    #[module(skip)]
    resized: ResizedPositions,
}

/// PyTorch's bicubic kernel (A = −0.75) as a `[out, in]` matrix: row `o` holds the weights of the
/// four taps around source coordinate `(o + ½)·in/out − ½` (align_corners = false, no
/// antialiasing), taps beyond the edge clamped onto it.
fn bicubic_matrix(out: usize, input: usize) -> Vec<f32> {
    const A: f64 = -0.75;
    let near = |t: f64| ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0;
    let far = |t: f64| ((A * t - 5.0 * A) * t + 8.0 * A) * t - 4.0 * A;
    let mut matrix = vec![0.0; out * input];
    for o in 0..out {
        let source = (o as f64 + 0.5) * input as f64 / out as f64 - 0.5;
        let first = source.floor();
        let t = source - first;
        let weights = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)];
        for (k, weight) in weights.into_iter().enumerate() {
            let tap = (first as i64 + k as i64 - 1).clamp(0, input as i64 - 1) as usize;
            matrix[o * input + tap] += weight as f32;
        }
    }
    matrix
}

impl<B: Backend> Dinov2Embeddings<B> {
    /// The position embeddings for a `rows × cols` patch grid, `[1, 1 + rows·cols, hidden]`: the
    /// stored ones when the grid is the stored square one, else the stored square grid resized
    /// bicubically in f32 (the CLS position unchanged), as transformers' `interpolate_pos_encoding`.
    /// A resized table is computed once per grid and kept, except in training (the table then
    /// tracks gradients and changes every step, so it is resized every forward).
    pub fn positions(&self, rows: usize, cols: usize) -> Tensor<B, 3> {
        let table = self.position_embeddings.val();
        let [_, positions, _] = table.dims();
        let side = ((positions - 1) as f64).sqrt() as usize;
        if rows == side && cols == side {
            return table;
        }
        if table.is_require_grad() {
            return resize_positions(table, side, rows, cols);
        }
        self.resized.get_or_insert((rows, cols, table.dtype()), || {
            resize_positions(table, side, rows, cols)
        })
    }

    fn forward(&self, pixels: Tensor<B, 4>, pass: &Pass) -> Tensor<B, 3> {
        let (patches, (rows, cols)) = patch_tokens(&self.patch_embeddings.projection, pixels, pass);
        let [batch, _, hidden] = patches.dims();
        let cls = self.cls_token.val().expand([batch, 1, hidden]);
        let tokens = Tensor::cat(vec![cls, patches], 1) + self.positions(rows, cols);
        pass.embeddings(tokens)
    }
}

/// The stored `side × side` position `table` (`[1, 1 + side², hidden]`) resized bicubically to
/// `rows × cols` in f32, the CLS position unchanged.
fn resize_positions<B: Backend>(
    table: Tensor<B, 3>,
    side: usize,
    rows: usize,
    cols: usize,
) -> Tensor<B, 3> {
    let [_, positions, hidden] = table.dims();
    let device = table.device();
    let dtype = table.dtype();
    let table = table.cast(burn::tensor::FloatDType::F32);
    let cls = table.clone().slice([0..1, 0..1]);
    let grid = table
        .slice([0..1, 1..positions])
        .reshape([side, side * hidden]);
    let matrix = |out: usize| {
        Tensor::<B, 2>::from_data(
            TensorData::new(bicubic_matrix(out, side), [out, side]),
            &device,
        )
    };
    // Rows: [rows, side] · [side, side·hidden]; then columns, row by row.
    let by_rows = matrix(rows).matmul(grid).reshape([rows, side, hidden]);
    let resized = matrix(cols)
        .unsqueeze::<3>()
        .expand([rows, cols, side])
        .matmul(by_rows)
        .reshape([1, rows * cols, hidden]);
    Tensor::cat(vec![cls, resized], 1).cast(dtype)
}

/// Query, key and value (`attention.attention`).
#[derive(Module, Debug)]
pub struct QueryKeyValue<B: Backend> {
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
}

/// The output projection (`attention.output`).
#[derive(Module, Debug)]
pub struct AttentionOutput<B: Backend> {
    dense: Linear<B>,
}

/// Self-attention (`attention`).
#[derive(Module, Debug)]
pub struct Dinov2Attention<B: Backend> {
    attention: QueryKeyValue<B>,
    output: AttentionOutput<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> Dinov2Attention<B> {
    /// `then(output(attention(x)))`, Monte-Carlo dropout before `then`.
    fn forward(&self, x: Tensor<B, 3>, then: Then<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let qkv = &self.attention;
        let attended = self_attention(&qkv.query, &qkv.key, &qkv.value, x, self.heads, pass);
        self.output(attended, then, pass)
    }

    /// `then(output(attended))`, Monte-Carlo dropout before `then`.
    fn output(&self, attended: Tensor<B, 3>, then: Then<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        project_dropped(
            &self.output.dense,
            attended,
            Site::AttentionOutput,
            then,
            pass,
        )
    }

    /// The same as `forward`, also returning the keys and values it attended over (the
    /// foveated readout's cache).
    fn forward_keeping(
        &self,
        x: Tensor<B, 3>,
        then: Then<B, 3>,
        pass: &Pass,
    ) -> (Tensor<B, 3>, [Tensor<B, 3>; 2]) {
        let qkv = &self.attention;
        let [query, key, value] = [&qkv.query, &qkv.key, &qkv.value]
            .map(|linear| project(linear, x.clone(), Then::Nothing, pass));
        let attended = pass.attention(query, key.clone(), value.clone(), self.heads);
        let out = self.output(attended, then, pass);
        (out, [key, value])
    }

    /// `then(output(attention))` of `queries` over given keys and values: the queries attend to
    /// them only, not to themselves.
    /// With `weights`, the attention probabilities are pushed onto it too.
    fn forward_reading(
        &self,
        queries: Tensor<B, 3>,
        [key, value]: [Tensor<B, 3>; 2],
        then: Then<B, 3>,
        pass: &Pass,
        weights: Option<&mut Vec<Tensor<B, 4>>>,
    ) -> Tensor<B, 3> {
        let query = project(&self.attention.query, queries, Then::Nothing, pass);
        if let Some(weights) = weights {
            weights.push(pass.attention_weights(query.clone(), key.clone(), self.heads));
        }
        let attended = pass.attention(query, key, value, self.heads);
        self.output(attended, then, pass)
    }
}

/// Per-channel scale of a residual branch (`layer_scale1`, `layer_scale2`).
#[derive(Module, Debug)]
pub struct LayerScale<B: Backend> {
    lambda1: Param<Tensor<B, 1>>,
}

impl<B: Backend> LayerScale<B> {
    /// `residual + λ ⊙ ·`, for the projection before it to finish with.
    fn onto(&self, residual: Tensor<B, 3>) -> Then<B, 3> {
        Then::AddTo {
            residual,
            scale: Some(self.lambda1.val()),
        }
    }
}

/// `x + ls1·attn(norm1 x)`, then `+ ls2·mlp(norm2 ·)` (`encoder.layer.N`).
#[derive(Module, Debug)]
pub struct Dinov2Layer<B: Backend> {
    norm1: LayerNorm<B>,
    attention: Dinov2Attention<B>,
    layer_scale1: LayerScale<B>,
    norm2: LayerNorm<B>,
    mlp: Mlp<B>,
    layer_scale2: LayerScale<B>,
}

impl<B: Backend> Dinov2Layer<B> {
    fn forward(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let normed = pass.norm(&self.norm1, x.clone());
        let x = self
            .attention
            .forward(normed, self.layer_scale1.onto(x), pass);
        self.feed_forward(x, pass)
    }

    /// `x + ls2·mlp(norm2 x)`: the second half of every form of the layer.
    fn feed_forward(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let normed = pass.norm(&self.norm2, x.clone());
        self.mlp.forward(normed, self.layer_scale2.onto(x), pass)
    }

    /// `forward`, also returning the layer's keys and values.
    fn forward_keeping(&self, x: Tensor<B, 3>, pass: &Pass) -> (Tensor<B, 3>, [Tensor<B, 3>; 2]) {
        let normed = pass.norm(&self.norm1, x.clone());
        let (x, keys_values) =
            self.attention
                .forward_keeping(normed, self.layer_scale1.onto(x), pass);
        (self.feed_forward(x, pass), keys_values)
    }

    /// The layer applied to `queries` that attend to `keys_values` (another sequence's) instead
    /// of to themselves: norm, attention, LayerScale and MLP as in `forward`.
    fn forward_reading(
        &self,
        queries: Tensor<B, 3>,
        keys_values: [Tensor<B, 3>; 2],
        pass: &Pass,
        weights: Option<&mut Vec<Tensor<B, 4>>>,
    ) -> Tensor<B, 3> {
        let normed = pass.norm(&self.norm1, queries.clone());
        let x = self.attention.forward_reading(
            normed,
            keys_values,
            self.layer_scale1.onto(queries),
            pass,
            weights,
        );
        self.feed_forward(x, pass)
    }

    /// One attention of `queries` (in the tower's width, used as they are: no norm, no query
    /// projection) over this layer's keys and values of `tokens` (its `norm1`, `key` and
    /// `value`), nothing after it: fVLM's shallow readout. With `weights`, the attention
    /// probabilities are pushed onto it too.
    fn attend_once(
        &self,
        queries: Tensor<B, 3>,
        tokens: Tensor<B, 3>,
        pass: &Pass,
        weights: Option<&mut Vec<Tensor<B, 4>>>,
    ) -> Tensor<B, 3> {
        let normed = pass.norm(&self.norm1, tokens);
        let qkv = &self.attention.attention;
        let [key, value] = [&qkv.key, &qkv.value]
            .map(|linear| project(linear, normed.clone(), Then::Nothing, pass));
        let heads = self.attention.heads;
        if let Some(weights) = weights {
            weights.push(pass.attention_weights(queries.clone(), key.clone(), heads));
        }
        pass.attention(queries, key, value, heads)
    }
}

/// The layers (`encoder`).
#[derive(Module, Debug)]
pub struct Dinov2Encoder<B: Backend> {
    layer: Vec<Dinov2Layer<B>>,
}

/// What a forward pass gives, in the policy's output dtype.
#[derive(Debug, Clone)]
pub struct Dinov2Output<B: Backend> {
    /// The CLS token after the final LayerNorm, `[batch, hidden]`.
    pub pooler_output: Tensor<B, 2>,
    /// Every token after the final LayerNorm, `[batch, 1 + patches, hidden]` (CLS first, then
    /// the patches row by row).
    pub last_hidden_state: Tensor<B, 3>,
    /// Each layer's input and the last output (before the final norm), when asked for.
    pub hidden_states: Vec<Tensor<B, 3>>,
}

/// DINOv2.
#[derive(Module, Debug)]
pub struct Dinov2Model<B: Backend> {
    embeddings: Dinov2Embeddings<B>,
    encoder: Dinov2Encoder<B>,
    layernorm: LayerNorm<B>,
    #[module(skip)]
    config: Dinov2Config,
    #[module(skip)]
    settings: TowerSettings,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl<B: Backend> Tower<B> for Dinov2Model<B> {
    type Output = Dinov2Output<B>;

    fn family(&self) -> &'static str {
        FAMILY
    }

    /// DINOv2 resizes its position table to any patch grid.
    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        check_pixels(&self.embeddings.patch_embeddings.projection, None, dims)
    }

    fn settings(&self) -> &TowerSettings {
        &self.settings
    }

    fn settings_mut(&mut self) -> &mut TowerSettings {
        &mut self.settings
    }

    fn weights_changed(&mut self) {
        self.embeddings.resized = Default::default();
        self.prepared = Default::default();
    }

    fn run(&self, pixels: Tensor<B, 4>, keep: bool, draw: Option<&Draw>) -> Dinov2Output<B> {
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, draw);
        let x = model.embeddings.forward(pass.input(pixels), &pass);
        let (x, hidden_states) =
            run_layers(x, &model.encoder.layer, keep, &pass, Dinov2Layer::forward);
        let last_hidden_state = pass.output(pass.norm(&model.layernorm, x));
        let [batch, _, hidden] = last_hidden_state.dims();
        let pooler_output = last_hidden_state
            .clone()
            .slice([0..batch, 0..1])
            .reshape([batch, hidden]);
        Dinov2Output {
            pooler_output,
            last_hidden_state,
            hidden_states,
        }
    }

    fn embeddings_of(output: Dinov2Output<B>) -> Tensor<B, 2> {
        output.pooler_output
    }

    fn embedding_width(&self) -> usize {
        self.config.hidden_size
    }
}

/// A batch of frames as DINOv2 saw them, for queries to read afterwards
/// ([`Dinov2Model::encode_patches`], [`Dinov2Model::read`]): fVLM's `encode_patches`.
#[derive(Debug, Clone)]
pub struct Dinov2Patches<B: Backend> {
    /// Every token after the final LayerNorm, `[frames, tokens, hidden]` (CLS first unless
    /// [`Dinov2Patches::without_cls`] removed it), in the policy's output dtype.
    pub last_hidden_state: Tensor<B, 3>,
    /// Per layer, the keys and values its attention formed over these tokens (the layer's
    /// `key` and `value` projections of its `norm1` output), `[frames, tokens, hidden]` each, in
    /// the policy's compute dtype.
    pub keys_values: Vec<[Tensor<B, 3>; 2]>,
}

impl<B: Backend> Dinov2Patches<B> {
    /// The same without the CLS token: the patch tokens only.
    pub fn without_cls(self) -> Self {
        let patches = |x: Tensor<B, 3>| {
            let [frames, tokens, hidden] = x.dims();
            x.slice([0..frames, 1..tokens, 0..hidden])
        };
        Dinov2Patches {
            last_hidden_state: patches(self.last_hidden_state),
            keys_values: self
                .keys_values
                .into_iter()
                .map(|kv| kv.map(patches))
                .collect(),
        }
    }

    /// The number of frames.
    pub fn frames(&self) -> usize {
        self.last_hidden_state.dims()[0]
    }
}

/// What [`Dinov2Model::read_with_attention`] gives.
#[derive(Debug, Clone)]
pub struct Reading<B: Backend> {
    /// The queries after the last layer and the final LayerNorm, `[frames, queries, hidden]`.
    pub output: Tensor<B, 3>,
    /// Per layer, the queries' attention probabilities over the tokens, `[frames, heads,
    /// queries, tokens]`.
    pub attention: Vec<Tensor<B, 4>>,
}

impl<B: Backend> Dinov2Model<B> {
    /// Normalised `pixels` `[frames, 3, H, W]` through the tower (deterministic), keeping each
    /// layer's keys and values for [`Dinov2Model::read`]. The tokens are the forward's.
    pub fn encode_patches(&self, pixels: Tensor<B, 4>) -> Result<Dinov2Patches<B>, VisionError> {
        self.check_pixels(pixels.dims())?;
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, None);
        let mut x = model.embeddings.forward(pass.input(pixels), &pass);
        let mut keys_values = Vec::with_capacity(model.encoder.layer.len());
        for layer in &model.encoder.layer {
            let (next, kv) = layer.forward_keeping(x, &pass);
            keys_values.push(kv);
            x = next;
        }
        let last_hidden_state = pass.output(pass.norm(&model.layernorm, x));
        Ok(Dinov2Patches {
            last_hidden_state,
            keys_values,
        })
    }

    /// fVLM's deep readout: `queries` `[frames, queries, hidden]` go through every layer (its
    /// norms, query and output projections, LayerScale and MLP), attending at each to that
    /// layer's keys and values of `patches`, never to themselves, then through the final
    /// LayerNorm. The patches do not see the queries. Returns `[frames, queries, hidden]` in the
    /// policy's output dtype.
    pub fn read(
        &self,
        queries: Tensor<B, 3>,
        patches: &Dinov2Patches<B>,
    ) -> Result<Tensor<B, 3>, VisionError> {
        self.reading(queries, patches, false)
            .map(|reading| reading.output)
    }

    /// [`Dinov2Model::read`], keeping where the queries looked: each layer's attention
    /// probabilities `[frames, heads, queries, tokens]` (formed explicitly besides the
    /// attention itself: cheap for a few queries).
    pub fn read_with_attention(
        &self,
        queries: Tensor<B, 3>,
        patches: &Dinov2Patches<B>,
    ) -> Result<Reading<B>, VisionError> {
        self.reading(queries, patches, true)
    }

    /// fVLM's shallow readout (`FoveatedEncoder.shallow_query_attend`): `queries` `[frames,
    /// queries, hidden]` attend once, with the tower's heads, to the last layer's keys and values
    /// of the final features `patches.last_hidden_state` (that layer's `norm1`, `key` and `value`
    /// projections; the queries themselves are not normed or projected), then go through the
    /// final LayerNorm. Returns the result and the attention probabilities (one layer) in the
    /// policy's output dtype.
    pub fn read_shallow(
        &self,
        queries: Tensor<B, 3>,
        patches: &Dinov2Patches<B>,
    ) -> Result<Reading<B>, VisionError> {
        self.check_queries(&queries, patches)?;
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, None);
        let last =
            model.encoder.layer.last().ok_or_else(|| {
                VisionError::Queries("a tower without layers reads nothing".into())
            })?;
        let mut attention = Vec::new();
        let tokens = pass.input(patches.last_hidden_state.clone());
        let read = last.attend_once(pass.input(queries), tokens, &pass, Some(&mut attention));
        Ok(Reading {
            output: pass.output(pass.norm(&model.layernorm, read)),
            attention: attention.into_iter().map(|w| pass.output(w)).collect(),
        })
    }

    /// Refuses queries that do not fit `patches`: other frames, layers or width.
    fn check_queries(
        &self,
        queries: &Tensor<B, 3>,
        patches: &Dinov2Patches<B>,
    ) -> Result<(), VisionError> {
        let [frames, _, hidden] = queries.dims();
        let layers = self.encoder.layer.len();
        if frames != patches.frames() || patches.keys_values.len() != layers {
            return Err(VisionError::Queries(format!(
                "{frames} frame(s) of queries read {} frame(s) of patches with {} layer(s) of keys \
                 and values; the tower has {layers} layer(s)",
                patches.frames(),
                patches.keys_values.len()
            )));
        }
        let width = patches.last_hidden_state.dims()[2];
        if hidden != width {
            return Err(VisionError::Queries(format!(
                "queries of width {hidden} for a tower of width {width}"
            )));
        }
        Ok(())
    }

    fn reading(
        &self,
        queries: Tensor<B, 3>,
        patches: &Dinov2Patches<B>,
        keep_attention: bool,
    ) -> Result<Reading<B>, VisionError> {
        self.check_queries(&queries, patches)?;
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, None);
        let mut x = pass.input(queries);
        let mut attention = Vec::new();
        for (layer, kv) in model.encoder.layer.iter().zip(&patches.keys_values) {
            let weights = keep_attention.then_some(&mut attention);
            x = layer.forward_reading(x, kv.clone(), &pass, weights);
        }
        Ok(Reading {
            output: pass.output(pass.norm(&model.layernorm, x)),
            attention: attention.into_iter().map(|w| pass.output(w)).collect(),
        })
    }
}

impl Dinov2Config {
    /// A randomly initialised model of this shape (load a checkpoint into it with
    /// [`crate::load_hf_weights`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Dinov2Model<B> {
        let hidden = self.hidden_size;
        let grid = self.image_size / self.patch_size;
        let init = Initializer::Normal {
            mean: 0.0,
            std: self.initializer_range,
        };
        let norm = || {
            LayerNormConfig::new(hidden)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let linear = || {
            LinearConfig::new(hidden, hidden)
                .with_bias(self.qkv_bias)
                .init(device)
        };
        let scale = || LayerScale {
            lambda1: Initializer::Constant {
                value: self.layerscale_value,
            }
            .init([hidden], device),
        };
        let layer = (0..self.num_hidden_layers)
            .map(|_| Dinov2Layer {
                norm1: norm(),
                attention: Dinov2Attention {
                    attention: QueryKeyValue {
                        query: linear(),
                        key: linear(),
                        value: linear(),
                    },
                    output: AttentionOutput {
                        dense: LinearConfig::new(hidden, hidden).init(device),
                    },
                    heads: self.num_attention_heads,
                },
                layer_scale1: scale(),
                norm2: norm(),
                mlp: Mlp::init(hidden, self.intermediate_size(), self.hidden_act, device),
                layer_scale2: scale(),
            })
            .collect();
        Dinov2Model {
            // N(0, initializer_range²) as transformers initialises them: trained from scratch,
            // zeros would give every patch the same position.
            embeddings: Dinov2Embeddings {
                cls_token: init.init([1, 1, hidden], device),
                position_embeddings: init.init([1, 1 + grid * grid, hidden], device),
                patch_embeddings: PatchEmbeddings {
                    projection: Conv2dConfig::new(
                        [self.num_channels, hidden],
                        [self.patch_size, self.patch_size],
                    )
                    .with_stride([self.patch_size, self.patch_size])
                    .init(device),
                },
                resized: Default::default(),
            },
            encoder: Dinov2Encoder { layer },
            layernorm: norm(),
            config: self.clone(),
            settings: TowerSettings::default(),
            prepared: PreparedWeights::default(),
        }
    }
}

impl<B: Backend> Dinov2Model<B> {
    /// The width of its tokens (`hidden_size`).
    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    /// The shape it was made with.
    pub fn config(&self) -> &Dinov2Config {
        &self.config
    }

    /// The embedding module (its [`Dinov2Embeddings::positions`] gives the position table for
    /// a patch grid).
    pub fn embeddings(&self) -> &Dinov2Embeddings<B> {
        &self.embeddings
    }
}

impl TowerConfig for Dinov2Config {
    fn family(&self) -> &'static str {
        FAMILY
    }

    fn shape(&self) -> TowerShape {
        TowerShape {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size(),
            intermediate_setting: "hidden_size × mlp_ratio",
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            patch: self.patch_size,
            image: self.image_size,
            channels: self.num_channels,
            eps: self.layer_norm_eps,
            class_tokens: 1,
        }
    }

    fn limits(&self) -> Vec<(&'static str, usize, usize)> {
        vec![("mlp_ratio", self.mlp_ratio, 64)]
    }

    fn check(&self) -> Result<(), VisionError> {
        if self.use_swiglu_ffn {
            return Err(VisionError::Config(
                "DINOv2 with SwiGLU MLPs (giant) is not supported: kiln implements small, base \
                 and large"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;

    /// A one-layer tower of width 8 on 16 px images of 8 px patches.
    fn tiny() -> Dinov2Config {
        Dinov2Config {
            hidden_size: 8,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            image_size: 16,
            patch_size: 8,
            ..Dinov2Config::default()
        }
    }

    /// A tower trained from scratch starts with distinct positions, as transformers initialises
    /// it (zeros would make every patch's position the same).
    #[test]
    fn a_new_tower_tells_positions_apart() {
        let device = Default::default();
        let config = tiny();
        let table = config.init::<Flex>(&device).embeddings().positions(2, 2);
        let [_, tokens, hidden] = table.dims();
        let rows = |i: usize| table.clone().slice([0..1, i..i + 1, 0..hidden]);
        for (a, b) in [(1, 2), (1, 3), (2, 4), (0, 1)] {
            let apart = (rows(a) - rows(b)).abs().max().into_scalar();
            assert!(
                apart > 1e-3,
                "positions {a} and {b} of {tokens} are the same"
            );
        }
        let spread = table.clone().powf_scalar(2.0).mean().sqrt().into_scalar();
        assert!(
            (0.01..0.04).contains(&spread),
            "std {spread}, transformers' is 0.02"
        );
    }

    /// In training the resized table follows the weights (a kept one would be stale after the
    /// first optimizer step) and passes gradients to them.
    #[test]
    fn resized_positions_follow_trained_weights() {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let config = tiny();
        let model = config.init::<Ad>(&device);
        let embeddings = model.embeddings();
        let before = embeddings.positions(3, 3);
        let grads = before.clone().sum().backward();
        let grad = embeddings
            .position_embeddings
            .grad(&grads)
            .expect("a gradient");
        assert!(grad.abs().sum().into_scalar() > 0.0);
        // The weights change, as an optimizer step changes them.
        let changed = model.map(&mut AddOne);
        let after = changed.embeddings().positions(3, 3);
        let moved = (after - before).abs().min().into_scalar();
        assert!(moved > 0.5, "the resized table did not follow the weights");
    }

    struct AddOne;

    impl<B: Backend> burn::module::ModuleMapper<B> for AddOne {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            param.map(|t| t.add_scalar(1.0))
        }
    }
}
