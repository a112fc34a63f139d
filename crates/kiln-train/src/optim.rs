//! AdamW over parameter groups. Each parameter belongs to the first group one of whose path
//! prefixes it starts with (else to the default group), and decays unless "no decay on biases
//! and norm weights" is on and it is a vector (rank 1: biases, norm scales and shifts,
//! LayerScale). Every (group, decays) pair is stepped by its own burn-optim `AdamW`, which is
//! `torch.optim.AdamW`'s update (decoupled decay `θ ← θ(1 − lr·λ)`, bias-corrected moments, ε
//! added to the corrected √v), so PyTorch parameter groups map one to one.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate,
    Optimizer, SimpleOptimizer,
};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_core::parameter_shapes;
use kiln_kernels::{AdamWStep, adamw_on_host};
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// Parameters selected by path, with their own learning rate and weight decay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// The group's name in logs (`lr_<name>` in `metrics.jsonl`).
    pub name: String,
    /// Parameter path prefixes (`encoder.layer.0`, `head`): a parameter whose dotted path starts
    /// with one of them belongs to the group.
    pub prefixes: Vec<String>,
    /// Peak learning rate.
    pub lr: f64,
    /// Decoupled weight decay λ.
    pub weight_decay: f64,
}

/// AdamW's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Peak learning rate of the parameters in no group.
    pub lr: f64,
    /// Weight decay of the parameters in no group.
    pub weight_decay: f64,
    /// Moment decay rates β₁, β₂.
    pub betas: (f32, f32),
    /// ε, added to the bias-corrected √v.
    pub eps: f32,
    /// Groups, matched in order; the parameters in none form the group `default`.
    pub groups: Vec<GroupConfig>,
    /// No weight decay on vectors (biases, norm weights, LayerScale) in any group.
    pub no_decay_on_biases_and_norms: bool,
}

impl OptimizerConfig {
    /// `torch.optim.AdamW`'s defaults (β = (0.9, 0.999), ε = 1e-8, λ = 0.01) at `lr`, decay on
    /// every parameter, one group.
    pub fn adamw(lr: f64) -> Self {
        OptimizerConfig {
            lr,
            weight_decay: 0.01,
            betas: (0.9, 0.999),
            eps: 1e-8,
            groups: Vec::new(),
            no_decay_on_biases_and_norms: false,
        }
    }

    /// The same with weight decay `weight_decay` for the parameters in no group.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// The same with another group, matched after the ones before it.
    pub fn with_group(mut self, name: &str, prefixes: &[&str], lr: f64, weight_decay: f64) -> Self {
        self.groups.push(GroupConfig {
            name: name.into(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            lr,
            weight_decay,
        });
        self
    }

    /// The same without weight decay on vectors (biases, norm weights).
    pub fn without_decay_on_biases_and_norms(mut self) -> Self {
        self.no_decay_on_biases_and_norms = true;
        self
    }

    /// The group the parameter at dotted `path` belongs to: its index in
    /// [`OptimizerConfig::group_names`] (the default group last).
    pub fn group_of(&self, path: &str) -> usize {
        (self.groups.iter())
            .position(|g| g.prefixes.iter().any(|p| path_has_prefix(path, p)))
            .unwrap_or(self.groups.len())
    }

    /// Group names in order, `default` last.
    pub fn group_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.groups.iter().map(|g| g.name.clone()).collect();
        names.push(DEFAULT_GROUP.into());
        names
    }

    /// Peak learning rates in the order of [`Self::group_names`].
    pub fn group_lrs(&self) -> Vec<f64> {
        let mut lrs: Vec<f64> = self.groups.iter().map(|g| g.lr).collect();
        lrs.push(self.lr);
        lrs
    }

    /// Why these settings cannot be used, if they cannot.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check().map_err(TrainError::Config)
    }

    /// Why these settings cannot be used, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        let rate = |name: &str, lr: f64, wd: f64| {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(format!(
                    "the learning rate of group `{name}` must be a positive number, not {lr}"
                ));
            }
            if !(wd.is_finite() && wd >= 0.0) {
                return Err(format!(
                    "the weight decay of group `{name}` must be 0 or more, not {wd}"
                ));
            }
            Ok(())
        };
        for group in &self.groups {
            rate(&group.name, group.lr, group.weight_decay)?;
            if group.name == DEFAULT_GROUP {
                return Err(format!(
                    "`{DEFAULT_GROUP}` names the parameters in no group"
                ));
            }
        }
        rate(DEFAULT_GROUP, self.lr, self.weight_decay)?;
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            return Err(format!(
                "AdamW's betas must lie in [0, 1), not ({b1}, {b2})"
            ));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(format!("AdamW's eps must be positive, not {}", self.eps));
        }
        Ok(())
    }
}

/// The name of the group of the parameters in no configured group.
pub const DEFAULT_GROUP: &str = "default";

/// A float parameter of a module: its dotted path, id and shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Dotted path (`encoder.layer.0.mlp.fc1.weight`).
    pub path: String,
    /// burn's id of the parameter (kept by checkpoints).
    #[serde(skip)]
    pub id: Option<ParamId>,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// Every float parameter of `module`, in visiting order, read without initialising any
/// ([`kiln_core::parameter_shapes`]).
pub fn parameters<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> Vec<ParamInfo> {
    parameter_shapes(module)
        .into_iter()
        .map(|parameter| ParamInfo {
            path: parameter.path.join("."),
            id: Some(parameter.id),
            shape: parameter.shape,
        })
        .collect()
}

/// One AdamW per (group, decays) pair in use, and which parameter each steps.
pub struct GroupedAdamW<B: AutodiffBackend, M: AutodiffModule<B>> {
    slots: Vec<Slot<B, M>>,
    slot_of: HashMap<ParamId, usize>,
}

/// The optimizer of one (group, decays) pair.
struct Slot<B: AutodiffBackend, M: AutodiffModule<B>> {
    group: usize,
    weight_decay: f64,
    optimizer: OptimizerAdaptor<OnePassAdamW, M, B>,
}

/// The moments of every slot, in slot order (what a checkpoint stores: burn-optim's AdamW
/// states).
pub type GroupedAdamWRecord<B, M> =
    Vec<<OptimizerAdaptor<OnePassAdamW, M, B> as Optimizer<M, B>>::Record>;

/// burn-optim's AdamW, each step of an f32 parameter on Flex computed in one pass over memory
/// (`kiln_kernels::adamw_on_host`: the same arithmetic, on every core); burn-optim's own step
/// elsewhere. Its state is burn-optim's, so checkpoints are the same either way.
#[derive(Clone)]
pub struct OnePassAdamW {
    adamw: AdamW,
    /// `AdamWStep` but for the rate and the step number.
    constants: AdamWStep,
}

impl OnePassAdamW {
    fn new(betas: (f32, f32), epsilon: f32, weight_decay: f64) -> Self {
        OnePassAdamW {
            adamw: AdamWConfig::new()
                .with_beta_1(betas.0)
                .with_beta_2(betas.1)
                .with_epsilon(epsilon)
                .with_weight_decay(weight_decay as f32)
                .build(),
            constants: AdamWStep {
                beta_1: betas.0,
                beta_2: betas.1,
                epsilon,
                // burn-optim keeps the decay in f32.
                weight_decay: weight_decay as f32 as f64,
                lr: 0.0,
                time: 0,
            },
        }
    }
}

impl<B: Backend> SimpleOptimizer<B> for OnePassAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let step = AdamWStep {
            lr,
            time: state.as_ref().map_or(1, |s| s.momentum.time + 1),
            ..self.constants
        };
        let moments = state.map(|s| [s.momentum.moment_1, s.momentum.moment_2]);
        let state = |time, [moment_1, moment_2]: [Tensor<B, D>; 2]| {
            AdamWState::new(AdaptiveMomentumState::new(time, moment_1, moment_2))
        };
        match adamw_on_host(&step, (tensor, grad, moments)) {
            Ok([tensor, moment_1, moment_2]) => {
                (tensor, Some(state(step.time, [moment_1, moment_2])))
            }
            Err((tensor, grad, moments)) => {
                let before = moments.map(|m| state(step.time - 1, m));
                self.adamw.step(lr, tensor, grad, before)
            }
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> GroupedAdamW<B, M> {
    /// The optimizers for `params` (from [`parameters`]) under `config`.
    pub fn new(config: &OptimizerConfig, params: &[ParamInfo]) -> Self {
        let mut slot_index: HashMap<(usize, bool), usize> = HashMap::new();
        let mut slots = Vec::new();
        let mut slot_of = HashMap::new();
        for param in params {
            let group = config.group_of(&param.path);
            let decays = !(config.no_decay_on_biases_and_norms && param.shape.len() == 1);
            let slot = *slot_index.entry((group, decays)).or_insert_with(|| {
                let weight_decay = match (decays, config.groups.get(group)) {
                    (false, _) => 0.0,
                    (true, Some(g)) => g.weight_decay,
                    (true, None) => config.weight_decay,
                };
                slots.push(Slot {
                    group,
                    weight_decay,
                    optimizer: OptimizerAdaptor::from(OnePassAdamW::new(
                        config.betas,
                        config.eps,
                        weight_decay,
                    )),
                });
                slots.len() - 1
            });
            if let Some(id) = param.id {
                slot_of.insert(id, slot);
            }
        }
        GroupedAdamW { slots, slot_of }
    }

    /// One line per (group, decays) pair: its rate, decay and how many parameters it steps.
    pub fn describe(&self, config: &OptimizerConfig, params: &[ParamInfo]) -> Vec<String> {
        let names = config.group_names();
        let lrs = config.group_lrs();
        self.slots
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let mine = params
                    .iter()
                    .filter(|p| p.id.and_then(|id| self.slot_of.get(&id).copied()) == Some(index));
                let (tensors, values) = mine.fold((0, 0), |(t, v), p| {
                    (t + 1, v + p.shape.iter().product::<usize>())
                });
                format!(
                    "group `{}`: lr {:e}, weight decay {}: {tensors} tensors, {values} values",
                    names[slot.group], lrs[slot.group], slot.weight_decay
                )
            })
            .collect()
    }

    /// One optimizer step: each group's parameters move with learning rate `lrs[group]`.
    pub fn step(&mut self, lrs: &[f64], mut module: M, grads: GradientsParams) -> M {
        let mut parts: Vec<GradientsParams> =
            self.slots.iter().map(|_| GradientsParams::new()).collect();
        let mut split = Split::<B> {
            grads,
            parts: &mut parts,
            slot_of: &self.slot_of,
            backend: std::marker::PhantomData,
        };
        module.visit(&mut split);
        for (slot, part) in self.slots.iter_mut().zip(parts) {
            if !part.is_empty() {
                module = slot.optimizer.step(lrs[slot.group], module, part);
            }
        }
        module
    }

    /// The moments, for a checkpoint.
    pub fn to_record(&self) -> GroupedAdamWRecord<B, M> {
        self.slots.iter().map(|s| s.optimizer.to_record()).collect()
    }

    /// Restores moments saved by [`Self::to_record`] with the same configuration.
    pub fn load_record(mut self, record: GroupedAdamWRecord<B, M>) -> Result<Self, TrainError> {
        if record.len() != self.slots.len() {
            return Err(TrainError::Checkpoint(format!(
                "the checkpoint's optimizer has {} parameter groups, this configuration {}",
                record.len(),
                self.slots.len()
            )));
        }
        self.slots = self
            .slots
            .into_iter()
            .zip(record)
            .map(|(slot, record)| Slot {
                optimizer: slot.optimizer.load_record(record),
                ..slot
            })
            .collect();
        Ok(self)
    }
}

/// Whether dotted `path` lies under `prefix` (a whole path component: `fc1` holds `fc1.weight`,
/// not `fc10.weight`).
fn path_has_prefix(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Moves each gradient into the part of its parameter's slot.
struct Split<'a, B> {
    grads: GradientsParams,
    parts: &'a mut [GradientsParams],
    slot_of: &'a HashMap<ParamId, usize>,
    backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Split<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&slot) = self.slot_of.get(&param.id) else {
            return;
        };
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.parts[slot].register::<B::InnerBackend, D>(param.id, grad);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_path_components() {
        assert!(path_has_prefix("fc1.weight", "fc1"));
        assert!(path_has_prefix("fc1", "fc1"));
        assert!(!path_has_prefix("fc10.weight", "fc1"));
        assert!(path_has_prefix(
            "encoder.layer.0.mlp.fc1.bias",
            "encoder.layer"
        ));
    }

    #[test]
    fn bad_rates_are_refused_with_the_group_named() {
        let e = OptimizerConfig::adamw(0.0)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`default`") && e.contains("positive"), "{e}");
        let e = OptimizerConfig::adamw(1e-3)
            .with_group("head", &["head"], -1.0, 0.0)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`head`"), "{e}");
        assert!(OptimizerConfig::adamw(f64::NAN).validate().is_err());
    }

    /// Several steps of [`OnePassAdamW`] against burn-optim's AdamW on the same values, bit for
    /// bit: on Flex (one pass, a parameter that is a view) and on a backend it leaves to
    /// burn-optim.
    #[test]
    fn one_pass_adamw_steps_as_burn_optim_does() {
        use burn::backend::{Autodiff, Flex};
        use burn::tensor::Distribution;

        fn check<B: Backend>(dims: [usize; 2]) {
            let device = Default::default();
            let ours = OnePassAdamW::new((0.9, 0.95), 1e-6, 0.05);
            let theirs = AdamWConfig::new()
                .with_beta_1(0.9)
                .with_beta_2(0.95)
                .with_epsilon(1e-6)
                .with_weight_decay(0.05)
                .build();
            let wide = Tensor::<B, 2>::random(dims, Distribution::Default, &device);
            // A transposed view: not in row-major order.
            let param = wide.transpose();
            let (mut p_ours, mut p_theirs) = (param.clone(), param);
            let (mut s_ours, mut s_theirs) = (None, None);
            for (step, lr) in [1e-2, 5e-3, 2e-2].into_iter().enumerate() {
                let grad =
                    Tensor::<B, 2>::random(p_ours.dims(), Distribution::Normal(0.0, 0.1), &device);
                (p_ours, s_ours) =
                    SimpleOptimizer::<B>::step(&ours, lr, p_ours, grad.clone(), s_ours);
                (p_theirs, s_theirs) = theirs.step(lr, p_theirs, grad, s_theirs);
                let (a, b) = (s_ours.as_ref().unwrap(), s_theirs.as_ref().unwrap());
                assert_eq!(a.momentum.time, step + 1);
                assert_eq!(a.momentum.time, b.momentum.time);
                let pairs = [
                    (p_ours.clone(), p_theirs.clone()),
                    (a.momentum.moment_1.clone(), b.momentum.moment_1.clone()),
                    (a.momentum.moment_2.clone(), b.momentum.moment_2.clone()),
                ];
                for (x, y) in pairs {
                    // The same operations in the same order: the same bits.
                    let values = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().unwrap();
                    assert!(values(x) == values(y), "step {}", step + 1);
                }
            }
        }
        // More values than one task takes, then fewer (updated without the pool).
        for dims in [[37, 2001], [3, 5]] {
            check::<Flex>(dims);
            check::<Autodiff<Flex>>(dims);
        }
    }
}
