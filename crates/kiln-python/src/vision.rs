//! Image embeddings from Python: `Encoder(model_dir, device, policy).embed(images, batch)`, what
//! `kiln.vision.embed` calls. Images are decoded and preprocessed by kiln-cache exactly as the
//! checkpoint's Hugging Face processor (PIL backend) does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use image::RgbImage;
use kiln_cache::{DEFAULT_MAX_PIXELS, Preprocess, decode, to_chw};
use kiln_core::{DeviceJob, Policy, PolicySpec};
use kiln_vision::{VisionError, VisionModel};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray3};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A loaded tower on its device, whichever backend that is: normalised pixels
/// `[n, 3, h, w]` in, embeddings `[n, d]` (f32) out.
trait Embed: Send {
    fn embed(&self, pixels: Vec<f32>, shape: [usize; 4]) -> PyResult<(Vec<f32>, usize)>;
    /// The width of an embedding (the shape's second axis, even for no images).
    fn width(&self) -> usize;
}

struct OnDevice<B: Backend> {
    model: VisionModel<B>,
    policy: Policy,
    device: B::Device,
}

impl<B: Backend> Embed for OnDevice<B> {
    fn embed(&self, pixels: Vec<f32>, shape: [usize; 4]) -> PyResult<(Vec<f32>, usize)> {
        self.model.check_pixels(shape).map_err(|e| error(&e))?;
        let pixels = Tensor::<B, 4>::from_data(TensorData::new(pixels, shape), &self.device);
        let embedded = self
            .policy
            .cast_output(self.model.forward(self.policy.cast_input(pixels)));
        let embedded = embedded.cast(FloatDType::F32);
        let dims = embedded.dims()[1];
        let values = embedded
            .into_data()
            .to_vec::<f32>()
            .map_err(|e| PyRuntimeError::new_err(format!("reading the embeddings back: {e:?}")))?;
        Ok((values, dims))
    }

    fn width(&self) -> usize {
        self.model.embedding_width()
    }
}

/// Loads a checkpoint directory on the job's backend under a policy.
struct Load {
    dir: PathBuf,
    policy: PolicySpec,
}

impl DeviceJob for Load {
    type Output = PyResult<Box<dyn Embed>>;

    fn run<B: Backend>(self, device: &B::Device) -> Self::Output {
        let policy = crate::resolve::<B>(&self.policy, device)?;
        let model =
            VisionModel::<B>::from_hf_dir(&self.dir, device, &policy).map_err(|e| error(&e))?;
        let device = device.clone();
        Ok(Box::new(OnDevice {
            model,
            policy,
            device,
        }))
    }
}

/// An image as Python gives it: a file to decode, or decoded RGB pixels.
enum Source {
    File(PathBuf),
    Pixels(RgbImage),
}

/// A vision tower (CLIP, SigLIP / SigLIP2, DINOv2) from a Hugging Face checkpoint directory, with
/// its processor, on one device.
#[pyclass(module = "kiln._kiln", frozen)]
pub struct Encoder {
    model: Mutex<Box<dyn Embed>>,
    preprocess: Preprocess,
}

#[pymethods]
impl Encoder {
    /// Loads `model_dir` (config.json, weights, preprocessor_config.json) on `device` under the
    /// precision `policy` (`full`, `mixed-bf16`, ...).
    #[new]
    #[pyo3(signature = (model_dir, device = "cpu", policy = "full"))]
    fn new(py: Python<'_>, model_dir: PathBuf, device: &str, policy: &str) -> PyResult<Self> {
        let preprocess = preprocess(&model_dir)?;
        let job = Load {
            dir: model_dir,
            policy: crate::policy(policy)?,
        };
        let model = crate::released(py, || crate::on_device(device, job))???;
        Ok(Encoder {
            model: Mutex::new(model),
            preprocess,
        })
    }

    /// The embeddings `[len(images), d]` (float32) of `images`, each a path or an `(H, W, 3)`
    /// uint8 array, `batch` at a time.
    #[pyo3(signature = (images, batch = 32))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        images: Vec<Bound<'py, PyAny>>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if batch == 0 {
            return Err(PyValueError::new_err("batch must be at least 1"));
        }
        let sources = images
            .iter()
            .enumerate()
            .map(|(index, image)| source(index, image))
            .collect::<PyResult<Vec<_>>>()?;
        let (values, dims) = crate::released(py, || self.embed_all(&sources, batch))??;
        let rows = sources.len();
        Ok(Array2::from_shape_vec((rows, dims), values)
            .expect("one embedding per image")
            .into_pyarray(py))
    }
}

impl Encoder {
    /// Preprocesses and embeds every image, `batch` at a time: the values row by row and the
    /// embedding's width.
    fn embed_all(&self, sources: &[Source], batch: usize) -> PyResult<(Vec<f32>, usize)> {
        let model = self.model.lock().map_err(|_| crate::poisoned())?;
        let (mut values, mut dims) = (Vec::new(), model.width());
        let mut size = None;
        for (chunk_index, chunk) in sources.chunks(batch).enumerate() {
            let mut pixels = Vec::new();
            for (offset, source) in chunk.iter().enumerate() {
                let index = chunk_index * batch + offset;
                let image = self.prepared(index, source)?;
                let here = (image.height() as usize, image.width() as usize);
                if *size.get_or_insert(here) != here {
                    return Err(PyValueError::new_err(format!(
                        "image {}: {}×{} after preprocessing, where image 1 is {}×{}: this \
                         processor keeps each image's own size, so embed them one call each",
                        index + 1,
                        here.0,
                        here.1,
                        size.unwrap_or(here).0,
                        size.unwrap_or(here).1
                    )));
                }
                self.normalise(&image, &mut pixels);
            }
            let (height, width) = size.unwrap_or((0, 0));
            let (embedded, width_out) = model.embed(pixels, [chunk.len(), 3, height, width])?;
            values.extend(embedded);
            dims = width_out;
        }
        Ok((values, dims))
    }

    /// Image `index` decoded (for a file), resized and cropped as the processor says.
    fn prepared(&self, index: usize, source: &Source) -> PyResult<RgbImage> {
        let fail =
            |e: &dyn std::fmt::Display| PyValueError::new_err(format!("image {}: {e}", index + 1));
        let decoded;
        let image = match source {
            Source::File(path) => {
                decoded = decode(path, DEFAULT_MAX_PIXELS).map_err(|e| fail(&e))?;
                &decoded
            }
            Source::Pixels(image) => image,
        };
        self.preprocess.resize_and_crop(image).map_err(|e| fail(&e))
    }

    /// Appends `image`'s planes rescaled and normalised as the processor says.
    fn normalise(&self, image: &RgbImage, pixels: &mut Vec<f32>) {
        let (scale, offset) = self.preprocess.affine();
        let chw = to_chw(image);
        let plane = chw.len() / 3;
        pixels.extend(
            chw.iter()
                .enumerate()
                .map(|(i, &v)| f32::from(v) * scale[i / plane] + offset[i / plane]),
        );
    }
}

/// Image `index` of the call: a path (str or os.PathLike) or an `(H, W, 3)` uint8 array.
fn source(index: usize, image: &Bound<'_, PyAny>) -> PyResult<Source> {
    if let Ok(array) = image.extract::<PyReadonlyArray3<'_, u8>>() {
        let view = array.as_array();
        let [height, width, channels] = [view.shape()[0], view.shape()[1], view.shape()[2]];
        if channels != 3 {
            return Err(PyValueError::new_err(format!(
                "image {}: an array of shape {:?}: expected (height, width, 3) RGB",
                index + 1,
                view.shape()
            )));
        }
        let side = |length: usize| u32::try_from(length).ok().filter(|&side| side > 0);
        let (Some(width), Some(height)) = (side(width), side(height)) else {
            return Err(PyValueError::new_err(format!(
                "image {}: an array of shape {:?}: each side needs 1 to {} pixels",
                index + 1,
                view.shape(),
                u32::MAX
            )));
        };
        let values = match array.as_slice() {
            Ok(contiguous) => contiguous.to_vec(),
            Err(_) => view.iter().copied().collect(),
        };
        let image = RgbImage::from_raw(width, height, values).expect("h × w × 3 values");
        return Ok(Source::Pixels(image));
    }
    let path: PathBuf = image.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "image {}: a {}, expected a path or an (H, W, 3) uint8 numpy array",
            index + 1,
            image
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    if !Path::new(&path).is_file() {
        return Err(PyFileNotFoundError::new_err(format!(
            "image {}: {}: no such file",
            index + 1,
            path.display()
        )));
    }
    Ok(Source::File(path))
}

/// The preprocessing of `model_dir`'s Hugging Face processor (`preprocessor_config.json`):
/// `FileNotFoundError` when it is missing, `ValueError` when kiln cannot follow it.
pub(crate) fn preprocess(model_dir: &Path) -> PyResult<Preprocess> {
    let processor = model_dir.join("preprocessor_config.json");
    if !processor.is_file() {
        return Err(PyFileNotFoundError::new_err(format!(
            "{}: no such file (the checkpoint's Hugging Face processor)",
            processor.display()
        )));
    }
    Preprocess::from_hf_config(&processor).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A vision error as the Python exception it is.
pub(crate) fn error(error: &VisionError) -> PyErr {
    match error {
        VisionError::Checkpoint(e) => crate::checkpoint_error(e),
        _ => PyValueError::new_err(error.to_string()),
    }
}
