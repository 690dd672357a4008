//! The `xts` target: `crypto_offload_native::Xts256` (AWS-LC's EVP
//! XTS-AES-256 behind a safe API, feature `aws-lc`) against `xts-mode`
//! ([`reference::xts_units`]) and the fallback's RustCrypto XTS, byte for
//! byte: runs of 0–8 data units of 16–600 bytes (ciphertext stealing when
//! not a whole number of blocks), 512 or 4096 bytes or up to 4096, with
//! first tweaks near 2^64 and 2^128 so that the per-unit tweak carries and
//! wraps. Encrypt, compare, decrypt back, and decrypt the reference's
//! ciphertext; keys with equal halves must be refused by both; unit lengths
//! below 16, above [`Xts256::MAX_UNIT`] or not dividing the data must be
//! `XtsError::UnitLength` with the data untouched. The native buffer sits
//! at any alignment between guard bytes that must stay as they are (the
//! assembly is not instrumented by AddressSanitizer). One input in 16 also
//! runs the key from two threads at once (the type hands each call a
//! pooled `EVP_CIPHER_CTX`).

use arbitrary::Arbitrary;
use crypto_offload_fallback::{Implementation, Xts};
use crypto_offload_native::{Xts256, XtsError};

use crate::{filler, first_difference, hex, mismatch, reference, seed};

/// The largest run of units a valid input makes (data bytes): keeps an
/// input well under a millisecond with AddressSanitizer and coverage.
pub const MAX_LEN: usize = 16 << 10;

/// The most data units in a run.
pub const MAX_UNITS: usize = 8;

/// One input.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Key1 ‖ Key2 (see `key_mode`).
    pub key: [u8; 64],
    /// `key_mode % 16`: 0 Key2 := Key1 (equal halves, must be refused);
    /// 1 Key2 := Key1 with one bit of its last byte flipped (valid);
    /// else the key as it is.
    pub key_mode: u8,
    /// How `unit` is read ([`Input::unit_len`]).
    pub unit_kind: u8,
    /// The data-unit length's raw value (`u16`, little-endian).
    pub unit: [u8; 2],
    /// `units % 9` data units (fewer if they would pass [`MAX_LEN`]) for
    /// valid unit kinds; ignored by the raw ones.
    pub units: u8,
    /// `tweak_kind % 4`: 0 the first tweak is `u128::MAX - tweak[0] % 16`
    /// (wraps within the run), 1 `u64::MAX - tweak[0] % 16` (carries into
    /// the high half), else `tweak` as it is.
    pub tweak_kind: u8,
    /// The first data unit's tweak (128-bit little-endian).
    pub tweak: [u8; 16],
    /// `threads % 16 == 0`: also run the key from two threads at once.
    pub threads: u8,
    /// The native XTS's buffer starts `align % 16` bytes further into its
    /// allocation (between guard bytes it must leave alone).
    pub align: u8,
    /// The plaintext (cut or extended with filler to the run's length for
    /// valid unit kinds; as it is, up to [`MAX_LEN`], for the raw ones).
    #[arbitrary(with = crate::seed::rest)]
    pub data: Vec<u8>,
}

/// `unit_kind` values that pick a given kind of unit length (any value in
/// the kind's range does): the seeds use these.
pub mod kind {
    /// `16 + unit % 585`: 16..=600, most not whole blocks.
    pub const SMALL: u8 = 0;
    /// 512 (a sector).
    pub const SECTOR: u8 = 0xa0;
    /// 4096 (a page).
    pub const PAGE: u8 = 0xc0;
    /// `16 + unit % 4081`: 16..=4096.
    pub const ANY: u8 = 0xd0;
    /// `unit % 16`: too short, must be refused (data as it is).
    pub const SHORT: u8 = 0xe0;
    /// `unit` as it is, data as it is: usually not dividing it.
    pub const RAW: u8 = 0xf0;
    /// One of [`super::SPECIAL`] by `unit % 8`, data as it is.
    pub const SPECIAL: u8 = 0xf8;
}

/// Unit lengths at and around the edges of what `Xts256` takes.
pub const SPECIAL: [usize; 8] = [
    0,
    15,
    16,
    17,
    Xts256::MAX_UNIT,
    Xts256::MAX_UNIT + 1,
    Xts256::MAX_UNIT + 16,
    usize::MAX,
];

impl Input {
    /// The key as used.
    pub fn key(&self) -> [u8; 64] {
        let mut key = self.key;
        match self.key_mode % 16 {
            0 => key.copy_within(..32, 32),
            1 => {
                key.copy_within(..32, 32);
                key[63] ^= 1 << (self.key[63] % 8);
            }
            _ => {}
        }
        key
    }

    /// The data-unit length, and whether the data is taken as it is
    /// (else it is made a run of whole units).
    pub fn unit_len(&self) -> (usize, bool) {
        let u = usize::from(u16::from_le_bytes(self.unit));
        match self.unit_kind {
            0..0xa0 => (16 + u % 585, false),
            0xa0..0xc0 => (512, false),
            0xc0..0xd0 => (4096, false),
            0xd0..0xe0 => (16 + u % 4081, false),
            0xe0..0xf0 => (u % 16, true),
            0xf0..0xf8 => (u, true),
            0xf8.. => (SPECIAL[u % 8], true),
        }
    }

    /// The first tweak.
    pub fn first_tweak(&self) -> [u8; 16] {
        let back = u128::from(self.tweak[0] % 16);
        match self.tweak_kind % 4 {
            0 => (u128::MAX - back).to_le_bytes(),
            1 => (u128::from(u64::MAX) - back).to_le_bytes(),
            _ => self.tweak,
        }
    }

    /// The plaintext.
    pub fn plaintext(&self) -> Vec<u8> {
        let (unit_len, raw) = self.unit_len();
        if raw {
            return self.data[..self.data.len().min(MAX_LEN)].to_vec();
        }
        let units = (usize::from(self.units) % (MAX_UNITS + 1)).min(MAX_LEN / unit_len);
        let len = unit_len * units;
        let mut data = self.data.clone();
        if data.len() < len {
            let more = filler(
                len - data.len(),
                data.len() as u64 ^ (unit_len as u64) << 32,
            );
            data.extend_from_slice(&more);
        }
        data.truncate(len);
        data
    }

    /// Whether the two threads run.
    pub fn threads(&self) -> bool {
        self.threads.is_multiple_of(16)
    }
}

/// The concrete case, for messages.
struct Case {
    halves_equal: bool,
    unit_len: usize,
    len: usize,
    tweak: [u8; 16],
}

impl Case {
    #[track_caller]
    fn fail(&self, backend: &str, dir: &str, what: std::fmt::Arguments<'_>) -> ! {
        let units = match (
            self.len.checked_div(self.unit_len),
            self.len % self.unit_len.max(1),
        ) {
            (None, _) => "-".to_owned(),
            (Some(q), 0) => q.to_string(),
            (Some(q), r) => format!("{q} and {r} bytes"),
        };
        let halves = if self.halves_equal {
            "equal"
        } else {
            "distinct"
        };
        mismatch(
            backend,
            "aes-256-xts",
            dir,
            self.len,
            format_args!(
                "{what} (key halves {halves}, unit_len {}, units {units}, first tweak {})",
                self.unit_len,
                hex(&self.tweak),
            ),
        )
    }
}

/// The subject and the second reference, as mismatch messages name them.
const NATIVE: &str = "native/aws-lc";
const FALLBACK: &str = "fallback/rustcrypto";

/// Guard bytes on each side of the native XTS's buffer: AWS-LC's assembly
/// is not instrumented, so a write past the data would go unseen.
const GUARD: usize = 32;
const GUARD_BYTE: u8 = 0xa5;

/// The fallback's pure-RustCrypto XTS for `key`.
fn fallback(key: &[u8; 64]) -> Result<Xts, crypto_offload_fallback::Error> {
    Xts::with_implementation(key, Implementation::RustCrypto)
}

/// Checks one input.
pub fn check(input: &Input) {
    let key = input.key();
    let (unit_len, _) = input.unit_len();
    let tweak = input.first_tweak();
    let pt = input.plaintext();
    let case = Case {
        halves_equal: key[..32] == key[32..],
        unit_len,
        len: pt.len(),
        tweak,
    };

    let native = match (Xts256::new(&key), case.halves_equal) {
        (Err(XtsError::EqualHalves), true) => None,
        (Ok(_), true) => case.fail(NATIVE, "new", format_args!("equal halves accepted")),
        (Err(e), _) => case.fail(NATIVE, "new", format_args!("{e:?}")),
        (Ok(x), false) => Some(x),
    };
    let fallback = match (fallback(&key), case.halves_equal) {
        (Err(crypto_offload_fallback::Error::XtsWeakKey), true) => None,
        (Ok(_), true) => case.fail(FALLBACK, "new", format_args!("equal halves accepted")),
        (Err(e), _) => case.fail(FALLBACK, "new", format_args!("{e:?}")),
        (Ok(x), false) => Some(x),
    };
    let (Some(native), Some(fallback)) = (native, fallback) else {
        return;
    };

    if !(16..=Xts256::MAX_UNIT).contains(&unit_len) || !pt.len().is_multiple_of(unit_len) {
        let want = Err(XtsError::UnitLength {
            unit_len,
            len: pt.len(),
        });
        for (dir, encrypt) in [("encrypt", true), ("decrypt", false)] {
            let mut data = pt.clone();
            let got = if encrypt {
                native.encrypt_units(&tweak, unit_len, &mut data)
            } else {
                native.decrypt_units(&tweak, unit_len, &mut data)
            };
            if got != want {
                case.fail(NATIVE, dir, format_args!("{got:?}, want {want:?}"));
            }
            if data != pt {
                case.fail(
                    NATIVE,
                    dir,
                    format_args!("refused data changed: {}", first_difference(&data, &pt)),
                );
            }
        }
        return;
    }

    // The reference: xts-mode, one data unit at a time.
    let mut want = pt.clone();
    reference::xts_units(&key, &tweak, unit_len, &mut want, true);

    // One request on `who`; any error is a mismatch.
    let run = |who: &str, encrypt: bool, data: &mut Vec<u8>| {
        let dir = if encrypt { "encrypt" } else { "decrypt" };
        let r = match (who == NATIVE, encrypt) {
            (true, _) => {
                let start = GUARD + usize::from(input.align % 16);
                let end = start + data.len();
                let mut buf = vec![GUARD_BYTE; end + GUARD];
                buf[start..end].copy_from_slice(data);
                let r = if encrypt {
                    native.encrypt_units(&tweak, unit_len, &mut buf[start..end])
                } else {
                    native.decrypt_units(&tweak, unit_len, &mut buf[start..end])
                };
                if let Some(i) = (0..start)
                    .chain(end..buf.len())
                    .find(|&i| buf[i] != GUARD_BYTE)
                {
                    let at = i as isize - start as isize;
                    case.fail(
                        who,
                        dir,
                        format_args!("wrote outside the data, at offset {at}: {:02x}", buf[i]),
                    );
                }
                data.copy_from_slice(&buf[start..end]);
                r.map_err(|e| format!("{e:?}"))
            }
            (false, true) => fallback
                .encrypt_units(&tweak, unit_len, data)
                .map_err(|e| format!("{e:?}")),
            (false, false) => fallback
                .decrypt_units(&tweak, unit_len, data)
                .map_err(|e| format!("{e:?}")),
        };
        if let Err(e) = r {
            case.fail(who, dir, format_args!("{e}"));
        }
    };
    let encrypt = |who: &str, data: &mut Vec<u8>| run(who, true, data);
    let decrypt = |who: &str, data: &mut Vec<u8>| run(who, false, data);
    let expect = |who: &str, dir: &str, what: &str, got: &[u8], want: &[u8]| {
        if got != want {
            case.fail(
                who,
                dir,
                format_args!("{what}: {}", first_difference(got, want)),
            );
        }
    };

    for who in [NATIVE, FALLBACK] {
        // Encrypt, compare, decrypt back.
        let mut data = pt.clone();
        encrypt(who, &mut data);
        expect(who, "encrypt", "ciphertext", &data, &want);
        decrypt(who, &mut data);
        expect(who, "decrypt", "round trip", &data, &pt);
        // The reference's ciphertext.
        let mut data = want.clone();
        decrypt(who, &mut data);
        expect(who, "decrypt", "the reference's ciphertext", &data, &pt);
    }

    if input.threads() && !pt.is_empty() {
        // Two callers at once on one key, each several requests long, so
        // that they overlap on the pooled contexts of both directions.
        std::thread::scope(|s| {
            let one = s.spawn(|| {
                for _ in 0..3 {
                    let mut data = pt.clone();
                    encrypt(NATIVE, &mut data);
                    expect(NATIVE, "encrypt", "thread 1", &data, &want);
                    decrypt(NATIVE, &mut data);
                    expect(NATIVE, "decrypt", "thread 1 round trip", &data, &pt);
                }
            });
            let two = s.spawn(|| {
                for _ in 0..3 {
                    let mut data = want.clone();
                    decrypt(NATIVE, &mut data);
                    expect(NATIVE, "decrypt", "thread 2", &data, &pt);
                    encrypt(NATIVE, &mut data);
                    expect(NATIVE, "encrypt", "thread 2 round trip", &data, &want);
                }
            });
            // Joined here rather than at the scope's end: `join` waits for
            // each thread to exit, its thread-locals (its `Thread` handle)
            // freed, which the scope does not, and LeakSanitizer checks
            // right after the input.
            for thread in [one, two] {
                if let Err(panic) = thread.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
    }
}

/// Seeds from the `aes-256-xts` records (one data unit of 16 to 4096 bytes
/// each: IEEE 1619's vectors 10–14 and the edge cases): the record as it
/// is, then its plaintext as three 517-byte units (stolen
/// ciphertext) with a tweak that wraps, from two threads; as units of
/// 48 bytes starting below 2^64; its key with equal halves; and a unit
/// length that does not divide it.
pub fn seeds(records: &[crate::vectors::Record]) -> Vec<(String, Input)> {
    let mut out = Vec::new();
    for (n, r) in records.iter().enumerate() {
        if r.alg() != "aes-256-xts" {
            continue;
        }
        let pt = r.hex("pt");
        let unit = u16::try_from(pt.len())
            .ok()
            .filter(|u| (16..=4096).contains(u));
        let unit = unit.unwrap_or_else(|| panic!("{}: an XTS unit of {} bytes", r.file, pt.len()));
        let vector = Input {
            key: r.hex("key").try_into().expect("a 64-byte key"),
            key_mode: 2,
            unit_kind: kind::ANY,
            unit: (unit - 16).to_le_bytes(),
            units: 1,
            tweak_kind: 2,
            tweak: r.hex("iv").try_into().expect("a 16-byte iv"),
            threads: 1,
            align: 0,
            data: pt,
        };
        let stolen = Input {
            unit_kind: kind::SMALL,
            unit: (517u16 - 16).to_le_bytes(),
            units: 3,
            tweak_kind: 0,
            tweak: [1; 16],
            threads: 0,
            align: 5,
            ..vector.clone()
        };
        let carry = Input {
            unit_kind: kind::SMALL,
            unit: (48u16 - 16).to_le_bytes(),
            units: 8,
            tweak_kind: 1,
            tweak: [3; 16],
            ..vector.clone()
        };
        let equal = Input {
            key_mode: 0,
            ..vector.clone()
        };
        let no_divide = Input {
            unit_kind: kind::RAW,
            unit: 500u16.to_le_bytes(),
            ..vector.clone()
        };
        for (what, input) in [
            ("vector", vector),
            ("stolen", stolen),
            ("carry", carry),
            ("equal-halves", equal),
            ("no-divide", no_divide),
        ] {
            out.push((format!("aes-256-xts-{n}-{what}"), input));
        }
    }
    out
}

/// `input` in the layout the target decodes.
pub fn encode(input: &Input) -> Vec<u8> {
    let mut w = seed::Writer::default();
    w.bytes(&input.key)
        .u8(input.key_mode)
        .u8(input.unit_kind)
        .bytes(&input.unit)
        .u8(input.units)
        .u8(input.tweak_kind)
        .bytes(&input.tweak)
        .u8(input.threads)
        .u8(input.align)
        .bytes(&input.data);
    w.0
}
