//! The `cipher` target: every cipher algorithm (CBC, CTR, XTS × 128/192/256)
//! in both directions, on every subject, against the RustCrypto mode
//! crates; XTS also over many data units; wrong key, IV, data and data-unit
//! lengths, and XTS keys with equal halves, must be the documented typed
//! errors with the buffer handed back untouched.

use arbitrary::Arbitrary;
use bytes::BytesMut;
use crypto_offload::{CipherAlg, CipherMode, CipherSession, Error};

use crate::{Harness, Subject, first_difference, mismatch, reference, scaled, seed};

/// One input.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// `CipherAlg::ALL[alg % 9]`.
    pub alg: u8,
    /// Below 0xf0 the algorithm's key length; else `key_len - 0xf0` bytes
    /// (0–15: always wrong).
    pub key_len: u8,
    /// The key's bytes (the first `key_len`).
    pub key: [u8; 64],
    /// Below 0xf0 a 16-byte IV; else `iv_len - 0xf0` bytes (wrong unless 16).
    pub iv_len: u8,
    /// The IV / counter block / first tweak.
    pub iv: [u8; 16],
    /// XTS: the data-unit length (`u16`, little-endian), 0 for one unit per
    /// request. On CBC/CTR, 0xffff asks `with_data_unit`, which must refuse.
    pub unit: [u8; 2],
    /// The data is ciphertext to decrypt (else plaintext to encrypt).
    pub decrypt: bool,
    /// Keep the data's length even if the mode cannot take it (else it is
    /// trimmed or padded to one it takes).
    pub exact: bool,
    /// Pass a `BytesMut` (else a `Vec<u8>`).
    pub bytes_mut: bool,
    /// See [`crate::scaled`].
    pub scale: u8,
    /// The plaintext or ciphertext.
    #[arbitrary(with = crate::seed::rest)]
    pub data: Vec<u8>,
}

/// What a request should come to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Ok(Vec<u8>),
    KeyLength,
    WeakKey,
    DataUnit,
    IvLength,
    DataLength,
}

fn dir_name(encrypt: bool) -> &'static str {
    if encrypt { "encrypt" } else { "decrypt" }
}

/// The input made concrete: algorithm, key, IV, unit, data.
struct Case<'a> {
    alg: CipherAlg,
    key: &'a [u8],
    iv: &'a [u8],
    /// `Some` when `with_data_unit` is called.
    unit: Option<usize>,
    encrypt: bool,
    data: Vec<u8>,
    bytes_mut: bool,
}

impl<'a> Case<'a> {
    fn new(input: &'a Input) -> Self {
        let alg = CipherAlg::ALL[usize::from(input.alg) % CipherAlg::ALL.len()];
        let key_len = match input.key_len {
            n @ 0xf0.. => usize::from(n - 0xf0),
            _ => alg.key_len(),
        };
        let iv_len = match input.iv_len {
            n @ 0xf0.. => usize::from(n - 0xf0),
            _ => 16,
        };
        let unit = match (alg.mode(), u16::from_le_bytes(input.unit)) {
            (_, 0) => None,
            (CipherMode::Xts, u) => Some(usize::from(u)),
            (_, 0xffff) => Some(0xffff),
            _ => None,
        };
        let mut data = scaled(&input.data, input.scale);
        if !input.exact {
            match alg.mode() {
                CipherMode::Cbc => data.truncate(data.len() / 16 * 16),
                CipherMode::Xts => {
                    let u = unit.filter(|&u| u >= 16).unwrap_or(16);
                    let len = if unit.is_some() {
                        (data.len() / u).max(1) * u
                    } else {
                        data.len().max(16)
                    };
                    data.resize(len, 0);
                }
                _ => {}
            }
        }
        Case {
            alg,
            key: &input.key[..key_len],
            iv: &input.iv[..iv_len],
            unit,
            encrypt: !input.decrypt,
            data,
            bytes_mut: input.bytes_mut,
        }
    }

    /// What the first request (in the input's direction) must give.
    fn expect(&self) -> Expect {
        let (alg, len) = (self.alg, self.data.len());
        if self.key.len() != alg.key_len() {
            return Expect::KeyLength;
        }
        if alg.mode() == CipherMode::Xts {
            let (k1, k2) = self.key.split_at(self.key.len() / 2);
            if k1 == k2 {
                return Expect::WeakKey;
            }
        }
        if let Some(u) = self.unit
            && (alg.mode() != CipherMode::Xts || u < 16)
        {
            return Expect::DataUnit;
        }
        let Ok(iv) = <[u8; 16]>::try_from(self.iv) else {
            return Expect::IvLength;
        };
        let valid = match alg.mode() {
            CipherMode::Cbc => len.is_multiple_of(16),
            CipherMode::Xts => len >= 16 && self.unit.is_none_or(|u| len.is_multiple_of(u)),
            _ => true,
        };
        if !valid {
            return Expect::DataLength;
        }
        let mut want = self.data.clone();
        let unit = self.unit.unwrap_or(len);
        reference::cipher(alg, self.key, &iv, unit, &mut want, self.encrypt);
        Expect::Ok(want)
    }
}

/// Runs one request on `session`, in a `Vec` or a `BytesMut`.
pub async fn request(
    session: &CipherSession,
    encrypt: bool,
    iv: &[u8],
    data: Vec<u8>,
    bytes_mut: bool,
) -> Result<Vec<u8>, (Error, Vec<u8>)> {
    if bytes_mut {
        let buf = BytesMut::from(&data[..]);
        let r = if encrypt {
            session.encrypt(iv, buf).await
        } else {
            session.decrypt(iv, buf).await
        };
        r.map(|b| b.to_vec()).map_err(|e| {
            let (e, b) = e.into_parts();
            (e, b.to_vec())
        })
    } else {
        let r = if encrypt {
            session.encrypt(iv, data).await
        } else {
            session.decrypt(iv, data).await
        };
        r.map_err(|e| e.into_parts())
    }
}

/// Checks one input on every subject of `h`.
pub fn check(h: &Harness, input: &Input) {
    let case = Case::new(input);
    let expect = case.expect();
    for s in h
        .subjects
        .iter()
        .filter(|s| s.runs(case.alg, case.data.len()))
    {
        h.block_on(check_subject(s, &case, &expect));
    }
}

async fn check_subject(s: &Subject, case: &Case<'_>, expect: &Expect) {
    let (alg, len) = (case.alg, case.data.len());
    let dir = dir_name(case.encrypt);
    let fail = |what: std::fmt::Arguments<'_>| -> ! {
        mismatch(
            &s.name,
            alg.name(),
            dir,
            len,
            format_args!("{what} (unit {:?})", case.unit),
        )
    };
    let session = match (s.offload().cipher(alg, case.key).await, expect) {
        (Err(Error::KeyLength { .. }), Expect::KeyLength)
        | (Err(Error::WeakKey { .. }), Expect::WeakKey) => return,
        (Err(e), _) => fail(format_args!("opening the session: {e}, want {expect:?}")),
        (Ok(_), Expect::KeyLength | Expect::WeakKey) => {
            fail(format_args!("a session opened, want {expect:?}"))
        }
        (Ok(session), _) => session,
    };
    let session = match case.unit {
        None => session,
        Some(u) => match (session.with_data_unit(u), expect) {
            (Err(Error::DataLength { .. }), Expect::DataUnit) => return,
            (Err(e), _) => fail(format_args!("with_data_unit({u}): {e}")),
            (Ok(_), Expect::DataUnit) => fail(format_args!("with_data_unit({u}) accepted")),
            (Ok(session), _) => session,
        },
    };
    let got = request(
        &session,
        case.encrypt,
        case.iv,
        case.data.clone(),
        case.bytes_mut,
    )
    .await;
    let want = match (got, expect) {
        (Err((Error::IvLength { len: l, .. }, buf)), Expect::IvLength)
        | (Err((Error::DataLength { len: l, .. }, buf)), Expect::DataLength) => {
            if buf != case.data {
                fail(format_args!("the refused buffer came back changed"));
            }
            let named = match expect {
                Expect::IvLength => case.iv.len(),
                _ => len,
            };
            if l != named {
                fail(format_args!("the error names length {l}, not {named}"));
            }
            return;
        }
        (Err((e, _)), _) => fail(format_args!("{e}, want {expect:?}")),
        (Ok(got), Expect::Ok(want)) => {
            if got != *want {
                fail(format_args!("{}", first_difference(&got, want)));
            }
            got
        }
        (Ok(_), _) => fail(format_args!("succeeded, want {expect:?}")),
    };
    // And back: the other direction must restore the input exactly.
    match request(&session, !case.encrypt, case.iv, want, case.bytes_mut).await {
        Ok(back) if back == case.data => {}
        Ok(back) => mismatch(
            &s.name,
            alg.name(),
            dir_name(!case.encrypt),
            len,
            format_args!("round trip: {}", first_difference(&back, &case.data)),
        ),
        Err((e, _)) => mismatch(
            &s.name,
            alg.name(),
            dir_name(!case.encrypt),
            len,
            format_args!("round trip: {e}"),
        ),
    }
}

/// Seeds from the cipher vector records: each record once per direction.
pub fn seeds(records: &[crate::vectors::Record]) -> Vec<(String, Input)> {
    let mut out = Vec::new();
    for (n, r) in records.iter().enumerate() {
        let Some(alg) = CipherAlg::from_name(r.alg()) else {
            continue;
        };
        let index = CipherAlg::ALL.iter().position(|&a| a == alg).unwrap_or(0);
        let key = r.hex("key");
        for decrypt in [false, true] {
            let data = r.hex(if decrypt { "ct" } else { "pt" });
            out.push((
                format!("{}-{n}-{}", alg.name(), dir_name(!decrypt)),
                Input {
                    alg: index as u8,
                    key_len: 0,
                    key: seed::key64(&key),
                    iv_len: 0,
                    iv: r.hex("iv").try_into().expect("16-byte iv"),
                    unit: [0, 0],
                    decrypt,
                    exact: true,
                    bytes_mut: false,
                    scale: 0,
                    data,
                },
            ));
        }
    }
    out
}

/// `input` in the layout the target decodes.
pub fn encode(input: &Input) -> Vec<u8> {
    let mut w = seed::Writer::default();
    w.u8(input.alg)
        .u8(input.key_len)
        .bytes(&input.key)
        .u8(input.iv_len)
        .bytes(&input.iv)
        .bytes(&input.unit)
        .bool(input.decrypt)
        .bool(input.exact)
        .bool(input.bytes_mut)
        .u8(input.scale)
        .bytes(&input.data);
    w.0
}
