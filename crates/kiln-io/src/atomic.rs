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

/// `value` as pretty-printed JSON (a run's `summary.json`, a manifest), ending in a newline,
/// written [`write_atomic`]ally.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("summary.json");
/// kiln_io::write_json(&path, &serde_json::json!({"steps": 30})).unwrap();
/// assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\n  \"steps\": 30\n}\n");
/// ```
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), FileError> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| FileError::io(path, io::Error::other(e)))?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
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
    let staged = StagedFile::new(path)?;
    write(staged.path()).map_err(|e| FileError::io(path, io::Error::other(e.to_string())))?;
    staged.commit()
}

/// A file written whole or not at all, however long it takes to write (a trajectory streamed
/// while a simulation runs): filled under a temporary name beside its target, then renamed into
/// place by [`StagedFile::commit`] (replacing a regular file there). Dropped without a commit,
/// it is removed and the target is as it was.
///
/// ```
/// use std::io::Write;
///
/// let dir = tempfile::tempdir().unwrap();
/// let target = dir.path().join("md.extxyz");
/// std::fs::write(&target, "an earlier run").unwrap();
/// let mut staged = kiln_io::StagedFile::new(&target).unwrap();
/// staged.file().write_all(b"frame 1\n").unwrap();
/// drop(staged); // the run failed: the earlier file stays
/// assert_eq!(std::fs::read(&target).unwrap(), b"an earlier run");
/// ```
#[derive(Debug)]
pub struct StagedFile {
    path: PathBuf,
    target: PathBuf,
    file: File,
    committed: bool,
}

impl StagedFile {
    /// A new, empty temporary file for `target`; refuses when something other than a regular
    /// file is at `target`, or its parent does not exist.
    pub fn new(target: &Path) -> Result<Self, FileError> {
        expect_kind(target, Kind::File)?;
        let (path, file) = create_temporary(target)?;
        Ok(StagedFile {
            path,
            target: target.to_path_buf(),
            file,
            committed: false,
        })
    }

    /// Where the contents are written until the commit.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file, open for writing.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes the contents to the disk and renames the file over its target.
    pub fn commit(mut self) -> Result<(), FileError> {
        expect_kind(&self.target, Kind::File)?;
        File::open(&self.path)
            .and_then(|file| file.sync_all())
            .and_then(|()| fs::rename(&self.path, &self.target))
            .map_err(|e| FileError::io(&self.target, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.path);
        }
    }
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
        remove_stale_temporaries(target);
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
        Err(e) if e.kind() == io::ErrorKind::NotFound => return path_can_be_made(path),
        Err(e) if e.raw_os_error() == Some(NOT_A_DIRECTORY) => return path_can_be_made(path),
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

/// ENOTDIR: a component of the path is not a directory.
const NOT_A_DIRECTORY: i32 = 20;

/// Refuses a path that does not exist yet when the nearest place above it that does is not a
/// directory (`--out results.txt/run`): `create_dir_all` would fail with a bare "File exists".
fn path_can_be_made(path: &Path) -> Result<(), FileError> {
    for above in path.ancestors().skip(1) {
        let above = if above.as_os_str().is_empty() {
            Path::new(".")
        } else {
            above
        };
        match fs::metadata(above) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(meta) => {
                return Err(FileError::UnderNonDirectory {
                    path: path.to_path_buf(),
                    blocker: above.to_path_buf(),
                    found: describe(&meta.file_type()),
                });
            }
            Err(_) => continue,
        }
    }
    Ok(())
}

/// What `file_type` is, in words: "a file", "a directory", "a FIFO".
pub(crate) fn describe(file_type: &fs::FileType) -> &'static str {
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

/// How long a temporary of a process that is gone must have been left untouched before it is
/// removed: a process on another machine sharing the directory may still be writing it.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the temporaries beside `target` (`.NAME.kiln-PID-N.tmp`, files or directories) that
/// a kiln process left when it was killed: those whose process is no longer running on this
/// machine and that nobody has touched for a minute. Never fails: what cannot be looked at or
/// removed is left.
pub fn remove_stale_temporaries(target: &Path) {
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let mut prefix = OsString::from(".");
    prefix.push(name);
    prefix.push(".kiln-");
    let Some(prefix) = prefix.to_str() else {
        return;
    };
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, n)| n.parse::<u64>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        let untouched = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if pid == std::process::id() || !untouched || process_is_running(pid) {
            continue;
        }
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
        match removed {
            Ok(()) => log::info!("removed {}, left by a run that was stopped", path.display()),
            Err(e) => log::warn!("could not remove the stale {}: {e}", path.display()),
        }
    }
}

/// Whether a process with this id runs on this machine (true where that cannot be told).
fn process_is_running(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        // Signal 0 checks that the process exists; EPERM means it exists as another user's.
        // SAFETY: kill with signal 0 sends nothing and only reads the process table.
        #[allow(unsafe_code)]
        let result = unsafe { libc::kill(pid, 0) };
        result == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// A new temporary file beside `target`, created exclusively (never an existing file); stale
/// temporaries of the same target are removed first.
fn create_temporary(target: &Path) -> Result<(PathBuf, File), FileError> {
    remove_stale_temporaries(target);
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

    /// A killed run's temporaries beside a target (its process gone, untouched for a minute)
    /// are removed by the next staged write of that target; this process's, a fresh one's and
    /// other targets' stay.
    #[test]
    fn stale_temporaries_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("train");
        // No process has this id (above the kernel's limit), so its writer is gone.
        let stale_dir = dir.path().join(".train.kiln-4194305-0.tmp");
        fs::create_dir(&stale_dir).unwrap();
        fs::write(stale_dir.join("c0_00000.png"), "half").unwrap();
        let stale_file = dir.path().join(".train.kiln-4194306-3.tmp");
        fs::write(&stale_file, "half").unwrap();
        let fresh = dir.path().join(".train.kiln-4194307-0.tmp");
        fs::write(&fresh, "being written elsewhere").unwrap();
        let mine = dir
            .path()
            .join(format!(".train.kiln-{}-999.tmp", std::process::id()));
        fs::write(&mine, "mine").unwrap();
        let other = dir.path().join(".eval.kiln-4194305-0.tmp");
        fs::write(&other, "another target's").unwrap();
        let user = dir.path().join(".train.kiln-notes.tmp");
        fs::write(&user, "a user's file").unwrap();
        let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for path in [&stale_dir, &stale_file, &mine, &other, &user] {
            File::open(path).unwrap().set_modified(old).unwrap();
        }
        StagedDir::new(&target).unwrap();
        assert!(!stale_dir.exists() && !stale_file.exists());
        for kept in [&fresh, &mine, &other, &user] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    /// A streamed file appears whole at its commit; dropped, it leaves the old file alone.
    #[test]
    fn staged_files_replace_whole() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("md.extxyz");
        fs::write(&target, "old").unwrap();
        let mut staged = StagedFile::new(&target).unwrap();
        staged.file().write_all(b"frame").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"old");
        staged.commit().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"frame");
        let mut abandoned = StagedFile::new(&target).unwrap();
        abandoned.file().write_all(b"half").unwrap();
        drop(abandoned);
        assert_eq!(fs::read(&target).unwrap(), b"frame");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
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
