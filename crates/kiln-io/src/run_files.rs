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
    /// What the run reads there, where it reads only one kind.
    expected: Option<Kind>,
}

impl RunFiles {
    /// No files yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path`, read as `role`: a file, or a directory whose contents are all inputs. A path
    /// that cannot be looked at (missing) is left out: nothing there can be overwritten, and
    /// reading it fails with its own message.
    pub fn input(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_input(role, path.as_ref(), None)
    }

    /// Adds `path`, a file read as `role`; [`RunFiles::check`] refuses a directory there,
    /// naming the role (say what the flag takes in it: "--model (a GGUF file; a model
    /// directory goes to --model-dir)").
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let err = kiln_io::RunFiles::new()
    ///     .input_file("--model (a GGUF file)", dir.path())
    ///     .check()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("is a directory, where a file is read"), "{err}");
    /// ```
    pub fn input_file(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_input(role, path.as_ref(), Some(Kind::File))
    }

    /// Adds `path`, a directory read as `role`; [`RunFiles::check`] refuses a file there.
    pub fn input_dir(self, role: &str, path: impl AsRef<Path>) -> Self {
        self.with_input(role, path.as_ref(), Some(Kind::Dir))
    }

    fn with_input(mut self, role: &str, path: &Path, expected: Option<Kind>) -> Self {
        if let Ok(meta) = fs::metadata(path) {
            self.inputs.push(Input {
                role: role.to_string(),
                path: path.to_path_buf(),
                id: FileId::of(path, &meta),
                is_dir: meta.is_dir(),
                expected,
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

    /// Refuses the first input of the wrong kind, then the first output that may not be
    /// written (see the type's docs). An output that is an input is named as that clash before
    /// anything else is said of it.
    pub fn check(&self) -> Result<(), FileError> {
        for input in &self.inputs {
            let kind = match input.expected {
                Some(Kind::File) if input.is_dir => ("a directory", "a file"),
                Some(Kind::Dir) if !input.is_dir => ("a file", "a directory"),
                _ => continue,
            };
            return Err(FileError::InputKind {
                role: input.role.clone(),
                path: input.path.clone(),
                found: kind.0,
                expected: kind.1,
            });
        }
        for output in &self.outputs {
            let named = |e: FileError| e.for_role(&output.role);
            self.output_against_inputs(&output.path).map_err(named)?;
            expect_kind(&output.path, output.kind).map_err(named)?;
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
            // A link to an input is named as that input; any other link is not a regular
            // file, refused without being followed.
            refused(file(link), "is the structures");
            let elsewhere = dir.path().join("elsewhere.xyz");
            fs::write(&elsewhere, "other").unwrap();
            let other_link = dir.path().join("other-link.xyz");
            std::os::unix::fs::symlink(&elsewhere, &other_link).unwrap();
            refused(file(other_link), "symbolic link");
        }
        file(dir.path().join("out.xyz")).check().unwrap();
        file(dir.path().join("missing")).check().unwrap();
        let out_dir = |path: PathBuf| inputs.clone().output_dir("--out", path);
        out_dir(dir.path().join("runs")).check().unwrap();
        refused(out_dir(model.clone()), "is the model directory");
        refused(out_dir(frames.clone()), "is the structures");
        let notes = dir.path().join("notes.txt");
        fs::write(&notes, "notes").unwrap();
        refused(out_dir(notes), "is a file, where a directory");
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

    /// `--out` given the training file: the clash is named, not that a file is no directory.
    #[test]
    fn an_output_that_is_an_input_is_named_as_such_before_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let train = dir.path().join("train.extxyz");
        fs::write(&train, "1\n\nH 0 0 0\n").unwrap();
        let err = RunFiles::new()
            .input("the training structures (--train)", &train)
            .output_dir("--out", &train)
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is the training structures (--train)"),
            "{err}"
        );
    }

    #[test]
    fn inputs_of_the_wrong_kind_are_refused_naming_what_the_flag_takes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.gguf");
        fs::write(&file, b"GGUF").unwrap();
        let err = RunFiles::new()
            .input_dir(
                "--model-dir (a directory; a GGUF file goes to --model)",
                &file,
            )
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is a file, where a directory is read") && err.contains("--model)"),
            "{err}"
        );
        let err = RunFiles::new()
            .input_file("--model (a GGUF file)", dir.path())
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is a directory, where a file is read"),
            "{err}"
        );
        // The right kinds, and missing paths (their reader names them), pass.
        RunFiles::new()
            .input_file("--model", &file)
            .input_dir("--model-dir", dir.path())
            .input_file("--model", dir.path().join("missing.gguf"))
            .check()
            .unwrap();
    }
}
