//! [`Gemm`]s run by cuBLASLt on burn's CUDA backend. A product is one operation of burn's fusion
//! stream, registered without waiting: the stream runs it on the device's runner thread between
//! burn's own operations, where it reads its operands' pointers and the CUDA stream cubecl queues
//! their work on (kiln's patch of cubecl-cuda tells the stream with each resource;
//! vendor/README.md) and queues cuBLASLt's kernel there, so neither the host nor the device
//! waits. Asking cubecl for the pointers from the calling thread instead cost a round trip to
//! that thread per operand: the towers' forwards took 3–4× longer (docs/PERFORMANCE.md).

#![allow(unsafe_code)]

use std::any::Any;
use std::cell::Cell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use burn::tensor::activation::gelu_approximate;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor, TensorPrimitive};
use burn_cubecl::CubeBackend;
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use cubecl::cuda::CudaRuntime;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::result as driver;

use super::{
    ColumnMajor, Element, Epilogue, Gemm, Operand, alignment, cublaslt_enabled, tf32_allowed,
    workspace_bytes,
};
use crate::cube;

/// burn's CUDA runtime.
type Cuda = CudaRuntime;
/// The backend under burn's CUDA fusion stream.
type Inner = CubeBackend<Cuda, f32, i32, u8>;
/// The fusion stream's runtime and tensors.
type Runtime = FusionCubeRuntime<Cuda>;

thread_local! {
    static LAUNCHES: Cell<u64> = const { Cell::new(0) };
    /// The device whose primary context this thread made current.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Products that were handed to cuBLASLt but ran as burn's (the library failed at run time).
static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many products this thread has handed to cuBLASLt, and how many products of any thread
/// fell back to burn's once run (a diagnostic: tests show with it that CUDA projections take
/// the library).
pub fn cublaslt_launches() -> (u64, u64) {
    (LAUNCHES.with(Cell::get), FALLBACKS.load(Ordering::Relaxed))
}

/// `epilogue(op(lhs) · op(rhs)) (+ residual)` through cuBLASLt, where `B` is burn's CUDA backend,
/// the library loads and every tensor has one float dtype of [`Element`]; `None` otherwise (said
/// once where the library is missing) or where [`cublaslt_enabled`] is off, and the caller takes
/// burn's product. `lhs` and `rhs` are
/// row-major `[rows, cols]` matrices read as `lhs_t`/`rhs_t` say, `bias` has one value per
/// output column, `residual` is `[M, N]`. Should cuBLASLt fail when the product runs, burn's
/// operations compute it there instead (with one warning).
#[allow(clippy::too_many_arguments)]
pub fn product<B: Backend>(
    lhs: &Tensor<B, 2>,
    lhs_t: bool,
    rhs: &Tensor<B, 2>,
    rhs_t: bool,
    bias: Option<&Tensor<B, 1>>,
    gelu_tanh: bool,
    residual: Option<&Tensor<B, 2>>,
) -> Option<Tensor<B, 2>> {
    if !cube::is_fused::<B, Cuda, u8>() {
        return None;
    }
    let dtype = lhs.dtype();
    let element = Element::of(dtype)?;
    let same = rhs.dtype() == dtype
        && bias.is_none_or(|b| b.dtype() == dtype)
        && residual.is_none_or(|r| r.dtype() == dtype);
    let operand = |x: &Tensor<B, 2>, t: bool| {
        let [rows, cols] = x.dims();
        let o = Operand::new(rows, cols);
        if t { o.t() } else { o }
    };
    let gemm = Gemm {
        lhs: operand(lhs, lhs_t),
        rhs: operand(rhs, rhs_t),
        element,
        epilogue: Epilogue::new(bias.is_some(), gelu_tanh),
        accumulate: residual.is_some(),
    };
    let problem = gemm.column_major().ok()?;
    let [rows, cols] = gemm.output();
    if !same
        || bias.is_some_and(|b| b.dims()[0] != cols)
        || residual.is_some_and(|r| r.dims() != [rows, cols])
        || !library()
    {
        return None;
    }
    // The fusion stream's tensors, in the operation's input order: lhs, rhs, bias, residual.
    let mut inputs = vec![
        cube::fusion_tensor::<B, Cuda, u8, 2>(lhs.clone())?,
        cube::fusion_tensor::<B, Cuda, u8, 2>(rhs.clone())?,
    ];
    if let Some(bias) = bias {
        inputs.push(cube::fusion_tensor::<B, Cuda, u8, 1>(bias.clone())?);
    }
    if let Some(residual) = residual {
        inputs.push(cube::fusion_tensor::<B, Cuda, u8, 2>(residual.clone())?);
    }
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let out = TensorIr::uninit(
        client.create_empty_handle(),
        Shape::new([rows, cols]),
        dtype,
    );
    let inputs: Vec<TensorIr> = inputs.into_iter().map(FusionTensor::into_ir).collect();
    let desc = CustomOpIr::new("kiln_cublaslt_product", &inputs, &[out]);
    let operation = LtProduct {
        desc: desc.clone(),
        gemm,
        problem,
    };
    let out = client
        .register(streams, OperationIr::Custom(desc), operation)
        .pop()?;
    LAUNCHES.with(|n| n.set(n.get() + 1));
    let out: Box<dyn Any> = Box::new(out);
    let out = *out.downcast::<B::FloatTensorPrimitive>().ok()?;
    Some(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// One product as an operation of burn's fusion stream.
#[derive(Debug)]
struct LtProduct {
    desc: CustomOpIr,
    gemm: Gemm,
    problem: ColumnMajor,
}

impl Operation<Runtime> for LtProduct {
    fn execute(&self, handles: &mut HandleContainer<<Runtime as FusionRuntime>::FusionHandle>) {
        let gemm = &self.gemm;
        let mut inputs = self.desc.inputs.iter();
        let mut next = || {
            let tensor = handles.get_float_tensor::<Inner>(inputs.next().expect("an input"));
            if tensor.is_contiguous() {
                tensor
            } else {
                into_contiguous(tensor)
            }
        };
        let (lhs, rhs) = (next(), next());
        let bias = gemm.epilogue.has_bias().then(&mut next);
        let residual = gemm.accumulate.then(&mut next);
        let [rows, cols] = gemm.output();
        let client = lhs.client.clone();
        let handle = client.empty(rows * cols * gemm.element.size());
        let out = CubeTensor::new_contiguous(
            client,
            lhs.device.clone(),
            Shape::new([rows, cols]),
            handle,
            lhs.dtype,
        );
        let out = match run(
            gemm,
            &self.problem,
            &rhs,
            &lhs,
            bias.as_ref(),
            residual.as_ref(),
            &out,
        ) {
            Ok(()) => out,
            Err(e) => {
                FALLBACKS.fetch_add(1, Ordering::Relaxed);
                warn_once(&format!(
                    "cuBLASLt product {gemm:?} failed ({e}); using burn's"
                ));
                burn_product(gemm, lhs, rhs, bias, residual)
            }
        };
        handles.register_float_tensor::<Inner>(&self.desc.outputs[0].id, out);
    }
}

/// The product through burn's operations (when cuBLASLt fails at run time).
fn burn_product(
    gemm: &Gemm,
    lhs: CubeTensor<Cuda>,
    rhs: CubeTensor<Cuda>,
    bias: Option<CubeTensor<Cuda>>,
    residual: Option<CubeTensor<Cuda>>,
) -> CubeTensor<Cuda> {
    let tensor = |t: CubeTensor<Cuda>, transposed: bool| {
        let t = Tensor::<Inner, 2>::from_primitive(TensorPrimitive::Float(t));
        if transposed { t.transpose() } else { t }
    };
    let mut y = tensor(lhs, gemm.lhs.transposed).matmul(tensor(rhs, gemm.rhs.transposed));
    if let Some(bias) = bias {
        y = y + Tensor::<Inner, 1>::from_primitive(TensorPrimitive::Float(bias)).unsqueeze();
    }
    if matches!(gemm.epilogue, Epilogue::GeluTanh | Epilogue::BiasGeluTanh) {
        y = gelu_approximate(y);
    }
    if let Some(residual) = residual {
        y = y + tensor(residual, false);
    }
    y.into_primitive().tensor()
}

/// Whether products go through cuBLASLt: turned on ([`cublaslt_enabled`]) and libcublasLt loads
/// (said once where it does not).
fn library() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    cublaslt_enabled()
        && *PRESENT.get_or_init(|| {
            // SAFETY: only tries to open the library by its names.
            let present = unsafe { sys::is_culib_present() };
            if !present {
                warn_once(
                    "libcublasLt was not found (LD_LIBRARY_PATH): CUDA products use burn's matmul",
                );
            }
            present
        })
}

/// One warning per process: a fallback slows every product, so it is said, but once.
fn warn_once(message: &str) {
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| log::warn!("{message}"));
}

/// A cuBLASLt handle, a workspace per stream and the plans of one device's products.
struct Library {
    handle: sys::cublasLtHandle_t,
    workspace: usize,
    workspaces: HashMap<usize, cudarc::driver::sys::CUdeviceptr>,
    plans: HashMap<AlgoKey, Plan>,
}

/// A product's descriptors and chosen kernel, made on its first run and kept for the next ones
/// (making them costs the host more than queueing the product).
struct Plan {
    descriptors: Descriptors,
    algorithm: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the handle and the plans' descriptors are used under the mutex that owns them;
// cuBLASLt's handles and descriptors may be used from any thread of the process.
unsafe impl Send for Library {}

impl Library {
    /// A handle for device `index` (its context current), and its workspace size.
    fn new(index: usize) -> Result<Library, Failure> {
        let handle = lt::create_handle().map_err(|e| format!("{e:?}"))?;
        let device = driver::device::get(index as i32).map_err(|e| e.to_string())?;
        // SAFETY: `device` came from `device::get`.
        let major = unsafe {
            driver::device::get_attribute(
                device,
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
        }
        .map_err(|e| e.to_string())?;
        Ok(Library {
            handle,
            workspace: workspace_bytes(major),
            workspaces: HashMap::new(),
            plans: HashMap::new(),
        })
    }
}

/// What a [`Plan`] depends on: the product, TF32, the operands' alignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AlgoKey {
    gemm: Gemm,
    tf32: bool,
    alignments: [u32; 4],
}

/// Each device's [`Library`], by index.
fn libraries() -> &'static Mutex<HashMap<usize, Library>> {
    static LIBRARIES: OnceLock<Mutex<HashMap<usize, Library>>> = OnceLock::new();
    LIBRARIES.get_or_init(Default::default)
}

/// An error of the driver or of cuBLASLt, as text.
type Failure = String;

/// Makes `index`'s primary context (the one cubecl uses) current on this thread, once.
fn make_current(index: usize) -> Result<(), Failure> {
    if CURRENT.with(Cell::get) == Some(index) {
        return Ok(());
    }
    let device = driver::device::get(index as i32).map_err(|e| e.to_string())?;
    // SAFETY: `device` came from `device::get`; the primary context is retained for the process.
    unsafe {
        let context = driver::primary_ctx::retain(device).map_err(|e| e.to_string())?;
        driver::ctx::set_current(context).map_err(|e| e.to_string())?;
    }
    CURRENT.with(|c| c.set(Some(index)));
    Ok(())
}

/// The data type cuBLASLt names an element by.
fn data_type(element: Element) -> sys::cudaDataType {
    match element {
        Element::F32 => sys::cudaDataType::CUDA_R_32F,
        Element::BF16 => sys::cudaDataType::CUDA_R_16BF,
        Element::F16 => sys::cudaDataType::CUDA_R_16F,
    }
}

/// How the products accumulate: f32, on TF32 tensor cores for f32 operands where allowed.
fn compute_type(element: Element, tf32: bool) -> sys::cublasComputeType_t {
    match (element, tf32) {
        (Element::F32, true) => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    }
}

fn epilogue_code(epilogue: Epilogue) -> sys::cublasLtEpilogue_t {
    match epilogue {
        Epilogue::Plain => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::GeluTanh => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
        Epilogue::BiasGeluTanh => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
    }
}

/// The device pointer of a tensor and the stream its commands are ordered on.
fn pointer(tensor: &CubeTensor<Cuda>) -> Result<(u64, usize), Failure> {
    let resource = tensor
        .client
        .get_resource(tensor.handle.clone())
        .map_err(|e| format!("{e:?}"))?;
    let resource = resource.resource();
    Ok((resource.ptr, resource.stream as usize))
}

/// Queues the product on the output's stream.
fn run(
    gemm: &Gemm,
    problem: &ColumnMajor,
    a: &CubeTensor<Cuda>,
    b: &CubeTensor<Cuda>,
    bias: Option<&CubeTensor<Cuda>>,
    c: Option<&CubeTensor<Cuda>>,
    d: &CubeTensor<Cuda>,
) -> Result<(), Failure> {
    let (d_ptr, stream) = pointer(d)?;
    let (a_ptr, _) = pointer(a)?;
    let (b_ptr, _) = pointer(b)?;
    let bias_ptr = bias.map(pointer).transpose()?.map(|(p, _)| p);
    let c_ptr = c.map(pointer).transpose()?.map_or(d_ptr, |(p, _)| p);
    if stream == 0 {
        return Err("cubecl gave no stream (unpatched cubecl-cuda?)".into());
    }
    let index = d.device.index;
    make_current(index)?;
    let tf32 = tf32_allowed();
    let key = AlgoKey {
        gemm: *gemm,
        tf32,
        alignments: [a_ptr, b_ptr, c_ptr, d_ptr].map(alignment),
    };
    let mut libraries = libraries().lock().map_err(|e| e.to_string())?;
    let library = match libraries.entry(index) {
        Entry::Occupied(library) => library.into_mut(),
        Entry::Vacant(slot) => slot.insert(Library::new(index)?),
    };
    let workspace_size = library.workspace;
    let workspace = match library.workspaces.get(&stream) {
        Some(&ptr) => ptr,
        None => {
            // SAFETY: the device's context is current; the workspace lives as long as the
            // process, used only by products queued on its own stream, one after another.
            let ptr = unsafe { driver::malloc_sync(workspace_size) }.map_err(|e| e.to_string())?;
            library.workspaces.insert(stream, ptr);
            ptr
        }
    };
    let (handle, plans) = (library.handle, library.plans.len());
    let plan = match library.plans.entry(key) {
        Entry::Occupied(plan) => plan.into_mut(),
        Entry::Vacant(slot) => {
            let descriptors = Descriptors::new(gemm, problem, tf32)?;
            // The heuristic sees the product as it will run.
            descriptors.set_bias(bias_ptr)?;
            let algorithm = descriptors.choose(handle, workspace_size, key.alignments)?;
            // Each shape should ask once per alignment: more lines than that (`KILN_LOG=debug`)
            // mean the look-ups cost every product.
            log::debug!("cuBLASLt: kernel {} chosen for {key:?}", plans + 1);
            slot.insert(Plan {
                descriptors,
                algorithm,
            })
        }
    };
    let descriptors = &plan.descriptors;
    descriptors.set_bias(bias_ptr)?;
    let (alpha, beta) = (1.0f32, if gemm.accumulate { 1.0f32 } else { 0.0 });
    // SAFETY: the pointers are live device buffers of the shapes the layouts describe (the
    // tensors outlive the call's queueing, and their memory is freed in stream order), the
    // workspace is this stream's, and the stream is the one cubecl queues these tensors' work on.
    unsafe {
        lt::matmul(
            handle,
            descriptors.matmul,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            a_ptr as *const c_void,
            descriptors.a,
            b_ptr as *const c_void,
            descriptors.b,
            c_ptr as *const c_void,
            descriptors.d,
            d_ptr as *mut c_void,
            descriptors.d,
            &plan.algorithm,
            workspace as *mut c_void,
            workspace_size,
            stream as sys::cudaStream_t,
        )
    }
    .map_err(|e| format!("{e:?}"))
}

/// A product's cuBLASLt descriptors, destroyed with its [`Plan`]. The bias pointer is the one
/// attribute that changes from run to run ([`Descriptors::set_bias`]): cuBLASLt reads the
/// descriptors when a product is queued, and the library's mutex orders the runs.
struct Descriptors {
    matmul: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
}

impl Descriptors {
    fn new(gemm: &Gemm, problem: &ColumnMajor, tf32: bool) -> Result<Descriptors, Failure> {
        let fail = |e: lt::CublasError| format!("{e:?}");
        let element = data_type(gemm.element);
        let matmul = lt::create_matmul_desc(
            compute_type(gemm.element, tf32),
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(fail)?;
        let layout = |[rows, cols, ld]: [u64; 3]| {
            lt::create_matrix_layout(element, rows, cols, ld as i64).map_err(fail)
        };
        // Built first so that a failure below still destroys what exists.
        let mut made = Descriptors {
            matmul,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        made.a = layout(problem.a)?;
        made.b = layout(problem.b)?;
        made.d = layout(problem.d)?;
        let set = |attribute, value: *const c_void, size| {
            // SAFETY: `value` points to `size` bytes of the attribute's type.
            unsafe { lt::set_matmul_desc_attribute(matmul, attribute, value, size) }.map_err(fail)
        };
        use sys::cublasLtMatmulDescAttributes_t as Attribute;
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        for (attribute, transposed) in [
            (Attribute::CUBLASLT_MATMUL_DESC_TRANSA, problem.transa),
            (Attribute::CUBLASLT_MATMUL_DESC_TRANSB, problem.transb),
        ] {
            let op = i32::from(transposed);
            set(attribute, &op as *const i32 as *const c_void, 4)?;
        }
        let epilogue = epilogue_code(gemm.epilogue);
        set(
            Attribute::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epilogue as *const sys::cublasLtEpilogue_t as *const c_void,
            std::mem::size_of::<sys::cublasLtEpilogue_t>(),
        )?;
        Ok(made)
    }

    /// Points the epilogue's bias at `bias` (nothing without one).
    fn set_bias(&self, bias: Option<u64>) -> Result<(), Failure> {
        let Some(bias) = bias else {
            return Ok(());
        };
        let pointer = bias as *const c_void;
        // SAFETY: the attribute's value is a device pointer, `pointer` one.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.matmul,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &pointer as *const *const c_void as *const c_void,
                std::mem::size_of::<*const c_void>(),
            )
        }
        .map_err(|e| format!("{e:?}"))
    }

    /// cuBLASLt's first choice for this product within the workspace and these alignments.
    fn choose(
        &self,
        handle: sys::cublasLtHandle_t,
        workspace: usize,
        [a, b, c, d]: [u32; 4],
    ) -> Result<sys::cublasLtMatmulAlgo_t, Failure> {
        let fail = |e: lt::CublasError| format!("{e:?}");
        let preference = lt::create_matmul_pref().map_err(fail)?;
        use sys::cublasLtMatmulPreferenceAttributes_t as Preference;
        let workspace = workspace as u64;
        let chosen = (|| {
            // SAFETY: each value points to its attribute's type (u64, then u32s).
            unsafe {
                lt::set_matmul_pref_attribute(
                    preference,
                    Preference::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &workspace as *const u64 as *const c_void,
                    8,
                )?;
                for (attribute, bytes) in [
                    (Preference::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, a),
                    (Preference::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, b),
                    (Preference::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c),
                    (Preference::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, d),
                ] {
                    lt::set_matmul_pref_attribute(
                        preference,
                        attribute,
                        &bytes as *const u32 as *const c_void,
                        4,
                    )?;
                }
                lt::get_matmul_algo_heuristic(
                    handle,
                    self.matmul,
                    self.a,
                    self.b,
                    self.d,
                    self.d,
                    preference,
                )
            }
        })();
        // SAFETY: created above, used by nothing else.
        unsafe {
            let _ = lt::destroy_matmul_pref(preference);
        }
        Ok(chosen.map_err(fail)?.algo)
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created by cuBLASLt for this plan alone (null where not made);
        // cuBLASLt reads descriptors when a product is queued, not when it runs.
        unsafe {
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.matmul);
        }
    }
}
