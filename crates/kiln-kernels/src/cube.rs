//! burn's GPU backends as kiln's own cubecl kernels see them. burn's CUDA and wgpu backends are
//! [`Fused`]: a fusion stream over cubecl tensors. A kernel reads its inputs as cubecl tensors
//! ([`float_input`], [`int_input`]: the operations queued to make them run first, on the device)
//! and hands its output back to the stream ([`into_fused`]) as burn's own uploads do, so later
//! operations fuse with it.

use std::any::{Any, TypeId};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::stream::OperationStreams;
use burn_fusion::{Fusion, FusionTensor, NoOp, get_client};
use burn_ir::{BackendIr, InitOperationIr, OperationIr};

/// burn's default backend over the cubecl runtime `R` (f32 floats, i32 integers, bool element
/// `BT`), as its `Cuda` and `Wgpu` types are.
pub type Fused<R, BT> = Fusion<CubeBackend<R, f32, i32, BT>>;

/// The fusion stream's tensor of [`Fused`].
pub type Primitive<R> = FusionTensor<burn_cubecl::fusion::FusionCubeRuntime<R>>;

/// Whether `B` is [`Fused<R, BT>`](Fused).
pub fn is_fused<B: Backend, R: CubeRuntime, BT: BoolElement>() -> bool {
    TypeId::of::<B>() == TypeId::of::<Fused<R, BT>>()
}

/// `x`'s tensor in the fusion stream, when `B` is [`Fused<R, BT>`](Fused): what an operation
/// registered with the stream takes as an input.
pub fn fusion_tensor<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    x: Tensor<B, D>,
) -> Option<Primitive<R>> {
    if !is_fused::<B, R, BT>() {
        return None;
    }
    let primitive: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    primitive.downcast::<Primitive<R>>().ok().map(|t| *t)
}

/// `x` as a cubecl tensor, when `B` is [`Fused<R, BT>`](Fused) (in `x`'s own float dtype).
pub fn float_input<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    x: Tensor<B, D>,
) -> Option<CubeTensor<R>> {
    let primitive = fusion_tensor::<B, R, BT, D>(x)?;
    let client = primitive.client.clone();
    Some(client.resolve_tensor_float::<CubeBackend<R, f32, i32, BT>>(primitive))
}

/// `x` as a cubecl tensor, when `B` is [`Fused<R, BT>`](Fused) and `x` holds i32 values.
pub fn int_input<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    x: Tensor<B, D, Int>,
) -> Option<CubeTensor<R>> {
    if !is_fused::<B, R, BT>() || x.dtype() != DType::I32 {
        return None;
    }
    let primitive: Box<dyn Any> = Box::new(x.into_primitive());
    let primitive = *primitive.downcast::<Primitive<R>>().ok()?;
    let client = primitive.client.clone();
    Some(client.resolve_tensor_int::<CubeBackend<R, f32, i32, BT>>(primitive))
}

/// A kernel's float output as a tensor of `B` ([`Fused<R, BT>`](Fused)), registered with the
/// fusion stream as an upload is (burn's own pattern for data made outside the stream).
pub fn into_fused<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    tensor: CubeTensor<R>,
) -> Option<Tensor<B, D>> {
    type Inner<R, BT> = CubeBackend<R, f32, i32, BT>;
    let dtype = tensor.dtype;
    if !is_fused::<B, R, BT>() || !dtype.is_float() {
        return None;
    }
    let client = get_client::<Inner<R, BT>>(&tensor.device);
    let shape = tensor.meta.shape().clone();
    let handle = Inner::<R, BT>::float_tensor_handle(tensor);
    let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let fused = client
        .register(
            OperationStreams::default(),
            OperationIr::Init(init),
            NoOp::<Inner<R, BT>>::new(),
        )
        .pop()?;
    let primitive: Box<dyn Any> = Box::new(fused);
    let primitive = *primitive.downcast::<B::FloatTensorPrimitive>().ok()?;
    Some(Tensor::from_primitive(TensorPrimitive::Float(primitive)))
}
