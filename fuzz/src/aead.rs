//! The `aead` target: AES-GCM (128/192/256) seal and open, attached and
//! detached tags, any AAD, on every subject, against RustCrypto's `aes-gcm`;
//! then the same message tampered with — a tag, ciphertext, AAD or nonce
//! bit flipped, the message truncated, or the fuzzer's raw bytes opened as
//! ciphertext ‖ tag — whose open must fail exactly when the reference's
//! does: `Error::Authentication` with the buffer handed back all zeros, or
//! `Error::TagLength` for a message shorter than a tag.

use arbitrary::Arbitrary;
use bytes::BytesMut;
use crypto_offload::{AeadAlg, AeadSession, Error};

use crate::{Harness, Subject, first_difference, hex, mismatch, reference, scaled, seed};

/// One input.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// `AeadAlg::ALL[alg % 3]`.
    pub alg: u8,
    /// Below 0xf0 the algorithm's key length, else `key_len - 0xf0` bytes.
    pub key_len: u8,
    /// The key's bytes.
    pub key: [u8; 32],
    /// Below 0xf0 a 12-byte nonce, else `nonce_len - 0xf0` bytes.
    pub nonce_len: u8,
    /// The nonce (the first 12 bytes, or `nonce_len`).
    pub nonce: [u8; 16],
    /// The first `min(aad_len, data.len())` bytes of `data` are the AAD
    /// (`u16`, little-endian).
    pub aad_len: [u8; 2],
    /// What is done to the sealed message before it is opened (see
    /// [`Tamper`]): `tamper % 7`.
    pub tamper: u8,
    /// Where the tampering applies (`u16`, little-endian).
    pub at: [u8; 2],
    /// Use `seal_detached` / `open_detached`.
    pub detached: bool,
    /// Pass a `BytesMut` (else a `Vec<u8>`).
    pub bytes_mut: bool,
    /// See [`crate::scaled`] (applies to the plaintext).
    pub scale: u8,
    /// AAD ‖ plaintext (or, tampering with `Raw`, AAD ‖ ciphertext ‖ tag).
    #[arbitrary(with = crate::seed::rest)]
    pub data: Vec<u8>,
}

/// What happens to the sealed message before it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tamper {
    /// Nothing: it must open to the plaintext.
    None,
    /// One tag bit flipped.
    Tag,
    /// One ciphertext bit flipped (a tag bit if there is no ciphertext).
    Ciphertext,
    /// One AAD bit flipped (a byte added if there is no AAD).
    Aad,
    /// Bytes cut off its end.
    Truncate,
    /// Not sealed at all: the fuzzer's bytes opened as ciphertext ‖ tag.
    Raw,
    /// Opened with one nonce bit flipped.
    Nonce,
}

impl Tamper {
    /// Every variant, in the order `tamper % 7` picks them.
    pub const ALL: [Tamper; 7] = [
        Tamper::None,
        Tamper::Tag,
        Tamper::Ciphertext,
        Tamper::Aad,
        Tamper::Truncate,
        Tamper::Raw,
        Tamper::Nonce,
    ];
}

/// Runs a seal on `session`: ciphertext ‖ tag.
async fn seal(
    session: &AeadSession,
    nonce: &[u8],
    aad: &[u8],
    pt: &[u8],
    detached: bool,
    bytes_mut: bool,
) -> Result<Vec<u8>, (Error, Vec<u8>)> {
    macro_rules! go {
        ($buf:expr, $to_vec:expr) => {{
            if detached {
                session
                    .seal_detached(nonce, aad, $buf)
                    .await
                    .map(|(b, tag)| {
                        let mut v: Vec<u8> = $to_vec(b);
                        v.extend_from_slice(&tag);
                        v
                    })
                    .map_err(|e| {
                        let (e, b) = e.into_parts();
                        (e, $to_vec(b))
                    })
            } else {
                session
                    .seal(nonce, aad, $buf)
                    .await
                    .map($to_vec)
                    .map_err(|e| {
                        let (e, b) = e.into_parts();
                        (e, $to_vec(b))
                    })
            }
        }};
    }
    if bytes_mut {
        go!(BytesMut::from(pt), |b: BytesMut| b.to_vec())
    } else {
        go!(pt.to_vec(), |b: Vec<u8>| b)
    }
}

/// Runs an open on `session` of `sealed` = ciphertext ‖ tag (detached: the
/// last 16 bytes as the tag, or all of a shorter message as a short tag).
async fn open(
    session: &AeadSession,
    nonce: &[u8],
    aad: &[u8],
    sealed: &[u8],
    detached: bool,
    bytes_mut: bool,
) -> Result<Vec<u8>, (Error, Vec<u8>)> {
    let (body, tag) = if detached {
        sealed.split_at(sealed.len().saturating_sub(16))
    } else {
        (sealed, &[][..])
    };
    macro_rules! go {
        ($buf:expr, $to_vec:expr) => {{
            let r = if detached {
                session.open_detached(nonce, aad, $buf, tag).await
            } else {
                session.open(nonce, aad, $buf).await
            };
            r.map($to_vec).map_err(|e| {
                let (e, b) = e.into_parts();
                (e, $to_vec(b))
            })
        }};
    }
    if bytes_mut {
        go!(BytesMut::from(body), |b: BytesMut| b.to_vec())
    } else {
        go!(body.to_vec(), |b: Vec<u8>| b)
    }
}

/// The input made concrete.
struct Case<'a> {
    alg: AeadAlg,
    key: &'a [u8],
    nonce: &'a [u8],
    aad: &'a [u8],
    pt: Vec<u8>,
    tamper: Tamper,
    at: usize,
    detached: bool,
    bytes_mut: bool,
}

/// Flips bit `at % 8` of byte `at / 8 % len` (nothing in an empty slice).
fn flip(bytes: &mut [u8], at: usize) {
    if !bytes.is_empty() {
        let i = at / 8 % bytes.len();
        bytes[i] ^= 1 << (at % 8);
    }
}

impl<'a> Case<'a> {
    fn new(input: &'a Input) -> Self {
        let alg = AeadAlg::ALL[usize::from(input.alg) % AeadAlg::ALL.len()];
        let key_len = match input.key_len {
            n @ 0xf0.. => usize::from(n - 0xf0),
            _ => alg.key_len(),
        };
        let nonce_len = match input.nonce_len {
            n @ 0xf0.. => usize::from(n - 0xf0),
            _ => 12,
        };
        let aad_len = usize::from(u16::from_le_bytes(input.aad_len)).min(input.data.len());
        let (aad, rest) = input.data.split_at(aad_len);
        let tamper = Tamper::ALL[usize::from(input.tamper) % Tamper::ALL.len()];
        Case {
            alg,
            key: &input.key[..key_len],
            nonce: &input.nonce[..nonce_len],
            aad,
            pt: if tamper == Tamper::Raw {
                rest.to_vec()
            } else {
                scaled(rest, input.scale)
            },
            tamper,
            at: usize::from(u16::from_le_bytes(input.at)),
            detached: input.detached,
            bytes_mut: input.bytes_mut,
        }
    }

    /// The message to open, with the nonce and AAD to open it with.
    fn tampered(&self, sealed: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let (mut msg, mut nonce, mut aad) =
            (sealed.to_vec(), self.nonce.to_vec(), self.aad.to_vec());
        let ct_len = msg.len().saturating_sub(16);
        match self.tamper {
            Tamper::None | Tamper::Raw => {}
            Tamper::Tag => flip(&mut msg[ct_len..], self.at),
            Tamper::Ciphertext if ct_len > 0 => flip(&mut msg[..ct_len], self.at),
            Tamper::Ciphertext => flip(&mut msg, self.at),
            Tamper::Aad if aad.is_empty() => aad.push(self.at as u8),
            Tamper::Aad => flip(&mut aad, self.at),
            Tamper::Truncate => {
                msg.truncate(msg.len() - (1 + self.at % msg.len().max(1)).min(msg.len()))
            }
            Tamper::Nonce if nonce.is_empty() => nonce.push(0),
            Tamper::Nonce => flip(&mut nonce, self.at),
        }
        (msg, nonce, aad)
    }
}

/// Checks one input on every subject of `h`.
pub fn check(h: &Harness, input: &Input) {
    let case = Case::new(input);
    // The reference's answers, once for all subjects.
    let key_ok = case.key.len() == case.alg.key_len();
    let nonce: Option<[u8; 12]> = case.nonce.try_into().ok();
    let sealed = match (key_ok, nonce) {
        (true, Some(n)) if case.tamper != Tamper::Raw => {
            let mut ct = case.pt.clone();
            let tag = reference::gcm_seal(case.key, &n, case.aad, &mut ct);
            ct.extend_from_slice(&tag);
            Some(ct)
        }
        _ => None,
    };
    let message = match (&sealed, case.tamper) {
        (Some(s), _) => Some(case.tampered(s)),
        (None, Tamper::Raw) => Some(case.tampered(&case.pt)),
        _ => None,
    };
    let opened = match (&message, key_ok) {
        (Some((msg, n, aad)), true) => match <[u8; 12]>::try_from(&n[..]) {
            Ok(n) => reference::gcm_open(case.key, &n, aad, msg),
            Err(_) => None,
        },
        _ => None,
    };
    for s in h
        .subjects
        .iter()
        .filter(|s| s.runs(case.alg, case.pt.len()))
    {
        h.block_on(check_subject(
            s,
            &case,
            sealed.as_deref(),
            message.as_ref(),
            opened.as_deref(),
        ));
    }
}

async fn check_subject(
    s: &Subject,
    case: &Case<'_>,
    sealed: Option<&[u8]>,
    message: Option<&(Vec<u8>, Vec<u8>, Vec<u8>)>,
    opened: Option<&[u8]>,
) {
    let alg = case.alg.name();
    let len = case.pt.len();
    let what = |w: std::fmt::Arguments<'_>| {
        format!(
            "{w} (aad {} B, tamper {:?}, detached {})",
            case.aad.len(),
            case.tamper,
            case.detached
        )
    };
    let session = match s.offload().aead(case.alg, case.key).await {
        Ok(_) if case.key.len() != case.alg.key_len() => mismatch(
            &s.name,
            alg,
            "seal",
            len,
            format_args!(
                "{}",
                what(format_args!(
                    "a {}-byte key opened a session",
                    case.key.len()
                ))
            ),
        ),
        Ok(session) => session,
        Err(Error::KeyLength { .. }) if case.key.len() != case.alg.key_len() => return,
        Err(e) => mismatch(
            &s.name,
            alg,
            "seal",
            len,
            format_args!("{}", what(format_args!("opening the session: {e}"))),
        ),
    };
    if case.tamper != Tamper::Raw {
        let got = seal(
            &session,
            case.nonce,
            case.aad,
            &case.pt,
            case.detached,
            case.bytes_mut,
        )
        .await;
        match (got, sealed) {
            (Ok(got), Some(want)) if got == want => {}
            (Ok(got), Some(want)) => mismatch(
                &s.name,
                alg,
                "seal",
                len,
                format_args!("{}", what(format_args!("{}", first_difference(&got, want)))),
            ),
            (Err((Error::IvLength { .. }, buf)), None) if buf == case.pt => return,
            (Err((e, _)), _) => mismatch(
                &s.name,
                alg,
                "seal",
                len,
                format_args!("{}", what(format_args!("{e}"))),
            ),
            (Ok(_), None) => mismatch(
                &s.name,
                alg,
                "seal",
                len,
                format_args!(
                    "{}",
                    what(format_args!(
                        "sealed with a {}-byte nonce",
                        case.nonce.len()
                    ))
                ),
            ),
        }
    }
    let Some((msg, nonce, aad)) = message else {
        return;
    };
    let got = open(&session, nonce, aad, msg, case.detached, case.bytes_mut).await;
    let len = msg.len();
    // What `open` was handed as the buffer (detached: without the tag).
    let body = if case.detached {
        &msg[..len.saturating_sub(16)]
    } else {
        &msg[..]
    };
    let fail = |w: std::fmt::Arguments<'_>| -> ! {
        mismatch(&s.name, alg, "open", len, format_args!("{}", what(w)))
    };
    match (got, opened) {
        (Ok(got), Some(want)) if got == want => {}
        (Ok(got), Some(want)) => fail(format_args!("{}", first_difference(&got, want))),
        (Ok(got), None) => fail(format_args!(
            "opened what the reference refuses, to {}",
            hex(&got[..got.len().min(32)])
        )),
        (Err((e, _)), Some(_)) => fail(format_args!("{e}, but the reference opens it")),
        (Err((Error::IvLength { .. }, buf)), None) if nonce.len() != 12 => {
            if buf != body {
                fail(format_args!("the refused buffer came back changed"));
            }
        }
        (Err((Error::TagLength { .. }, buf)), None) if msg.len() < 16 => {
            if buf != body {
                fail(format_args!("the refused buffer came back changed"));
            }
        }
        (Err((Error::Authentication, buf)), None) if msg.len() >= 16 && nonce.len() == 12 => {
            if buf.iter().any(|&b| b != 0) {
                fail(format_args!(
                    "a failed open released bytes: {}",
                    hex(&buf[..buf.len().min(32)])
                ));
            }
        }
        (Err((e, _)), None) => fail(format_args!("{e}: not the error expected")),
    }
}

/// Seeds from the GCM vector records: valid records sealed and opened,
/// invalid ones (and the valid ones' ciphertexts) opened raw.
pub fn seeds(records: &[crate::vectors::Record]) -> Vec<(String, Input)> {
    let mut out = Vec::new();
    for (n, r) in records.iter().enumerate() {
        let Some(alg) = AeadAlg::from_name(r.alg()) else {
            continue;
        };
        let index = AeadAlg::ALL.iter().position(|&a| a == alg).unwrap_or(0) as u8;
        let mut key = [0u8; 32];
        let k = r.hex("key");
        key[..k.len()].copy_from_slice(&k);
        let aad = r.hex("aad");
        let valid = r.text("result") != Some("invalid");
        let base = Input {
            alg: index,
            key_len: 0,
            key,
            nonce_len: 0,
            nonce: {
                let mut n = [0u8; 16];
                n[..12].copy_from_slice(&r.hex("iv"));
                n
            },
            aad_len: (aad.len() as u16).to_le_bytes(),
            tamper: 0,
            at: [0, 0],
            detached: false,
            bytes_mut: false,
            scale: 0,
            data: Vec::new(),
        };
        if valid {
            for (t, tamper) in Tamper::ALL.iter().enumerate() {
                if *tamper == Tamper::Raw {
                    continue;
                }
                out.push((
                    format!("{}-{n}-{tamper:?}", alg.name()).to_lowercase(),
                    Input {
                        tamper: t as u8,
                        detached: t % 2 == 1,
                        data: [aad.clone(), r.hex("pt")].concat(),
                        ..base.clone()
                    },
                ));
            }
        }
        let raw = Tamper::ALL
            .iter()
            .position(|&t| t == Tamper::Raw)
            .unwrap_or(0) as u8;
        out.push((
            format!("{}-{n}-raw", alg.name()),
            Input {
                tamper: raw,
                data: [aad.clone(), r.hex("ct"), r.hex("tag")].concat(),
                ..base.clone()
            },
        ));
    }
    out
}

/// `input` in the layout the target decodes.
pub fn encode(input: &Input) -> Vec<u8> {
    let mut w = seed::Writer::default();
    w.u8(input.alg)
        .u8(input.key_len)
        .bytes(&input.key)
        .u8(input.nonce_len)
        .bytes(&input.nonce)
        .bytes(&input.aad_len)
        .u8(input.tamper)
        .bytes(&input.at)
        .bool(input.detached)
        .bool(input.bytes_mut)
        .u8(input.scale)
        .bytes(&input.data);
    w.0
}
