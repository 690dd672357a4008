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
//! # Ok::<(), crypto_offload::Error>(()) }).unwrap();
//! ```
//!
//! Each vector runs with both buffer types, encrypt and decrypt, and (for
//! CRC) split across two updates; invalid AEAD vectors must fail with
//! [`Error::Authentication`] and hand back a zeroed buffer; XTS keys with
//! equal halves must be refused with [`Error::WeakKey`].
//!
//! An `Offload` completes on the CPU whatever an engine fails, so right
//! answers alone do not show that the pinned backend gave them. The
//! [`Report`] also counts, from the `Offload`'s own counters, what the
//! pinned backend served, failed and had replayed, per algorithm it claims;
//! [`Report::assert_ok`] fails a backend that failed any request, had any
//! replayed on the CPU, refused a session for an algorithm it claims, or
//! served none of the vectors of an algorithm it claims (requests of a
//! shape outside its [`Limits`](crate::backend::Limits) go to the CPU and
//! are counted, not failed; a request the backend refuses at run time as
//! `Unsupported` is a failure here: its limits should have said so). The
//! counts are the `Offload`'s: run the vectors on an `Offload` nothing else
//! uses meanwhile.

use core::fmt;

use bytes::BytesMut;

use crate::alg::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg};
use crate::backend::BackendKind;
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
    /// One line per failure (a wrong answer, or a claim the pinned
    /// backend did not keep).
    pub failures: Vec<String>,
    /// The backend the `Offload` is pinned to, and what it did during the
    /// run; `None` when it is not pinned.
    pub pinned: Option<PinnedReport>,
}

/// What the pinned backend did during [`run_vectors`].
#[derive(Debug, Default, Clone)]
#[non_exhaustive]
pub struct PinnedReport {
    /// Its name.
    pub name: String,
    /// Requests it completed.
    pub requests: u64,
    /// Requests it failed (each completed on the CPU, or lost).
    pub failures: u64,
    /// Requests the CPU completed after a backend failed them.
    pub replayed: u64,
    /// Per algorithm it claims that had vectors with data: (algorithm,
    /// such vectors run, those with any of their bytes on it).
    pub served: Vec<(Algorithm, usize, usize)>,
}

impl Report {
    /// Every reason the run does not pass: failures, nothing run, and —
    /// when the `Offload` is pinned to an engine — requests it failed or
    /// had replayed, and algorithms it claims but served no vector of.
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.failures.clone();
        if self.passed == 0 {
            out.push("no vector ran".to_owned());
        }
        if let Some(p) = &self.pinned {
            if p.failures > 0 {
                out.push(format!("{} failed {} requests", p.name, p.failures));
            }
            if p.replayed > 0 {
                out.push(format!(
                    "{} requests were completed on the CPU after a backend failed them",
                    p.replayed
                ));
            }
            for &(alg, ran, on_it) in &p.served {
                if ran > 0 && on_it == 0 {
                    out.push(format!(
                        "{} claims {alg} but served none of its {ran} vectors",
                        p.name
                    ));
                }
            }
        }
        out
    }

    /// Panics with every problem listed ([`problems`](Self::problems)):
    /// a wrong answer, nothing run, or a pinned backend that failed
    /// requests, had them replayed, or did not serve what it claims.
    #[track_caller]
    pub fn assert_ok(&self) {
        let problems = self.problems();
        assert!(
            problems.is_empty(),
            "{} known-answer problems:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} unsupported, {} skipped, {} failed",
            self.passed,
            self.unsupported,
            self.skipped,
            self.failures.len()
        )?;
        if let Some(p) = &self.pinned {
            write!(
                f,
                "; {}: {} requests, {} failed, {} replayed on the CPU",
                p.name, p.requests, p.failures, p.replayed
            )?;
            let around: usize = p.served.iter().map(|&(_, ran, on)| ran - on).sum();
            if around > 0 {
                write!(f, ", {around} vectors ran elsewhere (outside its limits)")?;
            }
        }
        Ok(())
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

/// Runs every vector through `offload`'s sessions, and counts what the
/// backend it is pinned to (if any) did ([`Report::pinned`]).
///
/// # Cancel safety
/// Dropping the future only stops the run.
pub async fn run_vectors(offload: &Offload) -> Report {
    let (vectors, skipped) = vectors();
    let pinned = offload.backends().into_iter().find(|b| b.pinned);
    let claims = pinned.as_ref().map_or(Vec::new(), |b| b.algorithms.clone());
    let counts = || pinned.as_ref().map(|b| Counts::of(offload, &b.name));
    let start = counts();
    let mut served: Vec<(Algorithm, usize, usize)> = Vec::new();
    let mut report = Report {
        skipped,
        ..Report::default()
    };
    for (i, v) in vectors.iter().enumerate() {
        let before = counts();
        // Alternate the buffer type so both go through every backend.
        let outcome = if i % 2 == 0 {
            run_one::<Vec<u8>>(offload, &v.case).await
        } else {
            run_one::<BytesMut>(offload, &v.case).await
        };
        let alg = v.case.algorithm();
        let claimed = claims.contains(&alg);
        let outcome = match outcome {
            Outcome::Unsupported if claimed => Outcome::Fail(format!(
                "the pinned backend claims {alg} but refused its session"
            )),
            other => other,
        };
        // Only vectors with data count towards "served": an engine may
        // answer an empty request without the device, and a backend whose
        // limits send every byte to the CPU would still "serve" the empty
        // ones.
        let counted = claimed && !v.case.refused_before_any_request() && v.case.has_data();
        if let (Outcome::Pass, true, Some(before), Some(after)) =
            (&outcome, counted, before, counts())
        {
            let on_it = after.bytes > before.bytes;
            match served.iter_mut().find(|(a, ..)| *a == alg) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += usize::from(on_it);
                }
                None => served.push((alg, 1, usize::from(on_it))),
            }
        }
        match outcome {
            Outcome::Pass => report.passed += 1,
            Outcome::Unsupported => report.unsupported += 1,
            Outcome::Fail(why) => report.failures.push(format!("{}: {why}", v.source)),
        }
    }
    let end = counts();
    if let (Some(b), Some(start), Some(end)) = (pinned, start, end) {
        report.pinned = Some(PinnedReport {
            name: b.name,
            requests: end.requests - start.requests,
            failures: end.failures - start.failures,
            replayed: end.replayed - start.replayed,
            served,
        });
    }
    report
}

/// The pinned backend's counters and the CPU's replays.
#[derive(Clone, Copy)]
struct Counts {
    requests: u64,
    bytes: u64,
    failures: u64,
    replayed: u64,
}

impl Counts {
    fn of(offload: &Offload, name: &str) -> Counts {
        let backends = offload.backends();
        let stats = |f: &dyn Fn(&crate::offload::BackendInfo) -> bool| {
            backends.iter().find(|b| f(b)).map(|b| b.stats)
        };
        let pinned = stats(&|b| b.name == name).unwrap_or_default();
        let cpu = stats(&|b| b.kind == BackendKind::Cpu).unwrap_or_default();
        Counts {
            requests: pinned.requests,
            bytes: pinned.bytes,
            failures: pinned.failures,
            replayed: cpu.replayed,
        }
    }
}

impl Case {
    /// The algorithm the case runs.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Case::Cipher { alg, .. } | Case::CbcBadPadding { alg, .. } => Algorithm::Cipher(*alg),
            Case::Aead { alg, .. } => Algorithm::Aead(*alg),
            Case::Crc { alg, .. } => Algorithm::Crc(*alg),
        }
    }

    /// Whether the case has any data (plaintext, ciphertext or CRC input).
    fn has_data(&self) -> bool {
        match self {
            Case::Cipher { pt, .. } => !pt.is_empty(),
            Case::CbcBadPadding { ct, .. } => !ct.is_empty(),
            Case::Aead { pt, ct, .. } => !pt.is_empty() || !ct.is_empty(),
            Case::Crc { input, .. } => !input.is_empty(),
        }
    }

    /// An XTS key with equal halves: the session refuses it before any
    /// backend sees a request.
    fn refused_before_any_request(&self) -> bool {
        matches!(self, Case::Cipher { alg, key, .. }
            if alg.mode() == CipherMode::Xts && key[..key.len() / 2] == key[key.len() / 2..])
    }
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
