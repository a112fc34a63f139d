//! Where images come from: a folder (recursive, sorted by path) or an explicit list of files.

use std::path::{Path, PathBuf};

use crate::CacheError;
use crate::decode::IMAGE_EXTENSIONS;

/// The images of a dataset, in the order they are cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Every PNG / JPEG / WebP / BMP / GIF file below a folder, recursively, sorted by path.
    Folder(PathBuf),
    /// These files, in this order.
    Files(Vec<PathBuf>),
}

/// One image file and the name it has in the cache (its path relative to the folder, or as
/// given), so that a moved folder still hits its cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Where the file is.
    pub path: PathBuf,
    /// Its name in the cache manifest.
    pub name: String,
}

impl ImageSource {
    /// The files, in cache order. A missing folder or one without images is an error.
    pub fn files(&self) -> Result<Vec<SourceFile>, CacheError> {
        match self {
            ImageSource::Files(paths) => Ok(paths
                .iter()
                .map(|path| SourceFile {
                    path: path.clone(),
                    name: path.to_string_lossy().into_owned(),
                })
                .collect()),
            ImageSource::Folder(root) => {
                let mut paths = Vec::new();
                walk(root, &mut paths)?;
                if paths.is_empty() {
                    return Err(CacheError::NoImages {
                        dir: root.clone(),
                        extensions: IMAGE_EXTENSIONS.join(", "),
                    });
                }
                paths.sort();
                Ok(paths
                    .into_iter()
                    .map(|path| SourceFile {
                        name: path
                            .strip_prefix(root)
                            .unwrap_or(&path)
                            .to_string_lossy()
                            .into_owned(),
                        path,
                    })
                    .collect())
            }
        }
    }
}

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Image files below `dir`; directories are entered, symbolic links to files followed.
pub(crate) fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), CacheError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CacheError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CacheError::io(dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| CacheError::io(&path, e))?;
        if kind.is_dir() {
            walk(&path, out)?;
        } else if is_image(&path) && (kind.is_file() || path.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_walked_recursively_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.PNG", "a/z.jpg", "a/y.webp", "notes.txt", "c.jpeg"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        let files = ImageSource::Folder(dir.path().into()).files().unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a/y.webp", "a/z.jpg", "b.PNG", "c.jpeg"]);
    }

    #[test]
    fn empty_and_missing_folders_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = ImageSource::Folder(dir.path().into()).files().unwrap_err();
        assert!(err.to_string().contains("no images"), "{err}");
        let err = ImageSource::Folder(dir.path().join("nope"))
            .files()
            .unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
