//! Which instruction set multiplies bf16 operands here, decided once per process.

use std::sync::OnceLock;

/// An instruction set that multiplies pairs of bf16 values into f32 accumulators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Isa {
    /// Intel AMX: `tdpbf16ps` on 16 × 16 f32 tiles (Sapphire Rapids and later), 1 024 bf16
    /// multiply-adds a cycle a core.
    Amx,
    /// AVX512-BF16: `vdpbf16ps` on 512-bit registers (Cooper Lake, AMD Zen 4 and Zen 5), twice
    /// AVX-512's f32 rate.
    Avx512Bf16,
}

impl Bf16Isa {
    /// The instruction set bf16 products run on in this process: AMX where the CPU has it and
    /// the kernel grants the tile state, else AVX512-BF16 on AMD's CPUs (Zen 4 and 5), else
    /// none. `KILN_BF16=amx`, `KILN_BF16=avx512-bf16` or `KILN_BF16=off` narrows the choice (a
    /// set the CPU lacks is never chosen); `KILN_BF16=avx512-bf16` also takes AVX512-BF16 on
    /// Intel's CPUs, where it is not the default: on a Sapphire Rapids core one `vdpbf16ps` a
    /// cycle multiplies no faster than f32's two FMA ports, and the main job ran 0.7× its f32
    /// speed that way (docs/PERFORMANCE.md).
    pub fn chosen() -> Option<Bf16Isa> {
        static CHOSEN: OnceLock<Option<Bf16Isa>> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let wanted = std::env::var("KILN_BF16").unwrap_or_default();
            let allowed = |isa: Bf16Isa| match wanted.trim().to_ascii_lowercase().as_str() {
                "off" | "none" | "f32" => false,
                "amx" => isa == Bf16Isa::Amx,
                "avx512-bf16" | "avx512bf16" => isa == Bf16Isa::Avx512Bf16,
                _ => isa == Bf16Isa::Amx || is_amd(),
            };
            [Bf16Isa::Amx, Bf16Isa::Avx512Bf16]
                .into_iter()
                .find(|&isa| allowed(isa) && isa.available())
        })
    }

    /// Whether this CPU (and, for AMX, the operating system) runs this instruction set.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Bf16Isa::Amx => super::amx::available(),
                Bf16Isa::Avx512Bf16 => super::avx512_bf16::available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The name `lscpu` gives the instruction set's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Bf16Isa::Amx => "amx_bf16",
            Bf16Isa::Avx512Bf16 => "avx512_bf16",
        }
    }
}

/// Whether the CPU is AMD's (CPUID vendor `AuthenticAMD`).
fn is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID exists on every x86-64 CPU.
        #[allow(unsafe_code, unused_unsafe)]
        let vendor = unsafe { std::arch::x86_64::__cpuid(0) };
        let bytes: Vec<u8> = [vendor.ebx, vendor.edx, vendor.ecx]
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect();
        bytes == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl std::fmt::Display for Bf16Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bf16Isa::Amx => "AMX tiles (tdpbf16ps)",
            Bf16Isa::Avx512Bf16 => "AVX512-BF16 (vdpbf16ps)",
        })
    }
}
