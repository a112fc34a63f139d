//! Reading a file the user gave, safely: only a regular file is opened (a FIFO would block
//! forever, a directory or a device reads as nonsense), and its bytes are read a range at a
//! time by position rather than through a memory map, so a file cut short or replaced while it
//! is read is an error naming it, never a `SIGBUS` that kills the process.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::FileError;
use crate::atomic::describe;

/// A regular file opened for reading by position.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("weights.bin");
/// std::fs::write(&path, b"0123456789").unwrap();
/// let file = kiln_io::InputFile::open(&path).unwrap();
/// assert_eq!(file.len(), 10);
/// assert_eq!(file.read(2..5).unwrap(), b"234");
/// std::fs::write(&path, b"0123").unwrap(); // cut short while open
/// let err = file.read(2..5).unwrap_err().to_string();
/// assert!(err.contains("ended at byte 4"), "{err}");
/// let err = kiln_io::InputFile::open(dir.path()).unwrap_err().to_string();
/// assert!(err.ends_with("is a directory, where a file is read"), "{err}");
/// ```
#[derive(Debug)]
pub struct InputFile {
    file: File,
    path: PathBuf,
    length: u64,
}

impl InputFile {
    /// Opens `path` when it is a regular file (or a link to one).
    ///
    /// # Errors
    /// [`FileError::NotAFile`] for a directory, FIFO, socket or device, checked before it is
    /// opened (opening a FIFO blocks until something writes to it); [`FileError::Io`] when it
    /// cannot be opened.
    pub fn open(path: &Path) -> Result<Self, FileError> {
        check_regular(path)?;
        let file = File::open(path).map_err(|e| FileError::io(path, e))?;
        let length = file.metadata().map_err(|e| FileError::io(path, e))?.len();
        Ok(InputFile {
            file,
            path: path.to_path_buf(),
            length,
        })
    }

    /// Its length in bytes when it was opened.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether it was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader of its bytes in order from the first, by position (wrap it in a
    /// `std::io::BufReader` for small reads). A file cut short meanwhile ends early: `read_exact`
    /// says `UnexpectedEof`.
    pub fn reader(&self) -> impl std::io::Read + '_ {
        Sequential { file: self, at: 0 }
    }

    /// The bytes of `range`.
    ///
    /// # Errors
    /// [`FileError::Changed`] when the file now ends before `range` does (it was cut or
    /// replaced since it was opened); [`FileError::Io`] when the read fails.
    pub fn read(&self, range: Range<u64>) -> Result<Vec<u8>, FileError> {
        let wanted = usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX);
        let mut bytes = vec![0; wanted];
        let mut filled = 0;
        while filled < wanted {
            let at = range.start + filled as u64;
            match read_at(&self.file, &mut bytes[filled..], at) {
                Ok(0) => {
                    return Err(FileError::Changed {
                        path: self.path.clone(),
                        ended: at,
                        wanted: range.end,
                    });
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FileError::io(&self.path, e)),
            }
        }
        Ok(bytes)
    }
}

/// [`InputFile::reader`]'s reader.
struct Sequential<'a> {
    file: &'a InputFile,
    at: u64,
}

impl std::io::Read for Sequential<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let n = read_at(&self.file.file, buffer, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Refuses `path` unless it is a regular file (following links), without opening it.
///
/// # Errors
/// As [`InputFile::open`].
pub fn check_regular(path: &Path) -> Result<(), FileError> {
    let meta = std::fs::metadata(path).map_err(|e| FileError::io(path, e))?;
    if meta.is_file() {
        return Ok(());
    }
    Err(FileError::NotAFile {
        path: path.to_path_buf(),
        found: describe(&meta.file_type()),
    })
}

#[cfg(unix)]
fn read_at(file: &File, buffer: &mut [u8], at: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buffer, at)
}

#[cfg(windows)]
fn read_at(file: &File, buffer: &mut [u8], at: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buffer, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO is refused before it is opened: opening it would wait for a writer forever.
    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.gguf");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        #[allow(unsafe_code)]
        let made = unsafe { libc::mkfifo(name.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        let err = InputFile::open(&fifo).unwrap_err().to_string();
        assert!(
            err.ends_with("model.gguf: is a FIFO, where a file is read"),
            "{err}"
        );
        let err = crate::read_text(&fifo).unwrap_err().to_string();
        assert!(err.ends_with("is a FIFO, where a file is read"), "{err}");
    }

    #[test]
    fn a_file_cut_short_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let file = InputFile::open(&path).unwrap();
        assert_eq!(file.read(4000..4096).unwrap(), vec![7u8; 96]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let err = file.read(50..4096).unwrap_err();
        assert!(matches!(
            err,
            FileError::Changed {
                ended: 100,
                wanted: 4096,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            format!(
                "{}: ended at byte 100 while kiln read it up to byte 4096: it was cut short or \
                 replaced during the run (run again once it is complete)",
                path.display()
            )
        );
    }
}
