//! The f32 values of a host tensor, read in place where the backend allows it.

use std::sync::Arc;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// The f32 values of a tensor, read in place from a Flex tensor's storage when it is contiguous
/// f32, copied (and converted) otherwise.
///
/// A view read in place holds a reference to the storage, which keeps it alive and shared:
/// burn-flex writes into a tensor's storage only when nothing else holds it, so while a view
/// exists its values stay what they were. [`HostValues::same_storage`] therefore tells when two
/// reads of a weight hold the same values without comparing them, and a cache can key on it.
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use kiln_kernels::HostValues;
///
/// let device = Default::default();
/// let weight = Tensor::<Flex, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
/// let read = HostValues::of(&weight);
/// assert_eq!(read.values(), &[1.0, 2.0, 3.0, 4.0]);
/// assert!(read.same_storage(&HostValues::of(&weight)));
/// assert!(!read.same_storage(&HostValues::of(&(weight * 2.0))));
/// ```
#[derive(Clone)]
pub struct HostValues(Read);

#[derive(Clone)]
enum Read {
    #[cfg(feature = "flex")]
    InPlace(burn::backend::flex::FlexTensor),
    Copied(Arc<[f32]>),
}

impl HostValues {
    /// The values of `x` in row-major order.
    pub fn of<B: Backend, const D: usize>(x: &Tensor<B, D>) -> HostValues {
        #[cfg(feature = "flex")]
        if x.dtype() == burn::tensor::DType::F32 {
            let primitive: Box<dyn std::any::Any> = Box::new(x.clone().into_primitive().tensor());
            // A Flex tensor, or a tracked one of Autodiff<Flex> (a parameter in training).
            use burn::backend::flex::FlexTensor;
            type Tracked =
                burn::tensor::ops::FloatTensor<burn::backend::Autodiff<burn::backend::Flex>>;
            let flex = match primitive.downcast::<FlexTensor>() {
                Ok(flex) => Some(*flex),
                Err(other) => other.downcast::<Tracked>().ok().map(|t| t.primitive),
            };
            if let Some(flex) = flex
                && flex.as_slice::<f32>().is_some()
            {
                return HostValues(Read::InPlace(flex));
            }
        }
        let values = x.clone().into_data().convert::<f32>().into_vec::<f32>();
        HostValues(Read::Copied(values.expect("converted to f32").into()))
    }

    /// The values.
    pub fn values(&self) -> &[f32] {
        match &self.0 {
            #[cfg(feature = "flex")]
            Read::InPlace(flex) => flex.as_slice::<f32>().expect("checked when read"),
            Read::Copied(values) => values,
        }
    }

    /// Whether the values were read in place (and [`HostValues::same_storage`] can be true).
    pub fn in_place(&self) -> bool {
        !matches!(self.0, Read::Copied(_))
    }

    /// Whether both views read the same elements of the same storage, and so hold the same
    /// values. Copies never match.
    pub fn same_storage(&self, other: &HostValues) -> bool {
        match (&self.0, &other.0) {
            #[cfg(feature = "flex")]
            (Read::InPlace(a), Read::InPlace(b)) => {
                Arc::ptr_eq(&a.data_arc(), &b.data_arc()) && a.layout() == b.layout()
            }
            _ => false,
        }
    }

    /// Which elements of which storage this view reads, without keeping the storage shared
    /// (`None` for copies): what a cache of values derived from a weight keeps. A view keeps
    /// the storage shared, and burn-flex copies shared storage before it writes in place, so a
    /// cache holding views made the optimiser's in-place step copy every weight it held
    /// (docs/PERFORMANCE.md).
    pub fn storage_key(&self) -> Option<StorageKey> {
        match &self.0 {
            #[cfg(feature = "flex")]
            Read::InPlace(flex) => Some(StorageKey {
                storage: Arc::downgrade(&flex.data_arc()),
                layout: flex.layout().clone(),
            }),
            Read::Copied(_) => None,
        }
    }
}

/// The storage and elements a [`HostValues`] view read, held weakly.
///
/// It never keeps the values alive, and it matches a view only while that view reads the very
/// storage it named: the weak reference keeps the storage's address from being reused, and
/// burn-flex moves storage that is written in place while weakly referenced (`Arc::make_mut`),
/// so values written after the key was taken never match it.
#[derive(Clone)]
pub struct StorageKey {
    #[cfg(feature = "flex")]
    storage: std::sync::Weak<burn::tensor::Bytes>,
    #[cfg(feature = "flex")]
    layout: burn::backend::flex::Layout,
}

impl StorageKey {
    /// Whether `view` reads the elements this key was taken from, in the same storage.
    pub fn reads(&self, view: &HostValues) -> bool {
        match &view.0 {
            #[cfg(feature = "flex")]
            Read::InPlace(flex) => {
                std::ptr::eq(self.storage.as_ptr(), Arc::as_ptr(&flex.data_arc()))
                    && &self.layout == flex.layout()
            }
            Read::Copied(_) => false,
        }
    }
}

impl std::fmt::Debug for HostValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostValues")
            .field("len", &self.values().len())
            .field("in_place", &self.in_place())
            .finish()
    }
}

/// `len` f32 zeros written by every rayon thread, for host kernels that then fill them in
/// parallel: a single thread's memset of each output was 1–2% of a training step on Flex
/// (docs/PERFORMANCE.md).
///
/// ```
/// assert_eq!(kiln_kernels::zeros(3), [0.0; 3]);
/// ```
pub fn zeros(len: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = Vec::new();
    (0..len)
        .into_par_iter()
        .with_min_len(1 << 16)
        .map(|_| 0.0)
        .collect_into_vec(&mut out);
    out
}

/// `Σ x²` of host values, in f64, over every rayon thread (a gradient's norm: burn-flex squares
/// and sums a tensor on one thread, into a temporary as large as it).
///
/// ```
/// assert_eq!(kiln_kernels::sum_of_squares(&[3.0, -4.0]), 25.0);
/// ```
pub fn sum_of_squares(values: &[f32]) -> f64 {
    use rayon::prelude::*;
    // The chunks' sums added in the chunks' order: the same sum whatever the threads, so that
    // clipping by it is reproducible.
    let sums: Vec<f64> = values
        .par_chunks(1 << 14)
        .map(chunk_sum_of_squares)
        .collect();
    sums.iter().sum()
}

/// `Σ x²` of one chunk in [`LANES`] independent f64 sums, which the compiler keeps in vector
/// registers: one sum in order waits on every addition (4 cycles a value), which made clipping
/// fVLM's 157 M gradients 7% of a training step (docs/PERFORMANCE.md).
fn chunk_sum_of_squares(chunk: &[f32]) -> f64 {
    const LANES: usize = 16;
    let mut sums = [0.0f64; LANES];
    let mut rows = chunk.chunks_exact(LANES);
    for row in &mut rows {
        for (sum, &x) in sums.iter_mut().zip(row) {
            *sum += f64::from(x * x);
        }
    }
    let rest: f64 = rows.remainder().iter().map(|&x| f64::from(x * x)).sum();
    sums.iter().sum::<f64>() + rest
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::DType;

    /// A view read in place keeps the storage shared, so an operation that could write in place
    /// copies instead and the view's values stay as read.
    #[test]
    fn a_view_keeps_its_values() {
        let device = Default::default();
        let x = Tensor::<Flex, 1>::from_floats([1.0, 2.0, 3.0], &device);
        let read = HostValues::of(&x);
        assert!(read.in_place());
        let y = x.add_scalar(1.0);
        assert_eq!(read.values(), &[1.0, 2.0, 3.0]);
        assert_eq!(HostValues::of(&y).values(), &[2.0, 3.0, 4.0]);
        assert!(!read.same_storage(&HostValues::of(&y)));
    }

    /// Views of different elements of one storage do not match; other dtypes are copied.
    #[test]
    fn slices_and_other_dtypes() {
        let device = Default::default();
        let x = Tensor::<Flex, 1>::from_floats([1.0, 2.0, 3.0, 4.0], &device);
        let (a, b) = (x.clone().slice(0..2), x.clone().slice(2..4));
        assert!(!HostValues::of(&a).same_storage(&HostValues::of(&b)));
        assert_eq!(HostValues::of(&b).values(), &[3.0, 4.0]);
        let half = x.cast(DType::F16);
        let read = HostValues::of(&half);
        assert!(!read.in_place());
        assert_eq!(read.values(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(read.storage_key().is_none());
    }

    /// A key matches the view it was taken from without keeping the storage shared: the
    /// tensor's next operation writes in place (the same buffer, not a copy), and the key no
    /// longer matches what it wrote.
    #[test]
    fn a_key_leaves_the_storage_to_its_tensor() {
        let device = Default::default();
        let x = Tensor::<Flex, 1>::from_floats([1.0, 2.0, 3.0], &device);
        let read = HostValues::of(&x);
        let (key, buffer) = (
            read.storage_key().expect("in place"),
            read.values().as_ptr(),
        );
        assert!(key.reads(&HostValues::of(&x)));
        assert!(!key.reads(&HostValues::of(&x.clone().slice(1..3))));
        drop(read);
        let y = x.add_scalar(1.0);
        let stepped = HostValues::of(&y);
        assert_eq!(stepped.values(), &[2.0, 3.0, 4.0]);
        assert_eq!(stepped.values().as_ptr(), buffer, "written in place");
        assert!(!key.reads(&stepped));
    }

    /// The sum of squares in lanes is the f64 sum of the same squares (odd lengths, past one
    /// parallel chunk).
    #[test]
    fn sums_of_squares_are_the_f64_sums() {
        for len in [0, 1, 15, 17, 1000, (1 << 14) + 33, 3 << 15] {
            let values: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
                .collect();
            let want: f64 = values.iter().map(|&x| f64::from(x * x)).sum();
            let got = sum_of_squares(&values);
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "{len}: {got} vs {want}"
            );
        }
    }
}
