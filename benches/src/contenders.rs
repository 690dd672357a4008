//! Every benchmarked call, once: the fallback (as `Xxx::new` chooses, and
//! forced onto each implementation) and its peers, per algorithm.
//!
//! Two runners time them: the criterion bench (`benches/fallback.rs`, one
//! benchmark after another, with criterion's statistics) and the `paired`
//! binary (all contenders of a size in interleaved rounds, for ratios that
//! hold on a shared machine). Both read this list, so they time the very
//! same calls.
//!
//! Names: `fallback` is what `Xxx::new` picks; `fallback-<implementation>`
//! forces one implementation; every other name is a peer, except
//! `aes-crate-ecb` ([`crate::report::NOT_PEERS`]): plain multi-block AES on
//! the `aes` crate over the same bytes — not XTS, but the ceiling of any
//! XTS built on that crate.

use std::hint::black_box;

use aes::{Aes128, Aes256};
use cipher::{
    BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, InnerIvInit, KeyInit, KeyIvInit,
    StreamCipher,
};
use crypto_offload_fallback::choice::Mode;
use crypto_offload_fallback::{Cbc, CrcAlg, Ctr, Gcm, Implementation, Xts};

use crate::{AwsLcXts, SIZES};

/// The key every contender uses (the first 16 or 32 bytes for AES, all 64
/// for XTS-AES-256).
pub const KEY: [u8; 64] = {
    let mut k = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        k[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    k
};

/// Runs a call a number of times on a buffer.
type Runner = Box<dyn FnMut(&mut [u8], u64)>;

/// One benchmarked call on a buffer, in place.
pub struct Contender {
    /// `fallback`, `fallback-<implementation>` or the peer's name.
    pub name: String,
    run: Runner,
}

impl Contender {
    /// `f` as a contender (what it returns is kept from the optimiser).
    /// The loop over iterations is compiled with `f` inside it, so a run
    /// costs no indirect call per iteration.
    pub fn new<R>(name: impl Into<String>, mut f: impl FnMut(&mut [u8]) -> R + 'static) -> Self {
        Contender {
            name: name.into(),
            run: Box::new(move |buf, iters| {
                for _ in 0..iters {
                    black_box(f(black_box(&mut *buf)));
                }
            }),
        }
    }

    /// Runs the call `iters` times on `buf`.
    pub fn run(&mut self, buf: &mut [u8], iters: u64) {
        (self.run)(buf, iters)
    }
}

/// An algorithm's contenders and the sizes they are timed at.
pub struct Group {
    /// The criterion group name, e.g. `ctr-128`.
    pub name: String,
    /// Request sizes in bytes.
    pub sizes: Vec<usize>,
    /// The fallback and its peers.
    pub contenders: Vec<Contender>,
}

impl Group {
    fn new(name: impl Into<String>) -> Self {
        Group {
            name: name.into(),
            sizes: SIZES.to_vec(),
            contenders: Vec::new(),
        }
    }

    fn add<R>(&mut self, name: impl Into<String>, f: impl FnMut(&mut [u8]) -> R + 'static) {
        self.contenders.push(Contender::new(name, f));
    }
}

/// Every group: AES-128-GCM seal, AES-128-CTR, AES-256-CBC both ways,
/// XTS-AES-256 in 4 KiB and 512 B units, and the five CRCs.
pub fn groups() -> Vec<Group> {
    let mut out = vec![gcm(), ctr(), cbc(true), cbc(false)];
    out.extend([4096, 512].map(xts));
    out.extend(CrcAlg::ALL.map(crc));
    out
}

fn gcm() -> Group {
    let mut g = Group::new("gcm-128-seal");
    const NONCE: [u8; 12] = [3; 12];
    for &imp in Implementation::ALL {
        let k = Gcm::with_implementation(&KEY[..16], imp).unwrap();
        g.add(format!("fallback-{}", imp.name()), move |buf| {
            black_box(k.seal_in_place_detached(&NONCE, b"", buf).unwrap());
        });
    }
    let k = Gcm::new(&KEY[..16]).unwrap();
    g.add("fallback", move |buf| {
        black_box(k.seal_in_place_detached(&NONCE, b"", buf).unwrap());
    });
    {
        use aes_gcm::aead::AeadInOut;
        let k = aes_gcm::Aes128Gcm::new_from_slice(&KEY[..16]).unwrap();
        g.add("aes-gcm", move |buf| {
            black_box(
                k.encrypt_inout_detached(&NONCE.into(), b"", buf.into())
                    .unwrap(),
            );
        });
    }
    {
        use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let k = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &KEY[..16]).unwrap());
        g.add("ring", move |buf| {
            k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(NONCE), Aad::from(b""), buf)
                .unwrap()
        });
    }
    {
        use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let k = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &KEY[..16]).unwrap());
        // Its fastest call: `seal_in_place_scatter` writes the tag where it
        // is asked to; `seal_in_place_separate_tag`'s returned `Tag` (16
        // bytes and a length, read through an out-of-line `as_ref`) cost
        // ~10–14 ns more at 16–128 B on Intel Xeon family 6 model 207.
        g.add("aws-lc-rs", move |buf| {
            let mut tag = [0u8; 16];
            k.seal_in_place_scatter(
                Nonce::assume_unique_for_key(NONCE),
                Aad::from(b""),
                buf,
                &[],
                &mut tag,
            )
            .unwrap();
            tag
        });
    }
    g
}

fn ctr() -> Group {
    let mut g = Group::new("ctr-128");
    const IV: [u8; 16] = [0xf0; 16];
    for &imp in Mode::Ctr.candidates() {
        let k = Ctr::with_implementation(&KEY[..16], imp).unwrap();
        g.add(format!("fallback-{}", imp.name()), move |buf| {
            k.apply_keystream(&IV, buf).unwrap()
        });
    }
    let k = Ctr::new(&KEY[..16]).unwrap();
    g.add("fallback", move |buf| k.apply_keystream(&IV, buf).unwrap());
    g.add("ctr", |buf| {
        ctr::Ctr128BE::<Aes128>::new_from_slices(&KEY[..16], &IV)
            .unwrap()
            .apply_keystream(buf)
    });
    {
        use aws_lc_rs::cipher::{AES_128, EncryptingKey, EncryptionContext, UnboundCipherKey};
        let k = EncryptingKey::ctr(UnboundCipherKey::new(&AES_128, &KEY[..16]).unwrap()).unwrap();
        g.add("aws-lc-rs", move |buf| {
            black_box(
                k.less_safe_encrypt(buf, EncryptionContext::Iv128(IV.into()))
                    .unwrap(),
            );
        });
    }
    g
}

fn cbc(encrypt: bool) -> Group {
    let mut g = Group::new(if encrypt {
        "cbc-256-encrypt"
    } else {
        "cbc-256-decrypt"
    });
    const IV: [u8; 16] = [9; 16];
    let ours = |k: Cbc| {
        move |buf: &mut [u8]| {
            if encrypt {
                k.encrypt(&IV, buf).unwrap()
            } else {
                k.decrypt(&IV, buf).unwrap()
            }
        }
    };
    for &imp in Mode::Cbc.candidates() {
        let k = Cbc::with_implementation(&KEY[..32], imp).unwrap();
        g.add(format!("fallback-{}", imp.name()), ours(k));
    }
    g.add("fallback", ours(Cbc::new(&KEY[..32]).unwrap()));
    let rc = Aes256::new_from_slice(&KEY[..32]).unwrap();
    g.add("cbc", move |buf| {
        let (blocks, _) = buf.as_chunks_mut::<16>();
        let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
        if encrypt {
            cbc::Encryptor::<&Aes256>::inner_iv_init(&rc, &IV.into()).encrypt_blocks(blocks)
        } else {
            cbc::Decryptor::<&Aes256>::inner_iv_init(&rc, &IV.into()).decrypt_blocks(blocks)
        }
    });
    {
        use aws_lc_rs::cipher::{
            AES_256, DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext,
            UnboundCipherKey,
        };
        let e = EncryptingKey::cbc(UnboundCipherKey::new(&AES_256, &KEY[..32]).unwrap()).unwrap();
        let d = DecryptingKey::cbc(UnboundCipherKey::new(&AES_256, &KEY[..32]).unwrap()).unwrap();
        g.add("aws-lc-rs", move |buf| {
            if encrypt {
                black_box(
                    e.less_safe_encrypt(buf, EncryptionContext::Iv128(IV.into()))
                        .unwrap(),
                );
            } else {
                black_box(d.decrypt(buf, DecryptionContext::Iv128(IV.into())).unwrap());
            }
        });
    }
    g
}

/// XTS-AES-256 in `unit`-byte data units; a request shorter than a unit is
/// one shorter unit.
fn xts(unit: usize) -> Group {
    let mut g = Group::new(format!("xts-256-encrypt-{unit}B-units"));
    const TWEAK: u128 = 7;
    for &imp in Mode::Xts.candidates() {
        let k = Xts::with_implementation(&KEY, imp).unwrap();
        g.add(format!("fallback-{}", imp.name()), move |buf| {
            let u = buf.len().min(unit);
            k.encrypt_units(&TWEAK.to_le_bytes(), u, buf).unwrap()
        });
    }
    let k = Xts::new(&KEY).unwrap();
    g.add("fallback", move |buf| {
        let u = buf.len().min(unit);
        k.encrypt_units(&TWEAK.to_le_bytes(), u, buf).unwrap()
    });
    let x = xts_mode::Xts128::new(
        Aes256::new_from_slice(&KEY[..32]).unwrap(),
        Aes256::new_from_slice(&KEY[32..]).unwrap(),
    );
    g.add("xts-mode", move |buf| {
        let u = buf.len().min(unit);
        x.encrypt_area(buf, u, TWEAK, xts_mode::get_tweak_default)
    });
    // Not XTS: the aes crate's own multi-block ECB over the same bytes, the
    // ceiling for any XTS written on it.
    let ecb = Aes256::new_from_slice(&KEY[..32]).unwrap();
    g.add("aes-crate-ecb", move |buf| {
        let (blocks, _) = buf.as_chunks_mut::<16>();
        ecb.encrypt_blocks(cipher::array::Array::cast_slice_from_core_mut(blocks))
    });
    let mut a = AwsLcXts::new(&KEY);
    g.add("aws-lc", move |buf| {
        let u = buf.len().min(unit);
        a.run(TWEAK, u, buf, true)
    });
    g
}

fn crc(alg: CrcAlg) -> Group {
    let mut g = Group::new(alg.name().to_ascii_lowercase().replace('/', "-"));
    // Both sides with the algorithm a constant in each closure: crc-fast's
    // typed one-shots where it has them (they skip its match on the
    // algorithm), else its `checksum` with the algorithm named; ours as a
    // caller that names its algorithm calls it.
    const { assert!(CrcAlg::ALL.len() == 5, "a CRC without its own arms below") };
    macro_rules! constant {
        ($($a:ident => $fast:expr),* $(,)?) => {
            match alg {
                $(CrcAlg::$a => {
                    g.add("fallback", |buf| {
                        black_box(crypto_offload_fallback::checksum(CrcAlg::$a, buf));
                    });
                    g.add("crc-fast", $fast);
                })*
                _ => unreachable!("every CrcAlg has its arm (the assertion above)"),
            }
        };
    }
    constant!(
        Crc32IsoHdlc => |buf| crc_fast::crc32_iso_hdlc(buf),
        Crc32Iscsi => |buf| crc_fast::crc32_iscsi(buf),
        Crc64Nvme => |buf| crc_fast::crc64_nvme(buf),
        Crc64Xz => |buf| crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Xz, buf),
        Crc64GoIso => |buf| crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64GoIso, buf),
    );
    match alg {
        CrcAlg::Crc32IsoHdlc => g.add("crc32fast", |buf| {
            black_box(crc32fast::hash(buf));
        }),
        CrcAlg::Crc32Iscsi => g.add("crc32c", |buf| {
            black_box(crc32c::crc32c(buf));
        }),
        CrcAlg::Crc64Xz => g.add("crc64fast", |buf| {
            let mut d = crc64fast::Digest::new();
            d.write(buf);
            black_box(d.sum64());
        }),
        CrcAlg::Crc64Nvme => g.add("crc64fast-nvme", |buf| {
            let mut d = crc64fast_nvme::Digest::new();
            d.write(buf);
            black_box(d.sum64());
        }),
        _ => {}
    }
    // The fallback's CRC-64 fold called directly (not a peer: the part of
    // the fallback that runs the middle lengths, without its dispatch).
    #[cfg(feature = "clmul")]
    if let Some(clmul) = crypto_offload_native::Clmul::detect() {
        use crypto_offload_native::Crc64Fold;
        let fold = match alg {
            CrcAlg::Crc64Nvme => Some(Crc64Fold::NVME),
            CrcAlg::Crc64Xz => Some(Crc64Fold::XZ),
            CrcAlg::Crc64GoIso => Some(Crc64Fold::GO_ISO),
            _ => None,
        };
        if let Some(fold) = fold {
            g.add(
                format!("fallback-{}", Implementation::Crc64Fold.name()),
                move |buf| {
                    black_box(fold.update(clmul, u64::MAX, buf) ^ u64::MAX);
                },
            );
        }
    }
    macro_rules! reference {
        ($w:ty, $p:expr) => {{
            let table16 = crc::Crc::<$w, crc::Table<16>>::new($p);
            g.add("crc-table16", move |buf| {
                black_box(table16.checksum(buf));
            });
            let table1 = crc::Crc::<$w>::new($p);
            g.add("crc", move |buf| {
                black_box(table1.checksum(buf));
            });
        }};
    }
    match alg {
        CrcAlg::Crc32IsoHdlc => reference!(u32, &crc::CRC_32_ISO_HDLC),
        CrcAlg::Crc32Iscsi => reference!(u32, &crc::CRC_32_ISCSI),
        CrcAlg::Crc64Nvme => reference!(u64, &crc::CRC_64_NVME),
        CrcAlg::Crc64Xz => reference!(u64, &crc::CRC_64_XZ),
        _ => reference!(u64, &crc::CRC_64_GO_ISO),
    }
    g
}
