//! Whole-or-nothing writes of files and directories.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::FileError;

/// Writes `bytes` to `path` whole or not at all (see the crate docs), replacing a regular file
/// there; refuses anything else at `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

/// [`write_atomic`] with the contents written by `write` into the temporary file (wrap it in a
/// `BufWriter` for many small writes, and flush it).
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), FileError> {
    write_atomic_at(path, |temporary| {
        let mut file = OpenOptions::new().write(true).open(temporary)?;
        write(&mut file)
    })
}

/// [`write_atomic`] for writers that open the file themselves (a checkpoint format's
/// `save_to_file`): `write` gets the temporary file's path (created empty for it, never an
/// existing file) and fills it.
pub fn write_atomic_at<E: std::fmt::Display>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), FileError> {
    expect_kind(path, Kind::File)?;
    let (temporary, file) = create_temporary(path)?;
    drop(file);
    let result = write(&temporary)
        .map_err(|e| io::Error::other(e.to_string()))
        .and_then(|()| File::open(&temporary)?.sync_all())
        .and_then(|()| fs::rename(&temporary, path))
        .map_err(|e| FileError::io(path, e));
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

/// A directory written whole or not at all: filled under a temporary name beside its target,
/// then renamed into place by [`StagedDir::commit`] (replacing a directory there). Dropped
/// without a commit, it is removed.
#[derive(Debug)]
pub struct StagedDir {
    path: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedDir {
    /// A new, empty staging directory for `target`; refuses when something other than a
    /// directory is at `target`, or its parent does not exist.
    pub fn new(target: &Path) -> Result<Self, FileError> {
        expect_kind(target, Kind::Dir)?;
        loop {
            let path = temporary_name(target)?;
            match fs::create_dir(&path) {
                Ok(()) => {
                    return Ok(StagedDir {
                        path,
                        target: target.to_path_buf(),
                        committed: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(FileError::io(target, e)),
            }
        }
    }

    /// Where to write the directory's contents until the commit.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` to the file `name` in the directory and flushes them to the disk.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), FileError> {
        let path = self.path.join(name);
        File::create(&path)
            .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()))
            .map_err(|e| FileError::io(&path, e))
    }

    /// Moves the directory to its target (a directory already there is moved aside, then
    /// removed) and returns the target.
    pub fn commit(mut self) -> Result<PathBuf, FileError> {
        let target = self.target.clone();
        expect_kind(&target, Kind::Dir)?;
        let aside = if target.exists() {
            let aside = temporary_name(&target)?;
            fs::rename(&target, &aside).map_err(|e| FileError::io(&target, e))?;
            Some(aside)
        } else {
            None
        };
        if let Err(e) = fs::rename(&self.path, &target) {
            if let Some(aside) = &aside {
                let _ = fs::rename(aside, &target);
            }
            return Err(FileError::io(&target, e));
        }
        self.committed = true;
        if let Some(aside) = aside {
            let _ = fs::remove_dir_all(aside);
        }
        Ok(target)
    }
}

impl StagedDir {
    /// Moves the directory to its target unless a directory is there already (another process
    /// made it first: the staged one is removed). Whether this one was moved.
    pub fn commit_if_absent(mut self) -> Result<bool, FileError> {
        match fs::rename(&self.path, &self.target) {
            Ok(()) => {
                self.committed = true;
                Ok(true)
            }
            Err(_) if self.target.is_dir() => Ok(false),
            Err(e) => Err(FileError::io(&self.target, e)),
        }
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// What kiln writes at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
}

/// Refuses `path` when something other than `kind` is there (links included).
pub(crate) fn expect_kind(path: &Path, kind: Kind) -> Result<(), FileError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FileError::io(path, e)),
    };
    let file_type = meta.file_type();
    let fits = match kind {
        Kind::File => file_type.is_file(),
        Kind::Dir => file_type.is_dir(),
    };
    if fits {
        return Ok(());
    }
    Err(FileError::WrongKind {
        path: path.to_path_buf(),
        found: describe(&file_type),
        expected: match kind {
            Kind::File => "a file",
            Kind::Dir => "a directory",
        },
    })
}

fn describe(file_type: &fs::FileType) -> &'static str {
    if file_type.is_file() {
        return "a file";
    }
    if file_type.is_dir() {
        return "a directory";
    }
    if file_type.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_block_device() || file_type.is_char_device() {
            return "a device";
        }
    }
    "something else"
}

/// Temporaries named by this process so far.
static NAMED: AtomicU64 = AtomicU64::new(0);

/// A fresh name beside `target`: hidden, marked as kiln's, unique to this process and call
/// (`.NAME.kiln-PID-N.tmp`).
fn temporary_name(target: &Path) -> Result<PathBuf, FileError> {
    let Some(name) = target.file_name() else {
        let reason = io::Error::new(io::ErrorKind::InvalidInput, "the path names no file");
        return Err(FileError::io(target, reason));
    };
    let mut temporary = OsString::from(".");
    temporary.push(name);
    temporary.push(format!(
        ".kiln-{}-{}.tmp",
        std::process::id(),
        NAMED.fetch_add(1, Ordering::Relaxed)
    ));
    Ok(target.with_file_name(temporary))
}

/// A new temporary file beside `target`, created exclusively (never an existing file).
fn create_temporary(target: &Path) -> Result<(PathBuf, File), FileError> {
    loop {
        let temporary = temporary_name(target)?;
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(FileError::io(target, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The target's contents are replaced; a file named like a temporary of the old scheme
    /// (`.partial`, `.tmp` extensions) and every other file beside it stay as they were.
    #[test]
    fn writes_replace_only_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("summary.json");
        let neighbours = [
            "summary.partial",
            "summary.json.tmp",
            "summary.tmp",
            ".summary.json",
        ];
        for name in neighbours {
            fs::write(dir.path().join(name), name).unwrap();
        }
        fs::write(&target, "old").unwrap();
        write_atomic(&target, b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        for name in neighbours {
            assert_eq!(fs::read_to_string(dir.path().join(name)).unwrap(), name);
        }
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1 + neighbours.len()
        );
    }

    /// A failed write leaves the old contents and no temporary behind.
    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bin");
        fs::write(&target, "old").unwrap();
        let failed = write_atomic_with(&target, |file| {
            file.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(failed.unwrap_err().to_string().contains("disk full"));
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Directories, links and FIFOs at the output are refused and left alone.
    #[test]
    fn only_regular_files_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let err = write_atomic(&sub, b"x").unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        assert!(sub.is_dir());
        #[cfg(unix)]
        {
            let real = dir.path().join("real");
            fs::write(&real, "kept").unwrap();
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&real, &link).unwrap();
            let err = write_atomic(&link, b"x").unwrap_err();
            assert!(err.to_string().contains("symbolic link"), "{err}");
            assert_eq!(fs::read(&real).unwrap(), b"kept");
        }
        let missing = dir.path().join("no/such/dir/out");
        let err = write_atomic(&missing, b"x").unwrap_err();
        assert!(
            err.to_string().starts_with(&missing.display().to_string()),
            "{err}"
        );
    }

    /// A staged directory appears whole at its commit, replacing the old one; dropped, it
    /// leaves nothing.
    #[test]
    fn staged_directories_replace_whole() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("step-3");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("old"), "old").unwrap();
        let staged = StagedDir::new(&target).unwrap();
        staged.write("state.json", b"{}").unwrap();
        assert!(target.join("old").exists());
        staged.commit().unwrap();
        assert!(!target.join("old").exists());
        assert_eq!(fs::read(target.join("state.json")).unwrap(), b"{}");
        let abandoned = StagedDir::new(&dir.path().join("step-4")).unwrap();
        abandoned.write("x", b"x").unwrap();
        drop(abandoned);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        fs::write(dir.path().join("file"), "f").unwrap();
        let err = StagedDir::new(&dir.path().join("file")).unwrap_err();
        assert!(
            err.to_string().contains("is a file, where a directory"),
            "{err}"
        );
    }
}
