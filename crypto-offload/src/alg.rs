//! The algorithms a session can run.

use core::fmt;

pub use crypto_offload_fallback::CrcAlg;

/// A block-cipher mode: AES in CBC (no padding), CTR (128-bit big-endian
/// counter) or XTS (IEEE 1619).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CipherAlg {
    /// AES-128-CBC, 16-byte key.
    Aes128Cbc,
    /// AES-192-CBC, 24-byte key.
    Aes192Cbc,
    /// AES-256-CBC, 32-byte key.
    Aes256Cbc,
    /// AES-128-CTR, 16-byte key.
    Aes128Ctr,
    /// AES-192-CTR, 24-byte key.
    Aes192Ctr,
    /// AES-256-CTR, 32-byte key.
    Aes256Ctr,
    /// XTS-AES-128, 32-byte key (two AES-128 keys).
    Aes128Xts,
    /// XTS-AES-192, 48-byte key (not in IEEE 1619; Linux and Wycheproof have it).
    Aes192Xts,
    /// XTS-AES-256, 64-byte key (two AES-256 keys).
    Aes256Xts,
}

/// The mode of a [`CipherAlg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CipherMode {
    /// Cipher block chaining: data in whole 16-byte blocks.
    Cbc,
    /// Counter mode: any length.
    Ctr,
    /// XEX tweakable block cipher with ciphertext stealing: data units of at
    /// least 16 bytes.
    Xts,
}

impl CipherAlg {
    /// Every cipher algorithm.
    pub const ALL: [CipherAlg; 9] = [
        CipherAlg::Aes128Cbc,
        CipherAlg::Aes192Cbc,
        CipherAlg::Aes256Cbc,
        CipherAlg::Aes128Ctr,
        CipherAlg::Aes192Ctr,
        CipherAlg::Aes256Ctr,
        CipherAlg::Aes128Xts,
        CipherAlg::Aes192Xts,
        CipherAlg::Aes256Xts,
    ];

    /// The mode.
    pub const fn mode(self) -> CipherMode {
        match self {
            CipherAlg::Aes128Cbc | CipherAlg::Aes192Cbc | CipherAlg::Aes256Cbc => CipherMode::Cbc,
            CipherAlg::Aes128Ctr | CipherAlg::Aes192Ctr | CipherAlg::Aes256Ctr => CipherMode::Ctr,
            CipherAlg::Aes128Xts | CipherAlg::Aes192Xts | CipherAlg::Aes256Xts => CipherMode::Xts,
        }
    }

    /// The key length in bytes (both halves for XTS).
    pub const fn key_len(self) -> usize {
        match self {
            CipherAlg::Aes128Cbc | CipherAlg::Aes128Ctr => 16,
            CipherAlg::Aes192Cbc | CipherAlg::Aes192Ctr => 24,
            CipherAlg::Aes256Cbc | CipherAlg::Aes256Ctr | CipherAlg::Aes128Xts => 32,
            CipherAlg::Aes192Xts => 48,
            CipherAlg::Aes256Xts => 64,
        }
    }

    /// The IV length in bytes: the CBC IV, the CTR initial counter block or
    /// the XTS tweak (the data-unit number, 128-bit little-endian).
    pub const fn iv_len(self) -> usize {
        16
    }

    /// A lowercase name, e.g. `"aes-256-xts"`.
    pub const fn name(self) -> &'static str {
        match self {
            CipherAlg::Aes128Cbc => "aes-128-cbc",
            CipherAlg::Aes192Cbc => "aes-192-cbc",
            CipherAlg::Aes256Cbc => "aes-256-cbc",
            CipherAlg::Aes128Ctr => "aes-128-ctr",
            CipherAlg::Aes192Ctr => "aes-192-ctr",
            CipherAlg::Aes256Ctr => "aes-256-ctr",
            CipherAlg::Aes128Xts => "aes-128-xts",
            CipherAlg::Aes192Xts => "aes-192-xts",
            CipherAlg::Aes256Xts => "aes-256-xts",
        }
    }

    /// The algorithm called `name` (as [`CipherAlg::name`] prints it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// An AEAD: AES-GCM with a 96-bit nonce and a 128-bit tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AeadAlg {
    /// AES-128-GCM, 16-byte key.
    Aes128Gcm,
    /// AES-192-GCM, 24-byte key.
    Aes192Gcm,
    /// AES-256-GCM, 32-byte key.
    Aes256Gcm,
}

impl AeadAlg {
    /// Every AEAD algorithm.
    pub const ALL: [AeadAlg; 3] = [AeadAlg::Aes128Gcm, AeadAlg::Aes192Gcm, AeadAlg::Aes256Gcm];

    /// The key length in bytes.
    pub const fn key_len(self) -> usize {
        match self {
            AeadAlg::Aes128Gcm => 16,
            AeadAlg::Aes192Gcm => 24,
            AeadAlg::Aes256Gcm => 32,
        }
    }

    /// The nonce length in bytes (12).
    pub const fn nonce_len(self) -> usize {
        crypto_offload_fallback::GCM_NONCE_LEN
    }

    /// The tag length in bytes (16).
    pub const fn tag_len(self) -> usize {
        crypto_offload_fallback::GCM_TAG_LEN
    }

    /// A lowercase name, e.g. `"aes-128-gcm"`.
    pub const fn name(self) -> &'static str {
        match self {
            AeadAlg::Aes128Gcm => "aes-128-gcm",
            AeadAlg::Aes192Gcm => "aes-192-gcm",
            AeadAlg::Aes256Gcm => "aes-256-gcm",
        }
    }

    /// The algorithm called `name` (as [`AeadAlg::name`] prints it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// Any algorithm: what a backend can be asked whether it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A block-cipher mode.
    Cipher(CipherAlg),
    /// An AEAD.
    Aead(AeadAlg),
    /// A CRC.
    Crc(CrcAlg),
}

impl Algorithm {
    /// Every algorithm.
    pub fn all() -> impl Iterator<Item = Algorithm> {
        CipherAlg::ALL
            .into_iter()
            .map(Algorithm::Cipher)
            .chain(AeadAlg::ALL.into_iter().map(Algorithm::Aead))
            .chain(CrcAlg::ALL.into_iter().map(Algorithm::Crc))
    }

    /// The algorithm's name (`"aes-128-gcm"`, `"CRC-32/ISCSI"`, …): ciphers
    /// by their OpenSSL-style names, CRCs by their catalogue names, which
    /// say the parameters exactly. [`CrcAlg::short_name`] gives the
    /// tools' style (`crc32c`); [`Algorithm::from_name`] takes either.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Cipher(a) => a.name(),
            Algorithm::Aead(a) => a.name(),
            Algorithm::Crc(a) => a.name(),
        }
    }
}

impl Algorithm {
    /// The algorithm called `name`, ignoring case: its name as
    /// [`Algorithm::name`] prints it, or any name [`CrcAlg::from_name`]
    /// takes (`crc32c`, `castagnoli`, …).
    ///
    /// ```
    /// use crypto_offload::{Algorithm, CrcAlg};
    ///
    /// let crc = Algorithm::from_name("crc32c");
    /// assert_eq!(crc, Some(Algorithm::Crc(CrcAlg::CRC32C)));
    /// assert_eq!(crc.map(Algorithm::name), Some("CRC-32/ISCSI"));
    /// assert_eq!(Algorithm::from_name("aes-256-xts").map(Algorithm::name), Some("aes-256-xts"));
    /// ```
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::all()
            .find(|a| a.name().eq_ignore_ascii_case(name.trim()))
            .or_else(|| CrcAlg::from_name(name).map(Algorithm::Crc))
    }
}

impl From<CipherAlg> for Algorithm {
    fn from(a: CipherAlg) -> Self {
        Algorithm::Cipher(a)
    }
}

impl From<AeadAlg> for Algorithm {
    fn from(a: AeadAlg) -> Self {
        Algorithm::Aead(a)
    }
}

impl From<CrcAlg> for Algorithm {
    fn from(a: CrcAlg) -> Self {
        Algorithm::Crc(a)
    }
}

impl fmt::Display for CipherAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for AeadAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
