//! llama.cpp's GGUF files (versions 2 and 3): the header, the metadata of every value type, the
//! tensor infos and the tensors themselves, each read by position when it is wanted. Every
//! count, offset and size is checked against the file before it is used, so a damaged or
//! hostile file is an error naming the byte where it went wrong, never a panic or an allocation
//! the file cannot back: metadata arrays are held as compactly as the file holds them
//! ([`Array`]), tensors may not share bytes (as llama.cpp requires), and a file cut short while
//! it is read is an error naming it. Tensors dequantize to f32 as the `gguf` Python package
//! does, bit for bit ([`GgmlType`]).
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
mod value;

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use kiln_io::InputFile;

use crate::CheckpointError;
pub use quant::{DEQUANTIZED, GgmlType, dequantize as dequantize_blocks, scales_and_mins};
pub use value::{Array, Strings, Value};

/// The data section's alignment when the file names none (`general.alignment`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// How deep arrays of arrays may nest.
const MAX_NESTING: usize = 8;

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

/// Where the file's bytes are: in the file, read by position, or held (parsed from memory).
enum Source {
    File(InputFile),
    Held(Vec<u8>),
}

/// A GGUF file, opened: its metadata and tensor infos parsed and checked, its tensors read on
/// demand from the file.
pub struct GgufFile {
    path: PathBuf,
    source: Source,
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
    /// Opens and parses the file at `path`.
    ///
    /// # Errors
    /// A path that is not a regular file (a directory, a FIFO), a file that cannot be read, or
    /// one that is not a GGUF file of version 2 or 3 whose every part lies inside it
    /// ([`CheckpointError::Unreadable`], naming the byte).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let file = InputFile::open(path).map_err(|e| CheckpointError::read(path, e))?;
        let length = file.len();
        let header = Header::read(BufReader::with_capacity(1 << 16, file.reader()), length);
        Self::parse(path.to_path_buf(), header, Source::File(file))
    }

    /// Parses a GGUF file held in memory (`name` is what errors call it).
    ///
    /// # Errors
    /// As [`GgufFile::open`].
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, CheckpointError> {
        let header = Header::read(&bytes[..], bytes.len() as u64);
        Self::parse(name.into(), header, Source::Held(bytes))
    }

    fn parse(
        path: PathBuf,
        header: Result<Header, String>,
        source: Source,
    ) -> Result<Self, CheckpointError> {
        let header = header.map_err(|reason| CheckpointError::Unreadable {
            file: path.clone(),
            reason,
        })?;
        Ok(GgufFile {
            path,
            source,
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

    /// The stored bytes of `tensor` (an entry of this file), read from the file now.
    ///
    /// # Errors
    /// A file cut short or unreadable since it was opened, named.
    pub fn bytes(&self, tensor: &GgufTensor) -> Result<Cow<'_, [u8]>, CheckpointError> {
        let range = tensor.start..tensor.start + tensor.bytes;
        match &self.source {
            Source::Held(bytes) => Ok(Cow::Borrowed(&bytes[range])),
            Source::File(file) => file
                .read(range.start as u64..range.end as u64)
                .map(Cow::Owned)
                .map_err(|e| CheckpointError::read(&self.path, e)),
        }
    }

    /// `tensor`'s values as f32, row after row, dequantized as the `gguf` package does.
    ///
    /// # Errors
    /// A type kiln does not dequantize ([`DEQUANTIZED`] lists those it does), named with the
    /// tensor; a file that can no longer be read ([`GgufFile::bytes`]).
    pub fn dequantize(&self, tensor: &GgufTensor) -> Result<Vec<f32>, CheckpointError> {
        let bytes = self.bytes(tensor)?;
        quant::dequantize(tensor.kind, &bytes).ok_or_else(|| {
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
    /// The header of the `length` bytes `source` reads.
    fn read(source: impl Read, length: u64) -> Result<Self, String> {
        let mut at = Reader {
            source,
            at: 0,
            length,
        };
        let magic = at.array::<4>("the magic")?;
        if &magic != b"GGUF" {
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
        let end_of_infos = at.at;
        let data_start = end_of_infos.div_ceil(alignment) * alignment;
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
        refuse_overlaps(&tensors)?;
        Ok(Header {
            version,
            metadata,
            tensors,
            alignment,
        })
    }
}

/// Refuses tensors whose bytes overlap (llama.cpp refuses them too): each tensor's data must be
/// its own, or a small file could describe a model of any size by pointing every layer at the
/// same bytes.
fn refuse_overlaps(tensors: &[GgufTensor]) -> Result<(), String> {
    let mut spans: Vec<&GgufTensor> = tensors.iter().filter(|t| t.bytes > 0).collect();
    spans.sort_by_key(|t| t.start);
    for pair in spans.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        if second.start < first.start + first.bytes {
            return Err(format!(
                "tensor `{}` (bytes {}..{}) overlaps tensor `{}` (bytes {}..{}): each tensor's \
                 data must be its own",
                second.name,
                second.start,
                second.start + second.bytes,
                first.name,
                first.start,
                first.start + first.bytes
            ));
        }
    }
    Ok(())
}

/// Reads little-endian values from `source`, the first `length` bytes of the file, each read
/// checked against the end before anything is allocated for it.
struct Reader<R> {
    source: R,
    at: u64,
    length: u64,
}

impl<R: Read> Reader<R> {
    /// Refuses `n` bytes of `what` that the file does not hold from here.
    fn check_room(&self, n: u64, what: &str) -> Result<(), String> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.length => Ok(()),
            _ => Err(format!(
                "byte {}: {what} ({n} bytes) runs past the file's end ({} bytes)",
                self.at, self.length
            )),
        }
    }

    /// Reads `bytes.len()` bytes of `what`, checked against the end first.
    fn fill(&mut self, bytes: &mut [u8], what: &str) -> Result<(), String> {
        self.check_room(bytes.len() as u64, what)?;
        self.source.read_exact(bytes).map_err(|e| {
            format!(
                "byte {}: {what} cannot be read ({e}): the file was cut short or replaced \
                 while kiln read it",
                self.at
            )
        })?;
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// Reads `n` bytes of `what`, refused before the buffer is allocated when the file cannot
    /// hold them (`fill` checks again for the reads without a buffer to allocate).
    fn take(&mut self, n: u64, what: &str) -> Result<Vec<u8>, String> {
        self.check_room(n, what)?;
        let mut bytes = vec![0; n as usize];
        self.fill(&mut bytes, what)?;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut bytes = [0; N];
        self.fill(&mut bytes, what)?;
        Ok(bytes)
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
        let left = self.length - self.at;
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
        let bytes = self.take(length, what)?;
        String::from_utf8(bytes).map_err(|e| format!("byte {start}: {what} is not UTF-8 ({e})"))
    }

    /// An array (`depth` deep in others) of metadata key `key`: its type, length and values.
    fn whole_array(&mut self, depth: usize, key: &str) -> Result<Array, String> {
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
        self.array_values(element, count, depth, key)
    }

    /// `count` values of `N` bytes each, as `decode` reads one.
    fn numbers<const N: usize, T>(
        &mut self,
        count: u64,
        decode: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, String> {
        let bytes = self.take(count.saturating_mul(N as u64), "an array's values")?;
        Ok(bytes
            .chunks_exact(N)
            .map(|chunk| decode(chunk.try_into().expect("N bytes a chunk")))
            .collect())
    }

    /// The `count` values of an array of GGUF type `element` (arrays `depth` deep in others),
    /// for metadata key `key`, held by type ([`Reader::whole_array`] checks the type and that the
    /// file holds them).
    fn array_values(
        &mut self,
        element: u32,
        count: u64,
        depth: usize,
        key: &str,
    ) -> Result<Array, String> {
        Ok(match element {
            0 => Array::U8(self.take(count, "an array's values")?),
            1 => Array::I8(self.numbers(count, i8::from_le_bytes)?),
            2 => Array::U16(self.numbers(count, u16::from_le_bytes)?),
            3 => Array::I16(self.numbers(count, i16::from_le_bytes)?),
            4 => Array::U32(self.numbers(count, u32::from_le_bytes)?),
            5 => Array::I32(self.numbers(count, i32::from_le_bytes)?),
            6 => Array::F32(self.numbers(count, f32::from_le_bytes)?),
            7 => {
                let start = self.at;
                let bytes = self.take(count, "an array's values")?;
                if let Some(at) = bytes.iter().position(|&b| b > 1) {
                    return Err(format!(
                        "byte {}: `{key}`: a bool of {}",
                        start + at as u64,
                        bytes[at]
                    ));
                }
                Array::Bool(bytes.into_iter().map(|b| b == 1).collect())
            }
            8 => {
                let mut strings = Strings::default();
                for _ in 0..count {
                    strings.push(&self.string("a string")?);
                }
                Array::String(strings)
            }
            9 => Array::Array(
                (0..count)
                    .map(|_| self.whole_array(depth + 1, key))
                    .collect::<Result<_, String>>()?,
            ),
            10 => Array::U64(self.numbers(count, u64::from_le_bytes)?),
            11 => Array::I64(self.numbers(count, i64::from_le_bytes)?),
            12 => Array::F64(self.numbers(count, f64::from_le_bytes)?),
            other => return Err(format!("`{key}`: an array of type {other}")),
        })
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
            9 => Value::Array(self.whole_array(depth, key)?),
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
