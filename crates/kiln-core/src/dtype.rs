//! Float element types as kiln names them, and their mapping to burn's [`FloatDType`].

use std::fmt;
use std::str::FromStr;

use burn::tensor::{DType, FloatDType};

use crate::PrecisionError;

/// A floating-point element type a policy can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// IEEE binary64.
    F64,
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    BF16,
}

/// The names [`Precision`] and [`DtypeSpec`] accept, as in jmp (`float32`, `f32`, `full`, …).
pub(crate) const DTYPE_NAMES: &str =
    "f64, f32, f16, bf16, half, full (= f32), float64, float32, float16, bfloat16";

impl Precision {
    /// burn's dtype for this precision.
    pub fn float_dtype(self) -> FloatDType {
        match self {
            Precision::F64 => FloatDType::F64,
            Precision::F32 => FloatDType::F32,
            Precision::F16 => FloatDType::F16,
            Precision::BF16 => FloatDType::BF16,
        }
    }

    /// burn's general dtype for this precision.
    pub fn dtype(self) -> DType {
        self.float_dtype().into()
    }

    /// The precision of a burn dtype, if it is one of the four kiln uses.
    pub fn from_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F64 => Some(Precision::F64),
            DType::F32 | DType::Flex32 => Some(Precision::F32),
            DType::F16 => Some(Precision::F16),
            DType::BF16 => Some(Precision::BF16),
            _ => None,
        }
    }

    /// True for the 16-bit types, which the keep-in-f32 set widens.
    pub fn is_half(self) -> bool {
        matches!(self, Precision::F16 | Precision::BF16)
    }

    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            Precision::F64 => 8,
            Precision::F32 => 4,
            Precision::F16 | Precision::BF16 => 2,
        }
    }

    /// Every precision, widest first.
    pub const ALL: [Precision; 4] = [
        Precision::F64,
        Precision::F32,
        Precision::F16,
        Precision::BF16,
    ];
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::BF16 => "bf16",
        })
    }
}

/// A dtype as written in a policy string: a concrete precision or `half`, which is resolved per
/// device (bf16 where the device computes in bf16, else f16, else f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DtypeSpec {
    /// A fixed precision.
    Exact(Precision),
    /// The best 16-bit type of the device.
    Half,
}

impl FromStr for DtypeSpec {
    type Err = PrecisionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let exact = |p| Ok(DtypeSpec::Exact(p));
        match s.trim().to_ascii_lowercase().as_str() {
            "f64" | "float64" | "double" => exact(Precision::F64),
            "f32" | "float32" | "full" | "float" => exact(Precision::F32),
            "f16" | "float16" => exact(Precision::F16),
            "bf16" | "bfloat16" => exact(Precision::BF16),
            "half" => Ok(DtypeSpec::Half),
            _ => Err(PrecisionError::UnknownDtype(s.trim().to_string())),
        }
    }
}

impl fmt::Display for DtypeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DtypeSpec::Exact(p) => p.fmt(f),
            DtypeSpec::Half => f.write_str("half"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_the_right_precision() {
        for (name, want) in [
            ("float32", DtypeSpec::Exact(Precision::F32)),
            ("F32", DtypeSpec::Exact(Precision::F32)),
            ("full", DtypeSpec::Exact(Precision::F32)),
            ("bfloat16", DtypeSpec::Exact(Precision::BF16)),
            ("f16", DtypeSpec::Exact(Precision::F16)),
            (" f64 ", DtypeSpec::Exact(Precision::F64)),
            ("half", DtypeSpec::Half),
        ] {
            assert_eq!(name.parse::<DtypeSpec>().unwrap(), want, "{name}");
        }
        let err = "f8".parse::<DtypeSpec>().unwrap_err().to_string();
        assert!(err.contains("f8") && err.contains("bf16"), "{err}");
    }

    #[test]
    fn precision_round_trips_through_burn_dtype() {
        for p in Precision::ALL {
            assert_eq!(Precision::from_dtype(p.dtype()), Some(p));
            assert_eq!(
                p.to_string().parse::<DtypeSpec>().unwrap(),
                DtypeSpec::Exact(p)
            );
        }
        assert_eq!(Precision::from_dtype(DType::I32), None);
    }
}
