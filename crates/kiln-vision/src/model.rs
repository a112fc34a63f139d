//! Any supported tower behind one type, chosen by the checkpoint's `config.json`: what examples
//! and the Monte-Carlo runner hold when the model is a command-line argument. Every method is
//! written once, for every [`Tower`], by [`AnyTower`]'s blanket implementation: a new tower needs
//! nothing here.

use std::any::Any;
use std::path::Path;

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::{Policy, checkpoint_dir};
use kiln_transformer::{Draw, DropoutSites};

use crate::VisionError;
use crate::config::VisionConfig;
use crate::tower::{Embedder, Tower};
use crate::weights::load_hf_weights;

/// A loaded vision tower, whichever it is.
#[derive(Debug)]
pub struct VisionModel<B: Backend>(Box<dyn AnyTower<B>>);

/// A [`Tower`] behind `dyn`: what [`VisionModel`] holds.
trait AnyTower<B: Backend>: Any + std::fmt::Debug + Send + Sync {
    fn forward(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2>;
    fn forward_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError>;
    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError>;
    fn embedding_width(&self) -> usize;
    fn family(&self) -> &'static str;
    fn num_params(&self) -> usize;
    fn with_policy(self: Box<Self>, policy: &Policy) -> Box<dyn AnyTower<B>>;
    fn with_dropout(
        self: Box<Self>,
        sites: DropoutSites,
    ) -> Result<Box<dyn AnyTower<B>>, VisionError>;
    fn load(
        self: Box<Self>,
        dir: &Path,
        policy: &Policy,
    ) -> Result<Box<dyn AnyTower<B>>, VisionError>;
    fn clone_box(&self) -> Box<dyn AnyTower<B>>;
}

impl<B: Backend, T: Tower<B> + Sync + 'static> AnyTower<B> for T {
    fn forward(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        Tower::forward(self, pixels)
    }

    fn forward_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError> {
        Tower::forward_sampled(self, pixels, draw)
    }

    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        Tower::check_pixels(self, dims)
    }

    fn embedding_width(&self) -> usize {
        Tower::embedding_width(self)
    }

    fn family(&self) -> &'static str {
        Tower::family(self)
    }

    fn num_params(&self) -> usize {
        Module::num_params(self)
    }

    fn with_policy(self: Box<Self>, policy: &Policy) -> Box<dyn AnyTower<B>> {
        Box::new(Tower::with_policy(*self, policy))
    }

    fn with_dropout(
        self: Box<Self>,
        sites: DropoutSites,
    ) -> Result<Box<dyn AnyTower<B>>, VisionError> {
        Ok(Box::new(Tower::with_dropout(*self, sites)?))
    }

    fn load(
        self: Box<Self>,
        dir: &Path,
        policy: &Policy,
    ) -> Result<Box<dyn AnyTower<B>>, VisionError> {
        Ok(Box::new(load_hf_weights(*self, dir, policy)?))
    }

    fn clone_box(&self) -> Box<dyn AnyTower<B>> {
        Box::new(self.clone())
    }
}

impl<B: Backend> Clone for VisionModel<B> {
    fn clone(&self) -> Self {
        VisionModel(self.0.clone_box())
    }
}

impl<B: Backend> VisionModel<B> {
    /// `tower` as a vision model.
    pub fn new<T: Tower<B> + Sync + 'static>(tower: T) -> Self {
        VisionModel(Box::new(tower))
    }

    /// The tower itself when it is a `T` (as `model.into_tower::<Dinov2Model<B>>()`), else the
    /// model back.
    pub fn into_tower<T: Tower<B> + Sync + 'static>(self) -> Result<T, Self> {
        let tower: &dyn Any = &*self.0;
        if !tower.is::<T>() {
            return Err(self);
        }
        let tower: Box<dyn Any> = self.0;
        Ok(*tower.downcast::<T>().expect("checked above"))
    }

    /// Reads the checkpoint directory `dir` (config.json and weights) onto `device`, parameters
    /// in the policy's dtype.
    pub fn from_hf_dir(
        dir: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, VisionError> {
        let dir = dir.as_ref();
        let model = VisionConfig::from_hf_config(dir)?.init(device);
        model.load(dir, policy)
    }

    /// [`Self::from_hf_dir`] on what [`checkpoint_dir`] makes of `model`: a local directory, or
    /// with the `hub` feature a Hugging Face id (`org/name[@revision]`), fetched into the
    /// Hugging Face cache unless it is there already.
    pub fn from_pretrained(
        model: &str,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, VisionError> {
        Self::from_hf_dir(checkpoint_dir(model)?, device, policy)
    }

    /// A tower of `config` with burn's initialisation (random weights) on `device`, in f32.
    pub fn from_config(config: &VisionConfig, device: &B::Device) -> Self {
        config.init(device)
    }

    /// Parameters (weights and biases) in the tower.
    pub fn num_params(&self) -> usize {
        self.0.num_params()
    }

    /// The model under `policy` (see [`Tower::with_policy`]).
    pub fn with_policy(self, policy: &Policy) -> Self {
        VisionModel(self.0.with_policy(policy))
    }

    /// The tower's family as its paper names it: `CLIP`, `SigLIP` or `DINOv2`.
    pub fn family(&self) -> &'static str {
        self.0.family()
    }

    /// The embeddings of normalised `pixels` `[batch, 3, H, W]`, `[batch, D]`, deterministic.
    pub fn forward(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        self.0.forward(pixels)
    }

    /// `D`, the width of its embeddings ([`Tower::embedding_width`]).
    pub fn embedding_width(&self) -> usize {
        self.0.embedding_width()
    }

    /// Refuses pixels `[batch, channels, H, W]` the model cannot take ([`Tower::check_pixels`]).
    pub fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        self.0.check_pixels(dims)
    }

    /// The embeddings with Monte-Carlo dropout at the sites set by [`Self::with_dropout`], masks
    /// from `draw` (one or the same number of samples per image; see [`Tower::forward_sampled`]).
    pub fn forward_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError> {
        self.0.forward_sampled(pixels, draw)
    }

    /// The model with Monte-Carlo dropout at `sites` for [`Self::forward_sampled`].
    pub fn with_dropout(self, sites: DropoutSites) -> Result<Self, VisionError> {
        Ok(VisionModel(self.0.with_dropout(sites)?))
    }

    /// The weights of the checkpoint directory `dir` loaded into this tower (its config must be
    /// the directory's), under `policy`.
    fn load(self, dir: &Path, policy: &Policy) -> Result<Self, VisionError> {
        self.0.load(dir, policy).map(VisionModel)
    }
}

impl<B: Backend> Embedder<B> for VisionModel<B> {
    fn embed(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        self.forward(pixels)
    }

    fn embed_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError> {
        self.forward_sampled(pixels, draw)
    }

    fn accepts(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        self.check_pixels(dims)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::nn::{Linear, LinearConfig};
    use kiln_transformer::{Pass, PreparedWeights};

    use super::*;
    use crate::{ClipVisionConfig, ClipVisionModel, TowerSettings};

    /// A new tower in a few lines: each channel's mean pixel through a linear layer. Nothing in
    /// `VisionModel` names it.
    #[derive(Module, Debug)]
    struct ChannelMeans<B: Backend> {
        projection: Linear<B>,
        #[module(skip)]
        settings: TowerSettings,
    }

    impl<B: Backend> Tower<B> for ChannelMeans<B> {
        type Output = Tensor<B, 2>;

        fn family(&self) -> &'static str {
            "ChannelMeans"
        }

        fn run(&self, pixels: Tensor<B, 4>, _keep: bool, draw: Option<&Draw>) -> Tensor<B, 2> {
            let pass = Pass::new(&self.settings, &PreparedWeights::default(), draw);
            let [batch, channels, _, _] = pixels.dims();
            let means = pixels.flatten::<3>(2, 3);
            let means = means.mean_dim(2).reshape([batch, channels]);
            pass.output(self.projection.forward(means))
        }

        fn embeddings_of(output: Tensor<B, 2>) -> Tensor<B, 2> {
            output
        }

        fn embedding_width(&self) -> usize {
            self.projection.weight.lazy_shape().dims::<2>()[1]
        }

        fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
            match dims[1] {
                3 => Ok(()),
                other => Err(VisionError::Pixels(format!("{other} channels, not 3"))),
            }
        }

        fn settings(&self) -> &TowerSettings {
            &self.settings
        }

        fn settings_mut(&mut self) -> &mut TowerSettings {
            &mut self.settings
        }
    }

    #[test]
    fn a_new_tower_runs_behind_vision_model() {
        let device = Default::default();
        let tower = ChannelMeans::<Flex> {
            projection: LinearConfig::new(3, 5).init(&device),
            settings: TowerSettings::default(),
        };
        let pixels = Tensor::<Flex, 4>::ones([2, 3, 4, 4], &device);
        let expected = Tower::forward(&tower, pixels.clone()).into_data();
        let model = VisionModel::new(tower)
            .with_policy(&Policy::full())
            .with_dropout(DropoutSites::all(0.1))
            .unwrap();
        assert_eq!(model.family(), "ChannelMeans");
        assert_eq!(model.num_params(), 3 * 5 + 5);
        model
            .forward(pixels.clone())
            .into_data()
            .assert_eq(&expected, true);
        assert!(model.check_pixels([2, 1, 4, 4]).is_err());
        let draw = Draw::pass(0, 0, [7, 8]);
        assert_eq!(model.forward_sampled(pixels, &draw).unwrap().dims(), [2, 5]);
        // The tower comes back out as itself, and not as another.
        let model = model.into_tower::<ClipVisionModel<Flex>>().unwrap_err();
        assert!(model.into_tower::<ChannelMeans<Flex>>().is_ok());
        // A registered tower's config builds it behind the same type.
        let clip = VisionConfig::Clip(ClipVisionConfig {
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            image_size: 8,
            patch_size: 4,
            projection_dim: 4,
            ..ClipVisionConfig::default()
        });
        let clip = VisionModel::<Flex>::from_config(&clip, &device);
        assert_eq!(clip.family(), "CLIP");
        assert!(clip.into_tower::<ClipVisionModel<Flex>>().is_ok());
    }
}
