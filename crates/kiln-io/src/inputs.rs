//! The files a run reads, which its outputs may not replace.

use std::fs;
use std::path::{Path, PathBuf};

use crate::FileError;
use crate::atomic::{Kind, expect_kind};

/// The files and directories a run reads, each with what it is for. Outputs are checked against
/// them before any work starts ([`Inputs::check_output`], [`Inputs::check_output_dir`]):
/// comparing what the paths lead to (the same file through another spelling, `..` or a link is
/// caught), not how they are written.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    inputs: Vec<Input>,
}

#[derive(Debug, Clone)]
struct Input {
    role: String,
    path: PathBuf,
    id: FileId,
    is_dir: bool,
}

impl Inputs {
    /// No inputs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path`, read as `role` (e.g. "the model's checkpoint"): a file, or a directory whose
    /// contents are all inputs. A path that cannot be looked at (missing) is left out: nothing
    /// there can be overwritten, and reading it fails with its own message.
    pub fn with(mut self, role: &str, path: impl AsRef<Path>) -> Self {
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

    /// Refuses `output` (a file kiln will write) when it is an input, lies inside an input
    /// directory, or exists and is not a regular file.
    pub fn check_output(&self, output: &Path) -> Result<(), FileError> {
        expect_kind(output, Kind::File)?;
        self.check_against_inputs(output)
    }

    /// Refuses `output` (a directory kiln will write into) when it is an input or lies inside
    /// an input directory, or exists and is not a directory.
    pub fn check_output_dir(&self, output: &Path) -> Result<(), FileError> {
        expect_kind(output, Kind::Dir)?;
        self.check_against_inputs(output)
    }

    fn check_against_inputs(&self, output: &Path) -> Result<(), FileError> {
        let absolute = std::path::absolute(output).map_err(|e| FileError::io(output, e))?;
        for (depth, place) in absolute.ancestors().enumerate() {
            let Ok(meta) = fs::metadata(place) else {
                continue;
            };
            let id = FileId::of(place, &meta);
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
    /// input directory, is refused naming the input's role; other outputs pass.
    #[test]
    fn outputs_may_not_be_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("model.safetensors"), "weights").unwrap();
        let frames = dir.path().join("frames.xyz");
        fs::write(&frames, "frames").unwrap();
        let inputs = Inputs::new()
            .with("the model directory", &model)
            .with("the structures", &frames)
            .with("the missing", dir.path().join("missing"));
        let refused = |output: PathBuf, relation: &str, role: &str| {
            let err = inputs.check_output(&output).unwrap_err().to_string();
            assert!(err.contains(&format!("{relation} {role}")), "{err}");
        };
        refused(frames.clone(), "is", "the structures");
        refused(model.join("../frames.xyz"), "is", "the structures");
        refused(
            model.join("model.safetensors"),
            "is inside",
            "the model directory",
        );
        refused(model.join("new.json"), "is inside", "the model directory");
        #[cfg(unix)]
        {
            let link = dir.path().join("link.xyz");
            std::os::unix::fs::symlink(&frames, &link).unwrap();
            // A link is not a regular file: refused before being followed.
            assert!(inputs.check_output(&link).is_err());
        }
        inputs.check_output(&dir.path().join("out.xyz")).unwrap();
        inputs.check_output(&dir.path().join("missing")).unwrap();
        inputs.check_output_dir(&dir.path().join("runs")).unwrap();
        let err = inputs.check_output_dir(&model).unwrap_err().to_string();
        assert!(err.contains("is the model directory"), "{err}");
        let err = inputs.check_output_dir(&frames).unwrap_err().to_string();
        assert!(err.contains("is a file, where a directory"), "{err}");
        assert_eq!(fs::read(&frames).unwrap(), b"frames");
    }
}
