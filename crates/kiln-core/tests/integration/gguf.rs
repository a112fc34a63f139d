//! The GGUF reader against the `gguf` Python package (scripts/fixtures/gguf_quants.py): every
//! dequantized type bit for bit, metadata of every value type; and hostile files, built here
//! byte by byte, refused with the byte named, never a panic.

use std::path::PathBuf;

use kiln_core::gguf::{Array, DEQUANTIZED, GgmlType, GgufFile, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

#[test]
fn every_type_dequantizes_as_the_gguf_package_does() {
    let file = GgufFile::open(fixtures().join("quants.gguf")).unwrap();
    let references = std::fs::read(fixtures().join("quants.safetensors")).unwrap();
    let references = safetensors::SafeTensors::deserialize(&references).unwrap();
    assert_eq!((file.version(), file.alignment()), (3, 64));
    assert_eq!(file.tensors().len(), DEQUANTIZED.len());
    for kind in DEQUANTIZED {
        let name = kind.name().to_lowercase();
        let tensor = file.tensor(&name).unwrap();
        assert_eq!(
            (tensor.kind, tensor.shape.as_slice()),
            (kind, &[3, 512][..])
        );
        assert_eq!(tensor.start % 64, 0, "{name}");
        let ours = file.dequantize(tensor).unwrap();
        let theirs: Vec<f32> = (references.tensor(&name).unwrap().data().chunks_exact(4))
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{name}");
        let different = (ours.iter().zip(&theirs))
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(different, 0, "{name}: {different} values differ");
    }
}

#[test]
fn metadata_of_every_value_type_is_read() {
    let file = GgufFile::open(fixtures().join("quants.gguf")).unwrap();
    let get = |key: &str| file.get(key).unwrap_or_else(|| panic!("{key}"));
    assert_eq!(get("general.architecture").as_str(), Some("test"));
    assert_eq!(get("test.u8"), &Value::U8(200));
    assert_eq!(get("test.i8"), &Value::I8(-100));
    assert_eq!(get("test.u16"), &Value::U16(60000));
    assert_eq!(get("test.i16"), &Value::I16(-30000));
    assert_eq!(get("test.u32"), &Value::U32(4_000_000_000));
    assert_eq!(get("test.i32"), &Value::I32(-2_000_000_000));
    assert_eq!(get("test.f32"), &Value::F32(0.1));
    assert_eq!(get("test.u64"), &Value::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), &Value::I64(-(1 << 62)));
    assert_eq!(get("test.f64"), &Value::F64(1e300));
    assert_eq!(get("test.bool"), &Value::Bool(true));
    assert_eq!(get("test.string").as_str(), Some("Grüße, 世界 "));
    let ints = get("test.array.i32").as_array().unwrap().integers();
    assert_eq!(ints.unwrap(), [1, -2, 3]);
    let strings = get("test.array.string").as_array().unwrap().strings();
    assert_eq!(strings.unwrap().iter().collect::<Vec<_>>(), ["a", "", "Ġb"]);
    let nested = get("test.array.nested")
        .as_array()
        .unwrap()
        .arrays()
        .unwrap();
    assert_eq!(nested.len(), 2);
    assert_eq!(nested[1], Array::I32(vec![3]));
    assert_eq!(get("test.u64").as_i64(), None);
    assert_eq!(get("test.i8").as_u64(), None);
}

/// A GGUF file written byte by byte: the header, `metadata` (key, type, value bytes), then
/// `tensors` (name, `ne` dims, ggml type, offset), padded to 32, then `data`.
struct Builder {
    version: u32,
    metadata: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data: Vec<u8>,
}

fn string(s: &str) -> Vec<u8> {
    [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
}

impl Builder {
    /// One F32 tensor `[2, 4]` (ne [4, 2]), its 32 bytes of data.
    fn valid() -> Self {
        Builder {
            version: 3,
            metadata: vec![("general.architecture".into(), 8, string("llama"))],
            tensors: vec![("w".into(), vec![4, 2], 0, 0)],
            data: (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, kind, value) in &self.metadata {
            out.extend(string(key));
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        for (name, dims, kind, offset) in &self.tensors {
            out.extend(string(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(kind.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.extend(&self.data);
        out
    }

    fn open(&self) -> Result<GgufFile, String> {
        GgufFile::from_bytes("hostile.gguf", self.bytes()).map_err(|e| e.to_string())
    }
}

#[test]
fn a_built_file_reads_back() {
    let file = Builder::valid().open().unwrap();
    let tensor = file.tensor("w").unwrap();
    assert_eq!(
        (tensor.shape.as_slice(), tensor.kind),
        (&[2, 4][..], GgmlType::F32)
    );
    let values = file.dequantize(tensor).unwrap();
    assert_eq!(values, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
}

#[test]
fn hostile_files_are_refused_naming_what_is_wrong() {
    let refused = |build: &dyn Fn(&mut Builder), needle: &str| {
        let mut builder = Builder::valid();
        build(&mut builder);
        let error = builder.open().unwrap_err();
        assert!(error.contains(needle), "{needle}: {error}");
        assert!(error.starts_with("hostile.gguf: "), "{error}");
    };
    refused(&|b| b.version = 1, "GGUF version 1");
    refused(
        &|b| b.version = 7,
        "GGUF version 7: kiln reads versions 2 and 3",
    );
    refused(&|b| b.version = 3u32.swap_bytes(), "big-endian");
    refused(&|b| b.tensors[0].1 = vec![4, 2, 1, 1, 1], "5 dimensions");
    refused(&|b| b.tensors[0].1 = vec![1 << 40, 1 << 40], "overflows");
    refused(&|b| b.tensors[0].1 = vec![4, 3], "run past the file's end");
    refused(&|b| b.tensors[0].3 = 64, "run past the file's end");
    refused(
        &|b| b.tensors[0].3 = u64::MAX - 31,
        "run past the file's end",
    );
    refused(
        &|b| b.tensors[0].3 = 4,
        "not a multiple of the alignment 32",
    );
    refused(
        &|b| b.tensors[0].2 = 99,
        "ggml type 99, which ggml does not define",
    );
    refused(
        &|b| b.tensors[0].2 = 2,
        "rows of 4 elements, not whole Q4_0 blocks of 32",
    );
    refused(
        &|b| b.tensors.push(b.tensors[0].clone()),
        "a second tensor named `w`",
    );
    refused(
        &|b| b.metadata.push(b.metadata[0].clone()),
        "a second metadata key",
    );
    // A second layer pointing at the first one's bytes: a small file describing a large model.
    refused(
        &|b| b.tensors.push(("v".into(), vec![4, 2], 0, 0)),
        "tensor `v` (bytes 160..192) overlaps tensor `w` (bytes 160..192)",
    );
    refused(&|b| b.metadata[0].1 = 13, "value type 13");
    refused(
        &|b| b.metadata[0].2 = u64::MAX.to_le_bytes().to_vec(),
        "runs past the file's end",
    );
    let huge_array = [
        &9u32.to_le_bytes()[..],
        &8u32.to_le_bytes(),
        &u64::MAX.to_le_bytes(),
    ];
    refused(
        &|b| b.metadata.push(("big".into(), 9, huge_array.concat())),
        "array elements",
    );
    refused(
        &|b| b.metadata.push(("b".into(), 7, vec![2])),
        "a bool of 2",
    );
    let alignment = |a: u32| ("general.alignment".to_string(), 4, a.to_le_bytes().to_vec());
    refused(&|b| b.metadata.push(alignment(48)), "a power of two");
    let mut nested = Vec::new();
    for _ in 0..9 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    refused(
        &|b| b.metadata.push(("deep".into(), 9, nested.clone())),
        "nested more than 8",
    );

    // Every truncation of a valid file is an error, never a panic.
    let bytes = Builder::valid().bytes();
    for length in 0..bytes.len() {
        let result = GgufFile::from_bytes("cut.gguf", bytes[..length].to_vec());
        assert!(result.is_err(), "{length} of {} bytes read", bytes.len());
    }
    let error = GgufFile::from_bytes("x.gguf", b"PK\x03\x04rest".to_vec()).unwrap_err();
    assert!(error.to_string().contains("not a GGUF file"), "{error}");
}

#[test]
fn an_unsupported_type_is_named_when_read() {
    let mut builder = Builder::valid();
    // IQ4_NL: 32 elements in 18 bytes; the data holds 32.
    builder.tensors[0] = ("iq".into(), vec![32], 20, 0);
    let file = builder.open().unwrap();
    let error = file
        .dequantize(file.tensor("iq").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("tensor `iq` is IQ4_NL, which kiln does not dequantize"),
        "{error}"
    );
}

/// Metadata arrays take the memory their file takes: a uint8 array a byte an element, a string
/// array its text and an offset a string (as generic values, a 160 MB file of bytes became 4 GB).
#[test]
fn metadata_arrays_are_held_as_compactly_as_the_file_holds_them() {
    let mut builder = Builder::valid();
    let bytes: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let array = |kind: u32, count: usize, values: &[u8]| {
        [
            &kind.to_le_bytes()[..],
            &(count as u64).to_le_bytes(),
            values,
        ]
        .concat()
    };
    let words: Vec<u8> = ["Ġthe", "", "é"].iter().flat_map(|w| string(w)).collect();
    builder
        .metadata
        .push(("bytes".into(), 9, array(0, bytes.len(), &bytes)));
    builder
        .metadata
        .push(("words".into(), 9, array(8, 3, &words)));
    builder
        .metadata
        .push(("flags".into(), 9, array(7, 2, &[1, 0])));
    let file = builder.open().unwrap();
    let held = file.get("bytes").unwrap().as_array().unwrap();
    assert_eq!(held, &Array::U8(bytes));
    assert_eq!((held.len(), held.element_type()), (100_000, "uint8"));
    let words = file
        .get("words")
        .unwrap()
        .as_array()
        .unwrap()
        .strings()
        .unwrap();
    assert_eq!(words.iter().collect::<Vec<_>>(), ["Ġthe", "", "é"]);
    assert_eq!((words.get(2), words.get(3)), (Some("é"), None));
    let flags = file.get("flags").unwrap().as_array().unwrap();
    assert_eq!(flags, &Array::Bool(vec![true, false]));
    assert_eq!(flags.integers(), None);
}

/// A directory is refused by name; a file cut short after it was opened is an error naming it
/// when a tensor is read (it was a SIGBUS through a memory map).
#[test]
fn a_file_that_is_not_one_or_is_cut_short_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let error = GgufFile::open(dir.path()).unwrap_err().to_string();
    assert!(
        error.ends_with("is a directory, where a file is read"),
        "{error}"
    );
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, Builder::valid().bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let tensor = file.tensor("w").unwrap().clone();
    assert_eq!(file.dequantize(&tensor).unwrap()[7], 7.0);
    let length = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(length - 8)
        .unwrap();
    let error = file.dequantize(&tensor).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}: ended at byte", path.display())),
        "{error}"
    );
    assert!(error.contains("cut short or replaced"), "{error}");
}
