//! A checkpoint's `config.json`: found, read and parsed, a setting of the wrong type named by
//! its dotted path.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::CheckpointError;

/// A setting a config cannot be read with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    /// The setting's dotted path (`vision_config.hidden_size`); empty when the fault is the
    /// document's as a whole.
    pub setting: String,
    /// What is wrong, in serde's words.
    pub reason: String,
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.setting.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.setting, self.reason)
        }
    }
}

impl std::error::Error for SettingError {}

/// `config.json` in `path` when it is a directory, else `path` itself.
pub fn config_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    }
}

/// `T` read from a `config.json`'s JSON, a setting of the wrong type named by its dotted path
/// (`vision_config.hidden_size: invalid type: floating point `3.7`, expected usize`) where
/// serde alone says only where in the text it is.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Config { vision: Vision }
/// #[derive(serde::Deserialize)]
/// struct Vision { hidden_size: usize }
/// let json = serde_json::json!({"vision": {"hidden_size": 3.7}});
/// let err = kiln_core::config_from_json::<Config>(json).err().unwrap();
/// assert_eq!(err.setting, "vision.hidden_size");
/// assert!(err.to_string().starts_with("vision.hidden_size: invalid type"), "{err}");
/// ```
pub fn config_from_json<T: DeserializeOwned>(value: Value) -> Result<T, SettingError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        SettingError {
            setting: if path == "." { String::new() } else { path },
            reason: e.into_inner().to_string(),
        }
    })
}

/// The `config.json` at `path` (a checkpoint directory holding one, or the file itself) as `T`,
/// and the file read.
pub fn read_config<T: DeserializeOwned>(path: &Path) -> Result<(PathBuf, T), CheckpointError> {
    let file = config_file(path);
    let text = kiln_io::read_text(&file).map_err(|e| CheckpointError::read(&file, e))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| CheckpointError::unreadable(&file, e))?;
    let config = config_from_json(value).map_err(|error| CheckpointError::Config {
        file: file.clone(),
        error,
    })?;
    Ok((file, config))
}
