//! llama.cpp's GGUF files (versions 2 and 3): the header, the metadata of every value type, the
//! tensor infos and the tensors themselves, memory-mapped. Every count, offset and size is
//! checked against the file before it is used, so a damaged or hostile file is an error naming
//! the byte where it went wrong, never a panic or an allocation the file cannot back. Tensors
//! dequantize to f32 as the `gguf` Python package does, bit for bit ([`GgmlType`]).
//!
//! ```no_run
//! use kiln_core::gguf::GgufFile;
//!
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let architecture = file.get("general.architecture").and_then(|v| v.as_str());
//! let embedding = file.tensor("token_embd.weight").unwrap();
//! let values: Vec<f32> = file.dequantize(embedding)?; // `embedding.shape` floats
//! # Ok::<(), kiln_core::CheckpointError>(())
//! ```

mod quant;

use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{CheckpointError, mapped};
pub use quant::{DEQUANTIZED, GgmlType};

/// The data section's alignment when the file names none (`general.alignment`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// How deep arrays of arrays may nest.
const MAX_NESTING: usize = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// Values of one type.
    Array(Vec<Value>),
}

impl Value {
    /// An integer of any width that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer of any width that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float, or an integer as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array's values.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(values) => Some(values),
            _ => None,
        }
    }

    /// The GGUF name of the value's type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F32(_) => "float32",
            Value::F64(_) => "float64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One tensor's entry: its name, shape, type and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    /// The name, as the file has it (`blk.0.attn_q.weight`).
    pub name: String,
    /// The shape in PyTorch's order, outermost first (GGUF's `ne` reversed).
    pub shape: Vec<usize>,
    /// The element type.
    pub kind: GgmlType,
    /// Where its bytes start in the file.
    pub start: usize,
    /// How many bytes it takes.
    pub bytes: usize,
}

impl GgufTensor {
    /// Its elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The file's bytes: mapped, or held (parsed from memory).
enum Bytes {
    Mapped(Mmap),
    Held(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Held(bytes) => bytes,
        }
    }
}

/// A GGUF file, opened: its metadata and tensor infos parsed and checked, its tensors read on
/// demand from the mapped file.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<GgufTensor>,
    alignment: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses the file at `path`.
    ///
    /// # Errors
    /// A file that cannot be read, or is not a GGUF file of version 2 or 3 whose every part lies
    /// inside it ([`CheckpointError::Unreadable`], naming the byte).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let unreadable = |reason: String| CheckpointError::Unreadable {
            file: path.to_path_buf(),
            reason,
        };
        let map = mapped::map(path).map_err(|e| unreadable(e.to_string()))?;
        Self::parse(path.to_path_buf(), Bytes::Mapped(map))
    }

    /// Parses a GGUF file held in memory (`name` is what errors call it).
    ///
    /// # Errors
    /// As [`GgufFile::open`].
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, CheckpointError> {
        Self::parse(name.into(), Bytes::Held(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<Self, CheckpointError> {
        let header = Header::read(&bytes).map_err(|reason| CheckpointError::Unreadable {
            file: path.clone(),
            reason,
        })?;
        Ok(GgufFile {
            path,
            bytes,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            alignment: header.alignment,
        })
    }

    /// The file's path (or the name it was given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data section's alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Every metadata key and value, in the file's order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Every tensor's entry, in the file's order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The entry of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The stored bytes of `tensor` (an entry of this file).
    pub fn raw(&self, tensor: &GgufTensor) -> &[u8] {
        &self.bytes[tensor.start..tensor.start + tensor.bytes]
    }

    /// Lets the system drop the memory-mapped pages of `tensor`'s bytes (read again from the
    /// file should they be needed): a loader done with a tensor keeps the mapped file out of
    /// the process's resident memory, which then holds the model once rather than the model and
    /// the file. Nothing for a file held in memory.
    pub fn release(&self, tensor: &GgufTensor) {
        if let Bytes::Mapped(map) = &self.bytes {
            mapped::release(map, tensor.start..tensor.start + tensor.bytes);
        }
    }

    /// `tensor`'s values as f32, row after row, dequantized as the `gguf` package does.
    ///
    /// # Errors
    /// A type kiln does not dequantize ([`DEQUANTIZED`] lists those it does), named with the
    /// tensor.
    pub fn dequantize(&self, tensor: &GgufTensor) -> Result<Vec<f32>, CheckpointError> {
        quant::dequantize(tensor.kind, self.raw(tensor)).ok_or_else(|| {
            let known: Vec<&str> = DEQUANTIZED.iter().map(|t| t.name()).collect();
            CheckpointError::Unreadable {
                file: self.path.clone(),
                reason: format!(
                    "tensor `{}` is {}, which kiln does not dequantize (it reads {})",
                    tensor.name,
                    tensor.kind.name(),
                    known.join(", ")
                ),
            }
        })
    }
}

/// What the header, the metadata and the tensor infos say.
struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<GgufTensor>,
    alignment: u64,
}

impl Header {
    fn read(bytes: &[u8]) -> Result<Self, String> {
        let mut at = Reader { bytes, at: 0 };
        let magic = at.take(4, "the magic")?;
        if magic != b"GGUF" {
            return Err(format!(
                "not a GGUF file (it starts with {magic:02x?}, not \"GGUF\")"
            ));
        }
        let version = at.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(
                    "GGUF version 1 (2023's first format): kiln reads versions 2 and 3; \
                             convert it with a current llama.cpp"
                        .into(),
                );
            }
            v if matches!(v.swap_bytes(), 2 | 3) => {
                return Err("a big-endian GGUF file: kiln reads little-endian ones".into());
            }
            v => return Err(format!("GGUF version {v}: kiln reads versions 2 and 3")),
        }
        let tensor_count = at.u64("the tensor count")?;
        let metadata_count = at.u64("the metadata count")?;
        // Each metadata entry takes at least 13 bytes (an empty key, a type, one byte).
        at.check_count(metadata_count, 13, "metadata entries")?;
        let mut metadata = Vec::new();
        let mut keys = HashSet::new();
        for _ in 0..metadata_count {
            let start = at.at;
            let key = at.string("a metadata key")?;
            let kind = at.u32("a value type")?;
            let value = at.value(kind, 0, &key)?;
            if !keys.insert(key.clone()) {
                return Err(format!("byte {start}: a second metadata key `{key}`"));
            }
            metadata.push((key, value));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(format!(
                    "general.alignment is {v:?}: a power of two, as uint32"
                ));
            }
        };
        // Each tensor info takes at least 24 bytes (an empty name, no dims, a type, an offset).
        at.check_count(tensor_count, 24, "tensor infos")?;
        let mut infos = Vec::new();
        let mut names = HashSet::new();
        for index in 0..tensor_count {
            let start = at.at;
            let info = at.tensor_info(index)?;
            if !names.insert(info.0.clone()) {
                return Err(format!("byte {start}: a second tensor named `{}`", info.0));
            }
            infos.push(info);
        }
        let end_of_infos = at.at as u64;
        let data_start = end_of_infos.div_ceil(alignment) * alignment;
        let length = bytes.len() as u64;
        let tensors = infos
            .into_iter()
            .map(|(name, shape, kind, offset)| {
                let (elements_per_block, block_bytes) = kind.block();
                let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
                let row = shape.last().copied().unwrap_or(1);
                let tensor = |reason: String| format!("tensor `{name}`: {reason}");
                let elements = elements.ok_or_else(|| tensor(format!("{shape:?} overflows")))?;
                if row % elements_per_block != 0 {
                    return Err(tensor(format!(
                        "rows of {row} elements, not whole {} blocks of {elements_per_block}",
                        kind.name()
                    )));
                }
                let size = (elements / elements_per_block as u64)
                    .checked_mul(block_bytes as u64)
                    .ok_or_else(|| tensor(format!("{shape:?} overflows")))?;
                if offset % alignment != 0 {
                    return Err(tensor(format!(
                        "offset {offset} is not a multiple of the alignment {alignment}"
                    )));
                }
                let start = data_start
                    .checked_add(offset)
                    .filter(|start| start.checked_add(size).is_some_and(|end| end <= length))
                    .ok_or_else(|| {
                        tensor(format!(
                            "{size} bytes from byte {} run past the file's end ({length} bytes)",
                            data_start.saturating_add(offset)
                        ))
                    })?;
                Ok(GgufTensor {
                    name,
                    shape,
                    kind,
                    start: start as usize,
                    bytes: size as usize,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Header {
            version,
            metadata,
            tensors,
            alignment,
        })
    }
}

/// Reads little-endian values from `bytes`, each read checked against the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "byte {}: {what} ({n} bytes) runs past the file's end ({} bytes)",
                self.at,
                self.bytes.len()
            ));
        };
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let bytes = self.take(N, what)?;
        Ok(bytes.try_into().expect("N bytes taken"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses `count` items of at least `least` bytes each that the rest of the file cannot
    /// hold, before anything is allocated for them.
    fn check_count(&self, count: u64, least: u64, what: &str) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        match count.checked_mul(least) {
            Some(bytes) if bytes <= left => Ok(()),
            _ => Err(format!(
                "byte {}: {count} {what}, more than the {left} bytes left can hold",
                self.at
            )),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let start = self.at;
        let length = self.u64(what)?;
        let length = usize::try_from(length)
            .map_err(|_| format!("byte {start}: {what} of {length} bytes"))?;
        let bytes = self.take(length, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| format!("byte {start}: {what} is not UTF-8 ({e})"))
    }

    /// A value of GGUF type `kind` (arrays `depth` deep in others), for metadata key `key`.
    fn value(&mut self, kind: u32, depth: usize, key: &str) -> Result<Value, String> {
        let what = "a value";
        Ok(match kind {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("byte {}: `{key}`: a bool of {b}", self.at - 1)),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                let start = self.at;
                if depth == MAX_NESTING {
                    return Err(format!(
                        "byte {start}: `{key}`: arrays nested more than {MAX_NESTING} deep"
                    ));
                }
                let element = self.u32("an array's type")?;
                let count = self.u64("an array's length")?;
                let least = match element {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(format!("byte {start}: `{key}`: an array of type {other}"));
                    }
                };
                self.check_count(count, least, "array elements")?;
                let values = (0..count)
                    .map(|_| self.value(element, depth + 1, key))
                    .collect::<Result<_, _>>()?;
                Value::Array(values)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(format!(
                    "byte {}: `{key}`: value type {other} (GGUF has 0 to 12)",
                    self.at - 4
                ));
            }
        })
    }

    /// Tensor info `index`: its name, shape (PyTorch order), type and offset.
    fn tensor_info(&mut self, index: u64) -> Result<(String, Vec<usize>, GgmlType, u64), String> {
        let start = self.at;
        let name = self.string("a tensor name")?;
        let dims = self.u32("a tensor's dimensions")?;
        if dims > 4 {
            return Err(format!(
                "byte {start}: tensor `{name}` (number {}) has {dims} dimensions; ggml has at most 4",
                index + 1
            ));
        }
        let mut shape = Vec::with_capacity(dims as usize);
        for _ in 0..dims {
            let d = self.u64("a tensor dimension")?;
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d <= i64::MAX as usize)
                .ok_or_else(|| format!("byte {start}: tensor `{name}`: a dimension of {d}"))?;
            shape.push(d);
        }
        shape.reverse();
        let type_at = self.at;
        let id = self.u32("a tensor type")?;
        let kind = GgmlType::from_id(id).ok_or_else(|| {
            format!(
                "byte {type_at}: tensor `{name}` has ggml type {id}, which ggml does not define"
            )
        })?;
        let offset = self.u64("a tensor offset")?;
        Ok((name, shape, kind, offset))
    }
}
