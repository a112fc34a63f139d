//! How kiln writes files: whole or not at all, never over a file it did not mean to replace.
//!
//! - [`write_atomic`] / [`write_atomic_with`] / [`write_atomic_at`]: a file's new contents go
//!   to a temporary file beside it, created exclusively under a name no user file has
//!   (`.NAME.kiln-PID-N.tmp`), flushed to the disk, then renamed over the target. A crash leaves
//!   the old file or the new one, and a file that happens to be called like the target with
//!   another extension is never touched.
//! - [`StagedDir`]: the same for a directory (checkpoints, cache entries, generated datasets).
//! - [`checksum`]: the checksum of every file kiln reads back; [`fingerprint`]: what identifies
//!   a run's input file or directory, to tell at resume whether it changed.
//! - [`RunFiles`]: the files and directories a run reads and writes; [`RunFiles::check`]
//!   refuses, before any work starts, an output that is an input or lies inside an input
//!   directory, an input that lies inside an output directory, and an output that is not what
//!   kiln writes there.
//! - [`read_text`]: a text file the user gave, UTF-8, a byte-order mark taken off and said so.
//! - [`InputFile`]: a file the user gave (a model's weights), refused unless it is a regular
//!   file and read by position, so that one cut short while it is read is an error, not a
//!   `SIGBUS`.
//! - [`remove_stale_temporaries`]: what a killed run left beside a target is removed by the next
//!   one (done before every staged write).
//!
//! ```
//! use kiln_io::{RunFiles, write_atomic};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let input = dir.path().join("frames.xyz");
//! std::fs::write(&input, "1\n\nH 0 0 0\n").unwrap();
//! let files = |output| RunFiles::new().input("the structures (--input)", &input).output("--output", output);
//!
//! let err = files(&input).check().unwrap_err();
//! assert!(err.to_string().contains("is the structures (--input)"), "{err}");
//!
//! let output = dir.path().join("results.xyz");
//! files(&output).check().unwrap();
//! write_atomic(&output, b"1\n\nH 0 0 0\n").unwrap();
//! assert_eq!(std::fs::read(&output).unwrap(), b"1\n\nH 0 0 0\n");
//! ```

mod atomic;
mod checksum;
mod input;
mod run_files;
mod text;

use std::path::{Path, PathBuf};

pub use atomic::{
    StagedDir, StagedFile, remove_stale_temporaries, write_atomic, write_atomic_at,
    write_atomic_with, write_json,
};
pub use checksum::{checksum, fingerprint};
pub use input::{InputFile, check_regular};
pub use run_files::RunFiles;
pub use text::read_text;

/// Why a file could not be read or written safely. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The operating system refused.
    #[error("{}: {}", path.display(), said(source))]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The output exists and is not what kiln writes there (a regular file, or a directory):
    /// a directory where a file goes, a link, a FIFO, a device.
    #[error(
        "{}: is {found}, where {expected} would be written; refusing to replace it (choose another output path)",
        path.display()
    )]
    WrongKind {
        /// The output.
        path: PathBuf,
        /// What is there.
        found: &'static str,
        /// What kiln would write: "a file" or "a directory".
        expected: &'static str,
    },
    /// A text input holds bytes that are not UTF-8.
    #[error(
        "{}, line {line}, column {column}: not UTF-8 text (byte {byte:#04x})",
        path.display()
    )]
    NotText {
        /// The file.
        path: PathBuf,
        /// 1-based line of the first such byte.
        line: usize,
        /// 1-based column (in characters) of the first such byte.
        column: usize,
        /// The byte.
        byte: u8,
    },
    /// An output's path runs through a file, where a directory would have to be.
    #[error(
        "{}: cannot be made, as {} above it is {found}, not a directory (choose another output path)",
        path.display(),
        blocker.display()
    )]
    UnderNonDirectory {
        /// The output.
        path: PathBuf,
        /// The file on its path.
        blocker: PathBuf,
        /// What the blocker is ("a file").
        found: &'static str,
    },
    /// The output is one of the run's inputs, or lies inside an input directory.
    #[error(
        "{}: {relation} {role} ({}); refusing to overwrite an input (choose another output path)",
        path.display(),
        input.display()
    )]
    IsInput {
        /// The output.
        path: PathBuf,
        /// "is" or "is inside".
        relation: &'static str,
        /// What the input is for, e.g. "the model's checkpoint".
        role: String,
        /// The input as given.
        input: PathBuf,
    },
    /// An input lies inside a directory the run writes into.
    #[error(
        "{role} {}: lies inside {output_role}, where this run writes ({}); refusing to write among the inputs (choose another {output_role}, or move the input)",
        path.display(),
        output.display()
    )]
    HoldsInput {
        /// The input.
        path: PathBuf,
        /// What the input is for.
        role: String,
        /// What the output directory is for.
        output_role: String,
        /// The output directory.
        output: PathBuf,
    },
    /// An input that is not a regular file: a directory, a FIFO (which would block the read
    /// forever), a socket or a device.
    #[error("{}: is {found}, where a file is read", path.display())]
    NotAFile {
        /// The input.
        path: PathBuf,
        /// What is there ("a directory", "a FIFO").
        found: &'static str,
    },
    /// An input that ends before the bytes its reader needs, although it was long enough when
    /// it was opened: cut short or replaced while kiln read it.
    #[error(
        "{}: ended at byte {ended} while kiln read it up to byte {wanted}: it was cut short or \
         replaced during the run (run again once it is complete)",
        path.display()
    )]
    Changed {
        /// The input.
        path: PathBuf,
        /// Where it ended.
        ended: u64,
        /// Where the read was to end.
        wanted: u64,
    },
    /// An input of the wrong kind: a directory where a file is read, or the other way round.
    #[error("{role}: {} is {found}, where {expected} is read", path.display())]
    InputKind {
        /// What the input is for (the flag, with what it takes).
        role: String,
        /// The input.
        path: PathBuf,
        /// What is there: "a directory" or "a file".
        found: &'static str,
        /// What the run reads there: "a file" or "a directory".
        expected: &'static str,
    },
    /// An output refused for the reason inside, named by its role (the flag).
    #[error("{role} {source}")]
    Output {
        /// What the output is for, e.g. `--out`.
        role: String,
        /// Why it is refused.
        source: Box<FileError>,
    },
}

impl FileError {
    /// This error about the output `role` (the flag that names it).
    pub fn for_role(self, role: &str) -> Self {
        FileError::Output {
            role: role.to_string(),
            source: Box::new(self),
        }
    }

    /// An I/O error on `path`.
    ///
    /// ```
    /// let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
    /// let err = kiln_io::FileError::io(std::path::Path::new("run/metrics.jsonl"), full);
    /// assert!(err.to_string().starts_with("run/metrics.jsonl: no space left on the device while writing it"));
    /// ```
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        FileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What the system said, in the user's terms where the system's own words are terse or
/// internal (`No such device (os error 19)`, `File exists (os error 17)`), for a message that
/// names the file itself.
pub fn said(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::StorageFull => format!(
            "no space left on the device while writing it ({error}): free some space and run \
             the same command again"
        ),
        ErrorKind::NotFound => "does not exist".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::AlreadyExists => "already exists".into(),
        ErrorKind::IsADirectory => "is a directory, where a file is read or written".into(),
        ErrorKind::NotADirectory => "a part of this path is a file, not a directory".into(),
        ErrorKind::ReadOnlyFilesystem => "lies on a read-only file system".into(),
        _ => match error.raw_os_error() {
            Some(code) => {
                let words = error.to_string();
                let suffix = format!(" (os error {code})");
                words.strip_suffix(&suffix).unwrap_or(&words).to_lowercase()
            }
            None => error.to_string(),
        },
    }
}
