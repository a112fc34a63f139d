//! Reading a text file the user gave (captions, structures, configs) as a parser would want it:
//! UTF-8, a leading byte-order mark taken off and said so, bytes that are not UTF-8 named by
//! their line and column.

use std::path::Path;

use crate::FileError;

/// The UTF-8 byte-order mark some editors (Notepad, Excel's "CSV UTF-8") put first.
const BOM: &str = "\u{feff}";

/// The text of the file at `path`. A UTF-8 byte-order mark at its start (which JSON parsers
/// refuse as an unexpected character) is removed with a warning naming it; bytes that are not
/// UTF-8 are an error naming the 1-based line and column of the first. A directory, FIFO or
/// device is refused before it is opened ([`FileError::NotAFile`]).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("captions.jsonl");
/// std::fs::write(&path, "\u{feff}{\"video\": \"a\"}\n").unwrap();
/// assert_eq!(kiln_io::read_text(&path).unwrap(), "{\"video\": \"a\"}\n");
/// std::fs::write(&path, b"ok\nbad \xff\n").unwrap();
/// let err = kiln_io::read_text(&path).unwrap_err().to_string();
/// assert!(err.ends_with("line 2, column 5: not UTF-8 text (byte 0xff)"), "{err}");
/// ```
pub fn read_text(path: &Path) -> Result<String, FileError> {
    crate::check_regular(path)?;
    let bytes = std::fs::read(path).map_err(|e| FileError::io(path, e))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let before = &bytes[..valid];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        FileError::NotText {
            path: path.to_path_buf(),
            line,
            column,
            byte: bytes[valid],
        }
    })?;
    match text.strip_prefix(BOM) {
        Some(rest) => {
            log::warn!(
                "{}: begins with a UTF-8 byte-order mark (U+FEFF); read without it",
                path.display()
            );
            Ok(rest.to_string())
        }
        None => Ok(text),
    }
}
