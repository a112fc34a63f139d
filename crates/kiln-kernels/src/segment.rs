//! The segment sum behind [`RowIndex`](crate::RowIndex) on burn's GPU backends: one cubecl
//! kernel, one thread per output element, summing its row's entries (grouped once by the index)
//! in index order; and, under autodiff, the two operations it serves (the sum into rows and the
//! gather from them) as single nodes, each the other's backward.

use std::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::row_index::Grouped;

thread_local! {
    static LAUNCHES: Cell<u64> = const { Cell::new(0) };
}

/// How many segment sums this thread has launched as kiln's kernel (a diagnostic: tests show
/// with it that message passing on burn's CUDA and wgpu backends, forward and backward, takes
/// the kernel rather than burn's `select_assign`).
pub fn segment_sum_launches() -> u64 {
    LAUNCHES.with(Cell::get)
}

/// Whether the kernel serves `B` (burn's CUDA or wgpu backend, as compiled in, or either under
/// autodiff).
#[cfg_attr(
    not(any(feature = "cuda", feature = "wgpu")),
    allow(clippy::extra_unused_type_parameters)
)]
pub(crate) fn serves<B: Backend>() -> bool {
    #[cfg(feature = "cuda")]
    if cube::serves::<B, cubecl::cuda::CudaRuntime, u8>() {
        return true;
    }
    #[cfg(feature = "wgpu")]
    if cube::serves::<B, cubecl::wgpu::WgpuRuntime, u32>() {
        return true;
    }
    false
}

/// The sum of `src`'s rows `[entries, columns]` into `rows` rows by the grouped index
/// `[rows, columns]`, where the kernel serves `B` and `src` is f32; else `None`.
#[allow(unused_variables)]
pub(crate) fn sum<B: Backend>(
    src: Tensor<B, 2>,
    indices: &Tensor<B, 1, Int>,
    grouped: &Grouped<B>,
    rows: usize,
) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "cuda")]
    if let Some(sums) =
        cube::sum::<B, cubecl::cuda::CudaRuntime, u8>(src.clone(), indices, grouped, rows)
    {
        return Some(sums);
    }
    #[cfg(feature = "wgpu")]
    if let Some(sums) = cube::sum::<B, cubecl::wgpu::WgpuRuntime, u32>(src, indices, grouped, rows)
    {
        return Some(sums);
    }
    None
}

/// The rows of `x` the index names, where `B` is one the kernel serves under autodiff and `x`
/// is f32 (a node whose backward is the segment sum); else `None` (burn's `select` serves).
#[allow(unused_variables)]
pub(crate) fn gather<B: Backend>(
    x: Tensor<B, 2>,
    indices: &Tensor<B, 1, Int>,
    grouped: &Grouped<B>,
) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "cuda")]
    if let Some(rows) =
        cube::tracked::gather::<B, cubecl::cuda::CudaRuntime, u8>(x.clone(), indices, grouped)
    {
        return Some(rows);
    }
    #[cfg(feature = "wgpu")]
    if let Some(rows) =
        cube::tracked::gather::<B, cubecl::wgpu::WgpuRuntime, u32>(x, indices, grouped)
    {
        return Some(rows);
    }
    None
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube {
    use std::any::TypeId;

    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Int, Shape, Tensor};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{BoolElement, CubeRuntime};
    use cubecl::{CubeDim, calculate_cube_count_elemwise};

    use super::LAUNCHES;
    use crate::cube::{Fused, float_input, int_input, into_fused, is_fused};
    use crate::row_index::Grouped;

    mod kernel {
        use cubecl::prelude::*;

        /// One output element per unit: the sum over its row's entries (`order[offsets[row] ..
        /// offsets[row + 1]]`) of their values in its column.
        #[cube(launch)]
        pub(super) fn segment_sum_kernel(
            src: &Tensor<f32>,
            order: &Tensor<i32>,
            offsets: &Tensor<i32>,
            output: &mut Tensor<f32>,
        ) {
            if ABSOLUTE_POS >= output.len() {
                terminate!();
            }
            let columns = output.shape(1);
            let row = ABSOLUTE_POS / columns;
            let column = ABSOLUTE_POS % columns;
            let start = usize::cast_from(offsets[row * offsets.stride(0)]);
            let end = usize::cast_from(offsets[(row + 1) * offsets.stride(0)]);
            let mut total = 0.0f32;
            for k in start..end {
                let entry = usize::cast_from(order[k * order.stride(0)]);
                total += src[entry * src.stride(0) + column * src.stride(1)];
            }
            output[ABSOLUTE_POS] = total;
        }
    }

    pub(super) fn serves<B: Backend, R: CubeRuntime, BT: BoolElement>() -> bool {
        is_fused::<B, R, BT>() || TypeId::of::<B>() == TypeId::of::<Autodiff<Fused<R, BT>>>()
    }

    pub(super) fn sum<B: Backend, R: CubeRuntime, BT: BoolElement>(
        src: Tensor<B, 2>,
        indices: &Tensor<B, 1, Int>,
        grouped: &Grouped<B>,
        rows: usize,
    ) -> Option<Tensor<B, 2>> {
        if src.dtype() != DType::F32 {
            return None;
        }
        if is_fused::<B, R, BT>() {
            return fused::<B, R, BT>(src, grouped, rows);
        }
        tracked::sum::<B, R, BT>(src, indices, grouped, rows)
    }

    /// The segment sum on [`Fused`], as kiln's kernel.
    fn fused<B: Backend, R: CubeRuntime, BT: BoolElement>(
        src: Tensor<B, 2>,
        grouped: &Grouped<B>,
        rows: usize,
    ) -> Option<Tensor<B, 2>> {
        let [entries, columns] = src.dims();
        if rows * columns == 0 || entries == 0 {
            return Some(Tensor::zeros([rows, columns], &src.device()));
        }
        let src = float_input::<B, R, BT, 2>(src)?;
        let order = int_input::<B, R, BT, 1>(grouped.order.clone())?;
        let offsets = int_input::<B, R, BT, 1>(grouped.offsets.clone())?;
        into_fused::<B, R, BT, 2>(launch::<R>(src, order, offsets, rows, columns))
    }

    fn launch<R: CubeRuntime>(
        src: CubeTensor<R>,
        order: CubeTensor<R>,
        offsets: CubeTensor<R>,
        rows: usize,
        columns: usize,
    ) -> CubeTensor<R> {
        let client = src.client.clone();
        let elements = rows * columns;
        let handle = client.empty(elements * size_of::<f32>());
        let output = CubeTensor::new_contiguous(
            client.clone(),
            src.device.clone(),
            Shape::new([rows, columns]),
            handle,
            DType::F32,
        );
        let cube_dim = CubeDim::new(&client, elements);
        let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
        kernel::segment_sum_kernel::launch::<R>(
            &client,
            cube_count,
            cube_dim,
            src.into_tensor_arg(),
            order.into_tensor_arg(),
            offsets.into_tensor_arg(),
            output.clone().into_tensor_arg(),
        );
        LAUNCHES.with(|launches| launches.set(launches.get() + 1));
        output
    }

    /// The two operations as autodiff nodes over [`Fused`].
    pub(super) mod tracked {
        use std::any::{Any, TypeId};
        use std::fmt;
        use std::marker::PhantomData;

        use burn::backend::Autodiff;
        use burn::tensor::backend::Backend;
        use burn::tensor::ops::{FloatTensor, IntTensor};
        use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
        use burn_autodiff::checkpoint::base::Checkpointer;
        use burn_autodiff::checkpoint::strategy::NoCheckpointing;
        use burn_autodiff::grads::Gradients;
        use burn_autodiff::ops::{Backward, Ops, OpsKind};
        use burn_cubecl::{BoolElement, CubeRuntime};

        use crate::cube::Fused;
        use crate::row_index::Grouped;

        type Trained<R, BT> = Autodiff<Fused<R, BT>>;

        /// The sum into rows; backward: the gradient's rows gathered by the index.
        struct SumBackward<R, BT>(PhantomData<fn() -> (R, BT)>);

        /// The gather from rows; backward: the gradient summed into rows by the index.
        struct GatherBackward<R, BT>(PhantomData<fn() -> (R, BT)>);

        impl<R, BT> fmt::Debug for SumBackward<R, BT> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("SumBackward")
            }
        }

        impl<R, BT> fmt::Debug for GatherBackward<R, BT> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("GatherBackward")
            }
        }

        impl<R: CubeRuntime, BT: BoolElement> Backward<Fused<R, BT>, 1> for SumBackward<R, BT> {
            /// The index.
            type State = IntTensor<Fused<R, BT>>;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let grad = grads.consume::<Fused<R, BT>>(&ops.node);
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let rows = float::<R, BT>(grad).select(0, Tensor::from_primitive(ops.state));
                    grads.register::<Fused<R, BT>>(node.id, rows.into_primitive().tensor());
                }
            }
        }

        impl<R: CubeRuntime, BT: BoolElement> Backward<Fused<R, BT>, 1> for GatherBackward<R, BT> {
            /// The grouped index (order, offsets) and the number of rows.
            type State = (IntTensor<Fused<R, BT>>, IntTensor<Fused<R, BT>>, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let grad = grads.consume::<Fused<R, BT>>(&ops.node);
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let (order, offsets, rows) = ops.state;
                    let grouped = Grouped {
                        order: Tensor::from_primitive(order),
                        offsets: Tensor::from_primitive(offsets),
                    };
                    let sums = super::fused::<Fused<R, BT>, R, BT>(float(grad), &grouped, rows)
                        .expect("the segment sum serves f32 gradients on its own backend");
                    grads.register::<Fused<R, BT>>(node.id, sums.into_primitive().tensor());
                }
            }
        }

        pub(crate) fn sum<B: Backend, R: CubeRuntime, BT: BoolElement>(
            src: Tensor<B, 2>,
            indices: &Tensor<B, 1, Int>,
            grouped: &Grouped<B>,
            rows: usize,
        ) -> Option<Tensor<B, 2>> {
            if TypeId::of::<B>() != TypeId::of::<Trained<R, BT>>() || src.dtype() != DType::F32 {
                return None;
            }
            let src = cast::<FloatTensor<Trained<R, BT>>>(src.into_primitive().tensor())?;
            let inner = Grouped::<Fused<R, BT>> {
                order: Tensor::from_primitive(cast(grouped.order.clone().into_primitive())?),
                offsets: Tensor::from_primitive(cast(grouped.offsets.clone().into_primitive())?),
            };
            let indices: IntTensor<Fused<R, BT>> = cast(indices.clone().into_primitive())?;
            let output = super::fused::<Fused<R, BT>, R, BT>(float(src.primitive), &inner, rows)?;
            let output = output.into_primitive().tensor();
            let tracked = match SumBackward::<R, BT>(PhantomData)
                .prepare::<NoCheckpointing>([src.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(indices, output),
                OpsKind::UnTracked(prep) => prep.finish(output),
            };
            Some(Tensor::from_primitive(TensorPrimitive::Float(cast(
                tracked,
            )?)))
        }

        pub(crate) fn gather<B: Backend, R: CubeRuntime, BT: BoolElement>(
            x: Tensor<B, 2>,
            indices: &Tensor<B, 1, Int>,
            grouped: &Grouped<B>,
        ) -> Option<Tensor<B, 2>> {
            // The backward's kernel reads i32 entries (burn's integers on these backends).
            if TypeId::of::<B>() != TypeId::of::<Trained<R, BT>>()
                || x.dtype() != DType::F32
                || grouped.order.dtype() != DType::I32
            {
                return None;
            }
            let rows = x.dims()[0];
            let x = cast::<FloatTensor<Trained<R, BT>>>(x.into_primitive().tensor())?;
            let order: IntTensor<Fused<R, BT>> = cast(grouped.order.clone().into_primitive())?;
            let offsets: IntTensor<Fused<R, BT>> = cast(grouped.offsets.clone().into_primitive())?;
            let indices: IntTensor<Fused<R, BT>> = cast(indices.clone().into_primitive())?;
            let output = float::<R, BT>(x.primitive)
                .select(0, Tensor::from_primitive(indices))
                .into_primitive()
                .tensor();
            let tracked = match GatherBackward::<R, BT>(PhantomData)
                .prepare::<NoCheckpointing>([x.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((order, offsets, rows), output),
                OpsKind::UnTracked(prep) => prep.finish(output),
            };
            Some(Tensor::from_primitive(TensorPrimitive::Float(cast(
                tracked,
            )?)))
        }

        /// A float primitive of [`Fused`] as a rank-2 tensor.
        fn float<R: CubeRuntime, BT: BoolElement>(
            x: FloatTensor<Fused<R, BT>>,
        ) -> Tensor<Fused<R, BT>, 2> {
            Tensor::from_primitive(TensorPrimitive::Float(x))
        }

        /// `x` as `T`, where it is one (the caller has compared the backends' types).
        fn cast<T: 'static>(x: impl Any) -> Option<T> {
            let boxed: Box<dyn Any> = Box::new(x);
            boxed.downcast::<T>().ok().map(|x| *x)
        }
    }
}
