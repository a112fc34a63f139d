//! The files a run reads and writes, checked together before any work.

use std::fs;
use std::path::{Path, PathBuf};

use crate::FileError;
use crate::atomic::{Kind, expect_kind};

/// Every file and directory a run reads (inputs) and writes (outputs: files, result
/// directories, caches, checkpoint directories), each with what it is for (the flag as typed:
/// "the structures (--input)"). [`RunFiles::check`] refuses, before any work:
/// - an output that is an input, or lies inside an input directory (a rerun would read its own
///   outputs as data);
/// - an input that lies inside an output directory (the run would write among it, or over it);
/// - an output that exists and is not what kiln writes there (a directory where a file goes, a
///   link, a FIFO).
///
/// Paths are compared by what they lead to (the same file through another spelling, `..` or a
/// link is caught), not how they are written.
///
/// ```
/// use kiln_io::RunFiles;
///
/// let dir = tempfile::tempdir().unwrap();
/// let train = dir.path().join("runs/train.extxyz");
/// std::fs::create_dir(dir.path().join("runs")).unwrap();
/// std::fs::write(&train, "1\n\nH 0 0 0\n").unwrap();
/// let err = RunFiles::new()
///     .input("the training structures (--train)", &train)
///     .output_dir("the run's directory (--out)", dir.path().join("runs"))
///     .check()
///     .unwrap_err();
/// assert!(err.to_string().contains("lies inside the run's directory (--out)"), "{err}");
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunFiles {
    inputs: Vec<Input>,
    outputs: Vec<Output>,
}

#[derive(Debug, Clone)]
struct Output {
    role: String,
    path: PathBuf,
    kind: Kind,
    /// A cache: it only adds entries of its own, so inputs may lie inside it.
    may_hold_inputs: bool,
}

#[derive(Debug, Clone)]
struct Input {
    role: String,
    path: PathBuf,
    id: FileId,
    is_dir: bool,
}

impl RunFiles {
    /// No files yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path`, read as `role`: a file, or a directory whose contents are all inputs. A path
    /// that cannot be looked at (missing) is left out: nothing there can be overwritten, and
    /// reading it fails with its own message.
    pub fn input(mut self, role: &str, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        if let Ok(meta) = fs::metadata(path) {
            self.inputs.push(Input {
                role: role.to_string(),
                path: path.to_path_buf(),
                id: FileId::of(path, &meta),
                is_dir: meta.is_dir(),
            });
        }
        self
    }

    /// Adds `path`, a file the run writes as `role`.
    pub fn output(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_output(role, path.as_ref(), Kind::File, false)
    }

    /// Adds `path`, a directory the run writes into as `role`.
    pub fn output_dir(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_output(role, path.as_ref(), Kind::Dir, false)
    }

    /// Adds `path`, a cache directory the run adds entries of its own to as `role`: it may not
    /// be an input or lie inside one (its entries would join the inputs), but inputs may lie
    /// inside it, since it never writes over what it did not make.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let images = dir.path().join("images");
    /// std::fs::create_dir(&images).unwrap();
    /// let files = |cache| kiln_io::RunFiles::new().input("the images", &images).cache_dir("cache_dir", cache);
    /// let err = files(images.join("cache")).check().unwrap_err().to_string();
    /// assert!(err.contains("is inside the images"), "{err}");
    /// files(dir.path().to_path_buf()).check().unwrap();
    /// ```
    pub fn cache_dir(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_output(role, path.as_ref(), Kind::Dir, true)
    }

    fn with_output(mut self, role: &str, path: &Path, kind: Kind, may_hold_inputs: bool) -> Self {
        self.outputs.push(Output {
            role: role.to_string(),
            path: path.to_path_buf(),
            kind,
            may_hold_inputs,
        });
        self
    }

    /// Refuses the first output that may not be written (see the type's docs).
    pub fn check(&self) -> Result<(), FileError> {
        for output in &self.outputs {
            let named = |e: FileError| e.for_role(&output.role);
            expect_kind(&output.path, output.kind).map_err(named)?;
            self.output_against_inputs(&output.path).map_err(named)?;
            if output.kind == Kind::Dir && !output.may_hold_inputs {
                self.inputs_against_output_dir(&output.role, &output.path)?;
            }
        }
        Ok(())
    }

    fn output_against_inputs(&self, output: &Path) -> Result<(), FileError> {
        for (depth, id) in ancestors(output)? {
            let relation = if depth == 0 { "is" } else { "is inside" };
            let hit = self
                .inputs
                .iter()
                .find(|input| input.id == id && (depth == 0 || input.is_dir));
            if let Some(input) = hit {
                return Err(FileError::IsInput {
                    path: output.to_path_buf(),
                    relation,
                    role: input.role.clone(),
                    input: input.path.clone(),
                });
            }
        }
        Ok(())
    }

    fn inputs_against_output_dir(&self, role: &str, output: &Path) -> Result<(), FileError> {
        let Ok(meta) = fs::metadata(output) else {
            return Ok(());
        };
        let dir = FileId::of(output, &meta);
        for input in &self.inputs {
            let inside = ancestors(&input.path)?
                .into_iter()
                .any(|(depth, id)| depth > 0 && id == dir);
            if inside {
                return Err(FileError::HoldsInput {
                    path: input.path.clone(),
                    role: input.role.clone(),
                    output_role: role.to_string(),
                    output: output.to_path_buf(),
                });
            }
        }
        Ok(())
    }
}

/// What `path` and each directory above it lead to, with their depth (0: the path itself);
/// places that do not exist are left out.
fn ancestors(path: &Path) -> Result<Vec<(usize, FileId)>, FileError> {
    let absolute = std::path::absolute(path).map_err(|e| FileError::io(path, e))?;
    Ok(absolute
        .ancestors()
        .enumerate()
        .filter_map(|(depth, place)| {
            let meta = fs::metadata(place).ok()?;
            Some((depth, FileId::of(place, &meta)))
        })
        .collect())
}

/// What a path leads to: the device and inode on Unix, the canonical path elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileId {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg_attr(unix, allow(dead_code))]
    Path(PathBuf),
}

impl FileId {
    fn of(path: &Path, meta: &fs::Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let _ = path;
            FileId::Inode(meta.dev(), meta.ino())
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            FileId::Path(fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that is an input under another spelling or through a link, or lies inside an
    /// input directory, is refused naming both roles; so is an input inside an output
    /// directory; other outputs pass.
    #[test]
    fn outputs_and_inputs_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("model.safetensors"), "weights").unwrap();
        let frames = dir.path().join("frames.xyz");
        fs::write(&frames, "frames").unwrap();
        let inputs = RunFiles::new()
            .input("the model directory", &model)
            .input("the structures", &frames)
            .input("the missing", dir.path().join("missing"));
        let refused = |files: RunFiles, message: &str| {
            let err = files.check().unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        };
        let file = |path: PathBuf| inputs.clone().output("--out", path);
        let err = file(frames.clone()).check().unwrap_err().to_string();
        assert!(err.starts_with("--out "), "{err}");
        refused(file(frames.clone()), "is the structures");
        refused(file(model.join("../frames.xyz")), "is the structures");
        refused(
            file(model.join("model.safetensors")),
            "is inside the model directory",
        );
        refused(
            file(model.join("new.json")),
            "is inside the model directory",
        );
        #[cfg(unix)]
        {
            let link = dir.path().join("link.xyz");
            std::os::unix::fs::symlink(&frames, &link).unwrap();
            // A link is not a regular file: refused before being followed.
            refused(file(link), "symbolic link");
        }
        file(dir.path().join("out.xyz")).check().unwrap();
        file(dir.path().join("missing")).check().unwrap();
        let out_dir = |path: PathBuf| inputs.clone().output_dir("--out", path);
        out_dir(dir.path().join("runs")).check().unwrap();
        refused(out_dir(model.clone()), "is the model directory");
        refused(out_dir(frames.clone()), "is a file, where a directory");
        refused(
            out_dir(dir.path().to_path_buf()),
            "lies inside --out, where this run writes",
        );
        assert_eq!(fs::read(&frames).unwrap(), b"frames");
        // A path through a file is refused naming the file, not "File exists".
        let notes = dir.path().join("notes.txt");
        fs::write(&notes, "notes").unwrap();
        let under = RunFiles::new().output_dir("--out", notes.join("run/a"));
        refused(under, "notes.txt above it is a file, not a directory");
        let err = RunFiles::new()
            .output("--output", notes.join("out.xyz"))
            .check()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--output "), "{err}");
    }
}
