//! GGUF metadata values. Arrays are held by element type, as compactly as the file holds them
//! (a `uint8` array takes a byte an element, a string array its text and one offset a string),
//! so that metadata can never take much more memory than the file's own bytes.

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
    /// Values of one type, held as compactly as the file holds them.
    Array(Array),
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
    pub fn as_array(&self) -> Option<&Array> {
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

/// A metadata array: values of one type.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Strings),
    /// Arrays (of any one type each).
    Array(Vec<Array>),
}

impl Array {
    /// How many values it holds.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of its values' type.
    pub fn element_type(&self) -> &'static str {
        match self {
            Array::U8(_) => "uint8",
            Array::I8(_) => "int8",
            Array::U16(_) => "uint16",
            Array::I16(_) => "int16",
            Array::U32(_) => "uint32",
            Array::I32(_) => "int32",
            Array::U64(_) => "uint64",
            Array::I64(_) => "int64",
            Array::F32(_) => "float32",
            Array::F64(_) => "float64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }

    /// Its strings, when it holds strings.
    pub fn strings(&self) -> Option<&Strings> {
        match self {
            Array::String(strings) => Some(strings),
            _ => None,
        }
    }

    /// Its arrays, when it holds arrays.
    pub fn arrays(&self) -> Option<&[Array]> {
        match self {
            Array::Array(arrays) => Some(arrays),
            _ => None,
        }
    }

    /// Its values as i64, when it holds integers of any width that all fit one.
    pub fn integers(&self) -> Option<Vec<i64>> {
        fn all<T: Copy>(values: &[T], into: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            values.iter().map(|&v| into(v)).collect()
        }
        match self {
            Array::U8(v) => all(v, |x| Some(x.into())),
            Array::I8(v) => all(v, |x| Some(x.into())),
            Array::U16(v) => all(v, |x| Some(x.into())),
            Array::I16(v) => all(v, |x| Some(x.into())),
            Array::U32(v) => all(v, |x| Some(x.into())),
            Array::I32(v) => all(v, |x| Some(x.into())),
            Array::U64(v) => all(v, |x| i64::try_from(x).ok()),
            Array::I64(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// A string array: the strings' text end to end, and where each ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strings {
    text: String,
    ends: Vec<usize>,
}

impl Strings {
    /// Appends `string`.
    pub(crate) fn push(&mut self, string: &str) {
        self.text.push_str(string);
        self.ends.push(self.text.len());
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `index`.
    pub fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)?;
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        Some(&self.text[start..end])
    }

    /// Every string, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|index| self.get(index).unwrap_or_default())
    }
}
