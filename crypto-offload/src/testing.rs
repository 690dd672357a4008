//! The known-answer harness every backend runs (feature `testing`).
//!
//! One function, [`run_vectors`], runs every vector this crate carries —
//! NIST SP 800-38A, IEEE 1619, the GCM specification, the CRC catalogue, our
//! computed edge cases (all in `vectors/*.txt`, each file naming its source)
//! and Wycheproof's AES-GCM, AES-CBC-PKCS5 and AES-XTS sets — through the
//! sessions of an [`Offload`]. Pin a backend in the `Offload` to test that
//! backend; algorithms it does not run are counted, not failed:
//!
//! ```
//! # futures::executor::block_on(async {
//! use crypto_offload::{Offload, testing};
//! let offload = Offload::builder().pin("cpu").build()?;
//! let report = testing::run_vectors(&offload).await;
//! report.assert_ok();
//! assert!(report.passed > 600);
//! # Ok::<(), crypto_offload::Error>(()) });
//! ```
//!
//! Each vector runs with both buffer types, encrypt and decrypt, and (for
//! CRC) split across two updates; invalid AEAD vectors must fail with
//! [`Error::Authentication`] and hand back a zeroed buffer; XTS keys with
//! equal halves must be refused with [`Error::WeakKey`].

use core::fmt;

use bytes::BytesMut;

use crate::alg::{AeadAlg, CipherAlg, CipherMode, CrcAlg};
use crate::buffer::Buffer;
use crate::error::Error;
use crate::offload::Offload;

/// The vector files, embedded.
pub const FILES: [(&str, &str); 5] = [
    ("sp800-38a.txt", include_str!("../vectors/sp800-38a.txt")),
    (
        "ieee1619-xts.txt",
        include_str!("../vectors/ieee1619-xts.txt"),
    ),
    ("gcm-spec.txt", include_str!("../vectors/gcm-spec.txt")),
    (
        "crc-catalogue.txt",
        include_str!("../vectors/crc-catalogue.txt"),
    ),
    ("edge-cases.txt", include_str!("../vectors/edge-cases.txt")),
];

/// One known-answer test.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Case {
    /// `encrypt(key, iv, pt) == ct` (and back).
    Cipher {
        /// The algorithm.
        alg: CipherAlg,
        /// The key.
        key: Vec<u8>,
        /// The IV / counter block / tweak.
        iv: Vec<u8>,
        /// Plaintext.
        pt: Vec<u8>,
        /// Ciphertext.
        ct: Vec<u8>,
    },
    /// A CBC ciphertext whose PKCS#7 padding is invalid (Wycheproof): it must
    /// decrypt, and the padding must then be found invalid.
    CbcBadPadding {
        /// The algorithm.
        alg: CipherAlg,
        /// The key.
        key: Vec<u8>,
        /// The IV.
        iv: Vec<u8>,
        /// Ciphertext.
        ct: Vec<u8>,
    },
    /// `seal(key, nonce, aad, pt) == ct ‖ tag` (valid) or `open` must fail.
    Aead {
        /// The algorithm.
        alg: AeadAlg,
        /// The key.
        key: Vec<u8>,
        /// The nonce.
        nonce: Vec<u8>,
        /// Associated data.
        aad: Vec<u8>,
        /// Plaintext (valid vectors).
        pt: Vec<u8>,
        /// Ciphertext.
        ct: Vec<u8>,
        /// Tag.
        tag: Vec<u8>,
        /// Whether the tag verifies.
        valid: bool,
    },
    /// `crc(input) == crc`.
    Crc {
        /// The algorithm.
        alg: CrcAlg,
        /// The input.
        input: Vec<u8>,
        /// The expected CRC.
        crc: u64,
    },
}

/// A case and where it came from.
#[derive(Clone)]
pub struct Vector {
    /// File (or Wycheproof set) and the record's own source line.
    pub source: String,
    /// The test.
    pub case: Case,
}

impl fmt::Debug for Vector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// What [`run_vectors`] found.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// Vectors that passed.
    pub passed: usize,
    /// Vectors for algorithms the pinned backend does not run.
    pub unsupported: usize,
    /// Vectors skipped because this crate does not take their shape
    /// (Wycheproof GCM with non-96-bit nonces or short tags).
    pub skipped: usize,
    /// One line per failure.
    pub failures: Vec<String>,
}

impl Report {
    /// Panics with every failure listed if there is any, or if nothing ran.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(
            self.failures.is_empty(),
            "{} known-answer failures:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
        assert!(self.passed > 0, "no vector ran");
    }
}

/// A vector file that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{file}: record {record}: {msg}")]
pub struct ParseError {
    file: String,
    record: usize,
    msg: String,
}

/// Parses one vector file (the format is described in `vectors/README.md`).
///
/// # Errors
/// [`ParseError`] naming the record on any malformed record.
pub fn parse(file: &str, text: &str) -> Result<Vec<Vector>, ParseError> {
    let mut out = Vec::new();
    let records = text
        .split("\n\n")
        .map(|r| {
            r.lines()
                .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|r| !r.is_empty());
    for (n, lines) in records.enumerate() {
        let err = |msg: String| ParseError {
            file: file.to_owned(),
            record: n + 1,
            msg,
        };
        let mut fields = std::collections::BTreeMap::new();
        for line in lines {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| err(format!("no '=' in {line:?}")))?;
            fields.insert(k.trim(), v.trim());
        }
        let get = |k: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| err(format!("missing {k}")))
        };
        let hex = |k: &str| {
            get(k).and_then(|v| decode_hex(v).ok_or_else(|| err(format!("bad hex in {k}"))))
        };
        let alg = get("alg")?;
        let source = format!("{file}: {}", fields.get("source").copied().unwrap_or("?"));
        let case = if let Some(alg) = CipherAlg::from_name(alg) {
            Case::Cipher {
                alg,
                key: hex("key")?,
                iv: hex("iv")?,
                pt: hex("pt")?,
                ct: hex("ct")?,
            }
        } else if let Some(alg) = AeadAlg::from_name(alg) {
            Case::Aead {
                alg,
                key: hex("key")?,
                nonce: hex("iv")?,
                aad: hex("aad")?,
                pt: hex("pt")?,
                ct: hex("ct")?,
                tag: hex("tag")?,
                valid: match get("result")? {
                    "valid" => true,
                    "invalid" => false,
                    other => return Err(err(format!("result {other:?}"))),
                },
            }
        } else if let Some(crc_alg) = CrcAlg::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(alg))
        {
            Case::Crc {
                alg: crc_alg,
                input: hex("input")?,
                crc: u64::from_str_radix(get("crc")?, 16).map_err(|e| err(e.to_string()))?,
            }
        } else {
            return Err(err(format!("unknown alg {alg:?}")));
        };
        out.push(Vector { source, case });
    }
    Ok(out)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Every vector: the files, then Wycheproof. The second value counts the
/// Wycheproof vectors of shapes this crate does not take.
pub fn vectors() -> (Vec<Vector>, usize) {
    let mut out = Vec::new();
    for (file, text) in FILES {
        match parse(file, text) {
            Ok(v) => out.extend(v),
            // The files are embedded: a parse error is a bug in this crate,
            // caught by its own tests.
            Err(e) => panic!("{e}"),
        }
    }
    let skipped = wycheproof_vectors(&mut out);
    (out, skipped)
}

fn wycheproof_vectors(out: &mut Vec<Vector>) -> usize {
    use wycheproof::TestResult;
    let mut skipped = 0;
    if let Ok(set) = wycheproof::aead::TestSet::load(wycheproof::aead::TestName::AesGcm) {
        for g in &set.test_groups {
            let alg = match g.key_size {
                128 => Some(AeadAlg::Aes128Gcm),
                192 => Some(AeadAlg::Aes192Gcm),
                256 => Some(AeadAlg::Aes256Gcm),
                _ => None,
            };
            for t in &g.tests {
                let Some(alg) = alg.filter(|_| g.nonce_size == 96 && g.tag_size == 128) else {
                    skipped += 1;
                    continue;
                };
                out.push(Vector {
                    source: format!("wycheproof aes_gcm tcId {} ({})", t.tc_id, t.comment),
                    case: Case::Aead {
                        alg,
                        key: t.key.to_vec(),
                        nonce: t.nonce.to_vec(),
                        aad: t.aad.to_vec(),
                        pt: t.pt.to_vec(),
                        ct: t.ct.to_vec(),
                        tag: t.tag.to_vec(),
                        valid: t.result != TestResult::Invalid,
                    },
                });
            }
        }
    }
    for name in [
        wycheproof::cipher::TestName::AesCbcPkcs5,
        wycheproof::cipher::TestName::AesXts,
    ] {
        let xts = matches!(name, wycheproof::cipher::TestName::AesXts);
        let Ok(set) = wycheproof::cipher::TestSet::load(name) else {
            continue;
        };
        for g in &set.test_groups {
            let alg = match (xts, g.key_size) {
                (false, 128) => CipherAlg::Aes128Cbc,
                (false, 192) => CipherAlg::Aes192Cbc,
                (false, 256) => CipherAlg::Aes256Cbc,
                (true, 256) => CipherAlg::Aes128Xts,
                (true, 384) => CipherAlg::Aes192Xts,
                (true, 512) => CipherAlg::Aes256Xts,
                _ => {
                    skipped += g.tests.len();
                    continue;
                }
            };
            for t in &g.tests {
                let set = if xts { "aes_xts" } else { "aes_cbc_pkcs5" };
                let source = format!("wycheproof {set} tcId {} ({})", t.tc_id, t.comment);
                let mut iv = t.nonce.to_vec();
                if xts {
                    // Wycheproof's XTS IVs are 1-16 bytes: the tweak is the IV
                    // padded with zeros to 16.
                    iv.resize(16, 0);
                }
                let case = if xts {
                    Case::Cipher {
                        alg,
                        key: t.key.to_vec(),
                        iv,
                        pt: t.pt.to_vec(),
                        ct: t.ct.to_vec(),
                    }
                } else if t.result == TestResult::Invalid {
                    Case::CbcBadPadding {
                        alg,
                        key: t.key.to_vec(),
                        iv,
                        ct: t.ct.to_vec(),
                    }
                } else {
                    let mut pt = t.pt.to_vec();
                    let pad = 16 - pt.len() % 16;
                    pt.resize(pt.len() + pad, pad as u8);
                    Case::Cipher {
                        alg,
                        key: t.key.to_vec(),
                        iv,
                        pt,
                        ct: t.ct.to_vec(),
                    }
                };
                out.push(Vector { source, case });
            }
        }
    }
    skipped
}

enum Outcome {
    Pass,
    Unsupported,
    Fail(String),
}

/// Runs every vector through `offload`'s sessions.
///
/// # Cancel safety
/// Dropping the future only stops the run.
pub async fn run_vectors(offload: &Offload) -> Report {
    let (vectors, skipped) = vectors();
    let mut report = Report {
        skipped,
        ..Report::default()
    };
    for (i, v) in vectors.iter().enumerate() {
        // Alternate the buffer type so both go through every backend.
        let outcome = if i % 2 == 0 {
            run_one::<Vec<u8>>(offload, &v.case).await
        } else {
            run_one::<BytesMut>(offload, &v.case).await
        };
        match outcome {
            Outcome::Pass => report.passed += 1,
            Outcome::Unsupported => report.unsupported += 1,
            Outcome::Fail(why) => report.failures.push(format!("{}: {why}", v.source)),
        }
    }
    report
}

trait TestBuf: Buffer + Sized {
    fn make(data: &[u8]) -> Self;
    fn bytes(&self) -> &[u8];
}

impl TestBuf for Vec<u8> {
    fn make(data: &[u8]) -> Self {
        data.to_vec()
    }
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl TestBuf for BytesMut {
    fn make(data: &[u8]) -> Self {
        BytesMut::from(data)
    }
    fn bytes(&self) -> &[u8] {
        self
    }
}

macro_rules! try_open {
    ($open:expr) => {
        match $open.await {
            Ok(s) => s,
            Err(Error::Unsupported { .. }) => return Outcome::Unsupported,
            Err(e) => return Outcome::Fail(format!("open: {e}")),
        }
    };
}

macro_rules! check {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Outcome::Fail(format!($($why)+));
        }
    };
}

async fn run_one<B: TestBuf>(offload: &Offload, case: &Case) -> Outcome {
    match case {
        Case::Cipher {
            alg,
            key,
            iv,
            pt,
            ct,
        } => {
            let weak =
                alg.mode() == CipherMode::Xts && key[..key.len() / 2] == key[key.len() / 2..];
            if weak {
                return match offload.cipher(*alg, key).await {
                    Err(Error::WeakKey { .. }) => Outcome::Pass,
                    Err(Error::Unsupported { .. }) => Outcome::Unsupported,
                    other => Outcome::Fail(format!(
                        "XTS key with equal halves: expected WeakKey, got {other:?}"
                    )),
                };
            }
            let s = try_open!(offload.cipher(*alg, key));
            let got = match s.encrypt(iv, B::make(pt)).await {
                Ok(b) => b,
                Err(e) => return Outcome::Fail(format!("encrypt: {}", e.error())),
            };
            check!(got.bytes() == ct.as_slice(), "encrypt: wrong ciphertext");
            let back = match s.decrypt(iv, B::make(ct)).await {
                Ok(b) => b,
                Err(e) => return Outcome::Fail(format!("decrypt: {}", e.error())),
            };
            check!(back.bytes() == pt.as_slice(), "decrypt: wrong plaintext");
            Outcome::Pass
        }
        Case::CbcBadPadding { alg, key, iv, ct } => {
            let s = try_open!(offload.cipher(*alg, key));
            match s.decrypt(iv, B::make(ct)).await {
                // A ciphertext that is not whole blocks is refused: also a pass.
                Err(e) if matches!(e.error(), Error::DataLength { .. }) => Outcome::Pass,
                Err(e) => Outcome::Fail(format!("decrypt: {}", e.error())),
                Ok(pt) => {
                    check!(
                        !pkcs7_ok(pt.bytes()),
                        "decrypted to valid padding; Wycheproof says invalid"
                    );
                    Outcome::Pass
                }
            }
        }
        Case::Aead {
            alg,
            key,
            nonce,
            aad,
            pt,
            ct,
            tag,
            valid,
        } => {
            let s = try_open!(offload.aead(*alg, key));
            if *valid {
                let sealed = match s.seal(nonce, aad, B::make(pt)).await {
                    Ok(b) => b,
                    Err(e) => return Outcome::Fail(format!("seal: {}", e.error())),
                };
                let mut want = ct.clone();
                want.extend_from_slice(tag);
                check!(
                    sealed.bytes() == want.as_slice(),
                    "seal: wrong ciphertext or tag"
                );
                match s.open_detached(nonce, aad, B::make(ct), tag).await {
                    Ok(got) => check!(got.bytes() == pt.as_slice(), "open: wrong plaintext"),
                    Err(e) => return Outcome::Fail(format!("open: {}", e.error())),
                }
                Outcome::Pass
            } else {
                let mut msg = ct.clone();
                msg.extend_from_slice(tag);
                match s.open(nonce, aad, B::make(&msg)).await {
                    Ok(_) => Outcome::Fail("open accepted an invalid tag".into()),
                    Err(e) => {
                        check!(
                            matches!(e.error(), Error::Authentication | Error::TagLength { .. }),
                            "open: expected Authentication, got {}",
                            e.error()
                        );
                        check!(
                            e.into_buffer().bytes().iter().all(|&b| b == 0),
                            "open released data"
                        );
                        Outcome::Pass
                    }
                }
            }
        }
        Case::Crc { alg, input, crc } => {
            let mut s = try_open!(offload.crc(*alg));
            let half = input.len() / 2;
            if let Err(e) = s.update(B::make(&input[..half])).await {
                return Outcome::Fail(format!("update: {}", e.error()));
            }
            if let Err(e) = s.update(B::make(&input[half..])).await {
                return Outcome::Fail(format!("update: {}", e.error()));
            }
            check!(
                s.finalize() == *crc,
                "crc {:#x}, expected {crc:#x}",
                s.finalize()
            );
            check!(s.verify(*crc).is_ok(), "verify");
            Outcome::Pass
        }
    }
}

fn pkcs7_ok(pt: &[u8]) -> bool {
    let Some(&n) = pt.last() else { return false };
    (1..=16).contains(&n)
        && pt.len() >= usize::from(n)
        && pt[pt.len() - usize::from(n)..].iter().all(|&b| b == n)
}
