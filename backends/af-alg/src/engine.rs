//! The engine table: which driver names are which engines.
//!
//! `/proc/crypto` names implementations, not hardware. Drivers follow
//! per-vendor naming habits (`cbc-aes-omap`, `safexcel-cbc-aes`,
//! `qat_aes_cbc`, `virtio_crypto_aes_cbc`), which this table turns into an
//! engine family, whether it is hardware, and what is known of its limits.
//! A template instance (`gcm(ctr-aes-qce,ghash-generic)`) takes the family of
//! the first hardware driver inside it.
//!
//! A family is data here — a name pattern, a short name, whether it is
//! hardware, a request limit, an alignment — with no code of its own, so
//! there is no cargo feature per family: one would remove a table row and
//! multiply the build matrix. A family that needs code in the request path
//! gets a feature with it.

/// How a driver name is matched.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    Prefix(&'static str),
    Contains(&'static str),
}

impl Pattern {
    fn matches(self, driver: &str) -> bool {
        match self {
            Pattern::Prefix(p) => driver.starts_with(p) || driver.contains(&format!("({p}")),
            Pattern::Contains(p) => driver.contains(p),
        }
    }
}

/// An engine family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// x86 AES-NI / VAES / PCLMULQDQ code in the kernel (CPU).
    X86Simd,
    /// ARM Crypto Extensions / NEON code in the kernel (CPU).
    ArmCe,
    /// The kernel's portable C code (CPU).
    Generic,
    /// TI OMAP AES/SHAM.
    Omap,
    /// Qualcomm Crypto Engine.
    Qce,
    /// Inside-Secure SafeXcel (EIP-97/EIP-197).
    Safexcel,
    /// AMCC/AppliedMicro PPC4xx crypto.
    Crypto4xx,
    /// Marvell CESA.
    MvCesa,
    /// NXP CAAM.
    Caam,
    /// AMD Cryptographic Coprocessor.
    Ccp,
    /// Intel QuickAssist.
    Qat,
    /// HiSilicon SEC.
    Hisi,
    /// Allwinner sun8i Crypto Engine.
    Sun8iCe,
    /// STMicroelectronics STM32 CRYP/HASH/CRC.
    Stm32,
    /// Rockchip crypto.
    Rockchip,
    /// virtio-crypto (a hypervisor's engine; QEMU's in the test guest).
    VirtioCrypto,
    /// A driver this table does not know; not offered as an engine.
    Unknown,
}

/// What the table says of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Engine {
    /// The family.
    pub family: Family,
    /// A short name for backends and reports, e.g. `"omap"`.
    pub short_name: &'static str,
    /// Whether it is a device (not the CPU running kernel code). CPU-backed
    /// kernel drivers never beat userspace code and are not offered as
    /// engines by default.
    pub hardware: bool,
    /// The largest request the driver takes in one operation, where one is
    /// known beyond the socket's own limit.
    pub max_request: Option<usize>,
    /// The address alignment the driver wants of each piece of a request,
    /// in bytes (1: none known). Copied data is page-aligned in the
    /// socket; spliced data keeps the caller's alignment, so a request is
    /// spliced only where its buffer has this alignment (a misaligned one
    /// would make the driver copy it to a bounce buffer, or give up on the
    /// engine and compute it on the CPU).
    pub align: usize,
}

const fn engine(family: Family, short_name: &'static str, hardware: bool) -> Engine {
    Engine {
        family,
        short_name,
        hardware,
        max_request: None,
        align: 1,
    }
}

/// QEMU's virtio-crypto device (10.0, builtin backend) marks itself broken —
/// "virtio: too many write descriptors in indirect table" — on a 128 KiB
/// AES-CBC request from Linux's `virtio_crypto` driver, and every later
/// request hangs; 96 KiB works (measured in the test guest). 64 KiB keeps a
/// margin for buffers that straddle more pages.
const VIRTIO_CRYPTO: Engine = Engine {
    max_request: Some(64 * 1024),
    ..engine(Family::VirtioCrypto, "virtio_crypto", true)
};

/// Drivers that check every scatterlist entry for a 4-byte-aligned offset
/// (OMAP and STM32 also for a length in whole blocks): `omap_crypto_align_sg`
/// and `stm32_cryp_check_aligned` copy a request that fails to a bounce
/// buffer; `sun8i_ce_cipher_need_fallback` sends it to the software fallback
/// instead of the engine. Spliced pieces run from the buffer's start to page
/// boundaries, so a 16-byte-aligned buffer satisfies both.
const ALIGN_4_OMAP: Engine = Engine {
    align: 16,
    ..engine(Family::Omap, "omap", true)
};
const ALIGN_4_SUN8I_CE: Engine = Engine {
    align: 16,
    ..engine(Family::Sun8iCe, "sun8i-ce", true)
};
const ALIGN_4_STM32: Engine = Engine {
    align: 16,
    ..engine(Family::Stm32, "stm32", true)
};

/// Hardware first: `sun8i-ce` must not read as ARM's `-ce`.
const TABLE: &[(Pattern, Engine)] = &[
    (Pattern::Contains("virtio_crypto"), VIRTIO_CRYPTO),
    (Pattern::Contains("-omap"), ALIGN_4_OMAP),
    (Pattern::Contains("-qce"), engine(Family::Qce, "qce", true)),
    (
        Pattern::Prefix("safexcel-"),
        engine(Family::Safexcel, "safexcel", true),
    ),
    (
        Pattern::Contains("-ppc4xx"),
        engine(Family::Crypto4xx, "crypto4xx", true),
    ),
    (
        Pattern::Prefix("mv-"),
        engine(Family::MvCesa, "mv_cesa", true),
    ),
    (
        Pattern::Contains("-caam"),
        engine(Family::Caam, "caam", true),
    ),
    (Pattern::Contains("-ccp"), engine(Family::Ccp, "ccp", true)),
    (Pattern::Prefix("qat_"), engine(Family::Qat, "qat", true)),
    (
        Pattern::Prefix("hisi_sec"),
        engine(Family::Hisi, "hisi", true),
    ),
    (Pattern::Contains("sun8i-ce"), ALIGN_4_SUN8I_CE),
    (Pattern::Prefix("stm32-"), ALIGN_4_STM32),
    (
        Pattern::Contains("-rk"),
        engine(Family::Rockchip, "rockchip", true),
    ),
    (
        Pattern::Contains("aesni"),
        engine(Family::X86Simd, "x86-simd", false),
    ),
    (
        Pattern::Contains("vaes"),
        engine(Family::X86Simd, "x86-simd", false),
    ),
    (
        Pattern::Contains("-avx"),
        engine(Family::X86Simd, "x86-simd", false),
    ),
    (
        Pattern::Contains("pclmul"),
        engine(Family::X86Simd, "x86-simd", false),
    ),
    (
        Pattern::Contains("-intel"),
        engine(Family::X86Simd, "x86-simd", false),
    ),
    (
        Pattern::Contains("-ce"),
        engine(Family::ArmCe, "arm-ce", false),
    ),
    (
        Pattern::Contains("-neon"),
        engine(Family::ArmCe, "arm-ce", false),
    ),
    (
        Pattern::Contains("-arm64"),
        engine(Family::ArmCe, "arm-ce", false),
    ),
    (
        Pattern::Contains("generic"),
        engine(Family::Generic, "generic", false),
    ),
];

/// The engine behind `driver`. Unknown drivers are [`Family::Unknown`], not
/// hardware.
pub fn classify(driver: &str) -> Engine {
    TABLE
        .iter()
        .find(|(p, _)| p.matches(driver))
        .map(|&(_, e)| e)
        .unwrap_or(engine(Family::Unknown, "unknown", false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_map_to_families() {
        let cases = [
            ("virtio_crypto_aes_cbc", Family::VirtioCrypto, true),
            ("cbc-aes-omap", Family::Omap, true),
            ("xts-aes-qce", Family::Qce, true),
            ("safexcel-cbc-aes", Family::Safexcel, true),
            ("cbc-aes-ppc4xx", Family::Crypto4xx, true),
            ("mv-cbc-aes", Family::MvCesa, true),
            ("cbc-aes-caam-qi2", Family::Caam, true),
            ("cbc-aes-ccp", Family::Ccp, true),
            ("qat_aes_cbc", Family::Qat, true),
            ("hisi_sec_aes_cbc", Family::Hisi, true),
            ("cbc-aes-sun8i-ce", Family::Sun8iCe, true),
            ("stm32-cbc-aes", Family::Stm32, true),
            ("cbc-aes-rk", Family::Rockchip, true),
            ("cbc-aes-aesni", Family::X86Simd, false),
            ("xts-aes-vaes-avx10_256", Family::X86Simd, false),
            ("crc32c-intel", Family::X86Simd, false),
            ("crc32-pclmul", Family::X86Simd, false),
            ("cbc-aes-ce", Family::ArmCe, false),
            ("cbc(aes-generic)", Family::Generic, false),
            ("crc64-rocksoft-generic", Family::Generic, false),
            ("something-new", Family::Unknown, false),
        ];
        assert_eq!(classify("virtio_crypto_aes_cbc").max_request, Some(65536));
        for driver in ["cbc-aes-omap", "cbc-aes-sun8i-ce", "stm32-cbc-aes"] {
            assert_eq!(classify(driver).align, 16, "{driver}");
        }
        assert_eq!(classify("virtio_crypto_aes_cbc").align, 1);
        for (driver, family, hardware) in cases {
            let e = classify(driver);
            assert_eq!((e.family, e.hardware), (family, hardware), "{driver}");
        }
    }

    #[test]
    fn a_template_over_an_engine_is_that_engine() {
        assert_eq!(
            classify("gcm_base(ctr-aes-qce,ghash-generic)").family,
            Family::Qce
        );
        assert_eq!(
            classify("gcm_base(mv-ctr-aes,ghash-generic)").family,
            Family::MvCesa
        );
        assert_eq!(
            classify("gcm_base(ctr-aes-aesni,ghash-generic)").family,
            Family::X86Simd
        );
    }
}
