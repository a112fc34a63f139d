//! Checkpoints, for every model family: where they come from (a directory, or a Hugging Face id
//! with the `hub` feature), their `config.json`, their safetensors weights checked against the
//! model before anything is loaded, and kiln's own saved models.
//!
//! Every failure is a [`CheckpointError`] that names the file, and for tensors each
//! [`TensorProblem`]'s tensor in the checkpoint's own names, so callers can branch on what went
//! wrong:
//!
//! ```
//! use kiln_core::{CheckpointError, Problem};
//!
//! fn missing_tensors(error: &CheckpointError) -> Vec<&str> {
//!     error
//!         .problems()
//!         .iter()
//!         .filter(|p| matches!(p.problem, Problem::Missing { .. }))
//!         .map(|p| p.tensor.as_str())
//!         .collect()
//! }
//! # let error = CheckpointError::NoWeights { dir: "model".into() };
//! # assert!(missing_tensors(&error).is_empty());
//! ```

mod check;
mod config;
mod hub;
mod layout;
mod load;
mod save;

use std::fmt;
use std::path::{Path, PathBuf};

pub use check::{CheckpointFit, check_checkpoint, check_snapshots};
pub use config::{SettingError, config_file, config_from_json, read_config};
#[cfg(feature = "hub")]
pub use hub::Hub;
pub use hub::checkpoint_dir;
pub use layout::TorchLayout;
pub use load::{
    load_checkpoint, load_checkpoint_keeping, load_snapshots, load_snapshots_keeping, read_tensor,
    read_tensors, shards, tensor_shapes, weight_files, weights_identity,
};
pub use save::{save_checkpoint, save_weights};

/// Why a checkpoint cannot be found, read, checked, loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file that is missing, cannot be read, or is not what its name says (a safetensors
    /// file, a shard index, a `config.json`).
    #[error("{}: {reason}", file.display())]
    Unreadable {
        /// The file.
        file: PathBuf,
        /// What went wrong, in the reader's words.
        reason: String,
    },
    /// A directory holding neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{}: neither model.safetensors nor model.safetensors.index.json", dir.display())]
    NoWeights {
        /// The directory.
        dir: PathBuf,
    },
    /// A `config.json` setting of the wrong type, or missing.
    #[error("{}: {error}", file.display())]
    Config {
        /// The `config.json`.
        file: PathBuf,
        /// The setting and what is wrong with it.
        error: SettingError,
    },
    /// Tensors the model needs that the checkpoint lacks or holds in a form it cannot use,
    /// every one of them.
    #[error(
        "{}: {} tensor(s) cannot be loaded:\n  {}",
        checkpoint.display(),
        problems.len(),
        Listed(problems)
    )]
    Tensors {
        /// The weight file, or the directory of a sharded checkpoint's files.
        checkpoint: PathBuf,
        /// Each tensor and its problem, sorted by name.
        problems: Vec<TensorProblem>,
    },
    /// A name that is neither a local directory nor a Hugging Face id that can be fetched.
    #[error("{name}: {reason}")]
    NotFound {
        /// The directory or id as given.
        name: String,
        /// Why it could not be had.
        reason: String,
    },
    /// A loader's key renaming that is not a valid regular expression (a bug in the loader).
    #[error("a key remapping of the loader's: {0}")]
    Remapping(String),
    /// A model whose weights the machine or device has no memory for, refused before any is
    /// loaded.
    #[error(transparent)]
    Memory(#[from] crate::MemoryError),
    /// A file that could not be written (the disk is full, the directory is not writable).
    #[error(transparent)]
    Write(#[from] kiln_io::FileError),
}

impl CheckpointError {
    /// The tensors' problems of a [`CheckpointError::Tensors`]; empty for the other kinds.
    pub fn problems(&self) -> &[TensorProblem] {
        match self {
            CheckpointError::Tensors { problems, .. } => problems,
            _ => &[],
        }
    }

    /// A read that failed; kiln-io's message names the path already.
    pub(crate) fn read(file: &Path, error: kiln_io::FileError) -> Self {
        let said = error.to_string();
        let prefix = format!("{}: ", file.display());
        let reason = said.strip_prefix(&prefix).unwrap_or(&said);
        CheckpointError::unreadable(file, reason)
    }

    pub(crate) fn unreadable(file: &Path, reason: impl fmt::Display) -> Self {
        CheckpointError::Unreadable {
            file: file.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

/// One tensor the model needs, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorProblem {
    /// The tensor's name as the checkpoint stores it (as the model would look for it, when
    /// missing).
    pub tensor: String,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a tensor the model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The checkpoint does not hold it; the model needs this shape (PyTorch's dimension order).
    Missing {
        /// The shape the model needs.
        needed: Vec<usize>,
    },
    /// Stored with an integer or boolean dtype.
    Dtype {
        /// The stored dtype, as burn names it (`I64`).
        stored: String,
    },
    /// Stored with another shape.
    Shape {
        /// The checkpoint's shape.
        stored: Vec<usize>,
        /// The model's.
        needed: Vec<usize>,
        /// The `config.json` settings behind the model's sizes (`hidden_size = 64`).
        settings: Vec<String>,
    },
    /// Holds NaN or infinite values: the checkpoint is damaged or its training diverged.
    NonFinite {
        /// How many.
        count: usize,
        /// The first one's flat index.
        first: usize,
    },
    /// Its values cannot be read.
    Unreadable {
        /// The reader's words.
        reason: String,
    },
}

impl fmt::Display for TensorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tensor = &self.tensor;
        match &self.problem {
            Problem::Missing { needed } => write!(f, "{tensor} {needed:?}: not in the checkpoint"),
            Problem::Dtype { stored } => write!(
                f,
                "{tensor}: stored as {stored}; the model needs floating-point values (f32, f16, \
                 bf16 or f64)"
            ),
            Problem::Shape {
                stored,
                needed,
                settings,
            } => {
                write!(
                    f,
                    "{tensor}: the checkpoint has {stored:?}, the model needs {needed:?}"
                )?;
                if !settings.is_empty() {
                    write!(f, "; set by config.json's {}", settings.join(", "))?;
                }
                Ok(())
            }
            Problem::NonFinite { count, first } => write!(
                f,
                "{tensor}: holds {count} non-finite value(s) (NaN or infinity), the first at flat \
                 index {first}: the checkpoint is damaged or its training diverged"
            ),
            Problem::Unreadable { reason } => write!(f, "{tensor}: cannot be read: {reason}"),
        }
    }
}

/// Problems one per line, indented under the error's first line.
struct Listed<'a>(&'a [TensorProblem]);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n  ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}
