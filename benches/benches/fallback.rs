//! The CPU fallback against the fastest CPU implementations available to Rust
//! and the RustCrypto reference crates, at 16 B – 1 MiB, single core.
//!
//! ```text
//! cargo bench -p crypto-offload-benches --bench fallback
//! cargo run -p crypto-offload-benches --release --bin ratio-table
//! ```
//!
//! Names: `fallback` is what `Xxx::new` picks; `fallback-rustcrypto` and
//! `fallback-aws-lc` force one implementation; every other name is a peer,
//! except `aes-crate-ecb`: plain multi-block AES on the `aes` crate over the
//! same bytes — not XTS, but the ceiling of any XTS built on that crate.

use std::hint::black_box;
use std::time::Duration;

use aes::{Aes128, Aes256};
use cipher::{
    BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, InnerIvInit, KeyInit, KeyIvInit,
    StreamCipher,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crypto_offload_benches::{AwsLcXts, SIZES, data};
use crypto_offload_fallback::choice::Mode;
use crypto_offload_fallback::{Cbc, CrcAlg, Ctr, Gcm, Implementation, Xts};

const KEY: [u8; 64] = {
    let mut k = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        k[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    k
};

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    crypto_offload_benches::group(c, name, Duration::from_millis(900), 20)
}

/// Runs `f` over a buffer of each size, in place, as the throughput bench
/// `name` of group `g`.
macro_rules! each_size {
    ($g:expr, $name:expr, $sizes:expr, |$buf:ident| $body:expr) => {
        for &size in $sizes {
            $g.throughput(Throughput::Bytes(size as u64));
            #[allow(unused_mut)]
            let mut $buf = data(size);
            $g.bench_with_input(BenchmarkId::new($name, size), &size, |b, _| {
                b.iter(|| $body)
            });
        }
    };
}

/// GCM split over threads against the serial call, per implementation, at
/// sizes a blocking-pool job has (the session splits only from
/// `Gcm::PARALLEL_MIN_THREADS` threads; this shows why).
fn gcm_threads(c: &mut Criterion) {
    let mut g = group(c, "gcm-128-seal-threads");
    let nonce = [3u8; 12];
    for &imp in Implementation::ALL {
        let k = Gcm::with_implementation(&KEY[..16], imp).unwrap();
        for threads in [1usize, 2] {
            let name = format!("{}-{threads}-thread", imp.name());
            each_size!(g, &name, &[1 << 20, 16 << 20], |buf| black_box(
                k.seal_in_place_detached_parallel(&nonce, b"", &mut buf, threads)
                    .unwrap()
            ));
        }
    }
    g.finish();
}

fn gcm(c: &mut Criterion) {
    let mut g = group(c, "gcm-128-seal");
    let nonce = [3u8; 12];
    let aad = [0u8; 0];
    for &imp in Implementation::ALL {
        let k = Gcm::with_implementation(&KEY[..16], imp).unwrap();
        let name = format!("fallback-{}", imp.name());
        each_size!(g, &name, &SIZES, |buf| black_box(
            k.seal_in_place_detached(&nonce, &aad, &mut buf).unwrap()
        ));
    }
    let k = Gcm::new(&KEY[..16]).unwrap();
    each_size!(g, "fallback", &SIZES, |buf| black_box(
        k.seal_in_place_detached(&nonce, &aad, &mut buf).unwrap()
    ));
    {
        use aes_gcm::aead::AeadInOut;
        let k = aes_gcm::Aes128Gcm::new_from_slice(&KEY[..16]).unwrap();
        each_size!(g, "aes-gcm", &SIZES, |buf| black_box(
            k.encrypt_inout_detached(&nonce.into(), &aad, buf.as_mut_slice().into())
                .unwrap()
        ));
    }
    {
        use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let k = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &KEY[..16]).unwrap());
        each_size!(g, "ring", &SIZES, |buf| black_box(
            k.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut buf
            )
            .unwrap()
        ));
    }
    {
        use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let k = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &KEY[..16]).unwrap());
        each_size!(g, "aws-lc-rs", &SIZES, |buf| black_box(
            k.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut buf
            )
            .unwrap()
        ));
    }
    g.finish();
}

fn ctr(c: &mut Criterion) {
    let mut g = group(c, "ctr-128");
    let iv = [0xf0u8; 16];
    for &imp in Mode::Ctr.candidates() {
        let k = Ctr::with_implementation(&KEY[..16], imp).unwrap();
        let name = format!("fallback-{}", imp.name());
        each_size!(g, &name, &SIZES, |buf| k
            .apply_keystream(&iv, &mut buf)
            .unwrap());
    }
    let k = Ctr::new(&KEY[..16]).unwrap();
    each_size!(g, "fallback", &SIZES, |buf| k
        .apply_keystream(&iv, &mut buf)
        .unwrap());
    each_size!(g, "ctr", &SIZES, |buf| {
        ctr::Ctr128BE::<Aes128>::new_from_slices(&KEY[..16], &iv)
            .unwrap()
            .apply_keystream(&mut buf)
    });
    {
        use aws_lc_rs::cipher::{AES_128, EncryptingKey, EncryptionContext, UnboundCipherKey};
        let k = EncryptingKey::ctr(UnboundCipherKey::new(&AES_128, &KEY[..16]).unwrap()).unwrap();
        each_size!(g, "aws-lc-rs", &SIZES, |buf| black_box(
            k.less_safe_encrypt(&mut buf, EncryptionContext::Iv128(iv.into()))
                .unwrap()
        ));
    }
    g.finish();
}

fn cbc(c: &mut Criterion) {
    let iv = [9u8; 16];
    for encrypt in [true, false] {
        let mut g = group(
            c,
            if encrypt {
                "cbc-256-encrypt"
            } else {
                "cbc-256-decrypt"
            },
        );
        for &imp in Mode::Cbc.candidates() {
            let k = Cbc::with_implementation(&KEY[..32], imp).unwrap();
            let name = format!("fallback-{}", imp.name());
            if encrypt {
                each_size!(g, &name, &SIZES, |buf| k.encrypt(&iv, &mut buf).unwrap());
            } else {
                each_size!(g, &name, &SIZES, |buf| k.decrypt(&iv, &mut buf).unwrap());
            }
        }
        let k = Cbc::new(&KEY[..32]).unwrap();
        if encrypt {
            each_size!(g, "fallback", &SIZES, |buf| k
                .encrypt(&iv, &mut buf)
                .unwrap());
        } else {
            each_size!(g, "fallback", &SIZES, |buf| k
                .decrypt(&iv, &mut buf)
                .unwrap());
        }
        let rc = Aes256::new_from_slice(&KEY[..32]).unwrap();
        each_size!(g, "cbc", &SIZES, |buf| {
            let (blocks, _) = buf.as_chunks_mut::<16>();
            let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
            if encrypt {
                cbc::Encryptor::<&Aes256>::inner_iv_init(&rc, &iv.into()).encrypt_blocks(blocks)
            } else {
                cbc::Decryptor::<&Aes256>::inner_iv_init(&rc, &iv.into()).decrypt_blocks(blocks)
            }
        });
        {
            use aws_lc_rs::cipher::{
                AES_256, DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext,
                UnboundCipherKey,
            };
            let e =
                EncryptingKey::cbc(UnboundCipherKey::new(&AES_256, &KEY[..32]).unwrap()).unwrap();
            let d =
                DecryptingKey::cbc(UnboundCipherKey::new(&AES_256, &KEY[..32]).unwrap()).unwrap();
            each_size!(g, "aws-lc-rs", &SIZES, |buf| if encrypt {
                black_box(
                    e.less_safe_encrypt(&mut buf, EncryptionContext::Iv128(iv.into()))
                        .unwrap(),
                );
            } else {
                black_box(
                    d.decrypt(&mut buf, DecryptionContext::Iv128(iv.into()))
                        .unwrap(),
                );
            });
        }
        g.finish();
    }
}

fn xts(c: &mut Criterion) {
    for unit in [4096usize, 512] {
        let mut g = group(c, &format!("xts-256-encrypt-{unit}B-units"));
        let sizes = SIZES;
        // Below one unit, the request is one shorter unit.
        let unit_of = |size: usize| size.min(unit);
        for &imp in Mode::Xts.candidates() {
            let k = Xts::with_implementation(&KEY, imp).unwrap();
            let name = format!("fallback-{}", imp.name());
            each_size!(g, &name, &sizes, |buf| {
                let u = unit_of(buf.len());
                k.encrypt_units(&7u128.to_le_bytes(), u, &mut buf).unwrap()
            });
        }
        let k = Xts::new(&KEY).unwrap();
        each_size!(g, "fallback", &sizes, |buf| {
            let u = unit_of(buf.len());
            k.encrypt_units(&7u128.to_le_bytes(), u, &mut buf).unwrap()
        });
        let x = xts_mode::Xts128::new(
            Aes256::new_from_slice(&KEY[..32]).unwrap(),
            Aes256::new_from_slice(&KEY[32..]).unwrap(),
        );
        each_size!(g, "xts-mode", &sizes, |buf| {
            let u = unit_of(buf.len());
            x.encrypt_area(&mut buf, u, 7, xts_mode::get_tweak_default)
        });
        // Not XTS: the aes crate's own multi-block ECB over the same bytes,
        // the ceiling for any XTS written on it.
        let ecb = Aes256::new_from_slice(&KEY[..32]).unwrap();
        each_size!(g, "aes-crate-ecb", &sizes, |buf| {
            let (blocks, _) = buf.as_chunks_mut::<16>();
            ecb.encrypt_blocks(cipher::array::Array::cast_slice_from_core_mut(blocks))
        });
        let mut a = AwsLcXts::new(&KEY);
        each_size!(g, "aws-lc", &sizes, |buf| {
            let u = unit_of(buf.len());
            a.run(7, u, &mut buf, true)
        });
        g.finish();
    }
}

fn crc(c: &mut Criterion) {
    for alg in CrcAlg::ALL {
        let mut g = group(c, &alg.name().to_ascii_lowercase().replace('/', "-"));
        each_size!(g, "fallback", &SIZES, |buf| black_box(
            crypto_offload_fallback::checksum(alg, black_box(&buf))
        ));
        let fast = match alg {
            CrcAlg::Crc32IsoHdlc => crc_fast::CrcAlgorithm::Crc32IsoHdlc,
            CrcAlg::Crc32Iscsi => crc_fast::CrcAlgorithm::Crc32Iscsi,
            CrcAlg::Crc64Nvme => crc_fast::CrcAlgorithm::Crc64Nvme,
            CrcAlg::Crc64Xz => crc_fast::CrcAlgorithm::Crc64Xz,
            _ => crc_fast::CrcAlgorithm::Crc64GoIso,
        };
        each_size!(g, "crc-fast", &SIZES, |buf| black_box(crc_fast::checksum(
            fast,
            black_box(&buf)
        )));
        if alg == CrcAlg::Crc32IsoHdlc {
            each_size!(g, "crc32fast", &SIZES, |buf| black_box(crc32fast::hash(
                black_box(&buf)
            )));
        }
        if alg == CrcAlg::Crc64Xz {
            each_size!(g, "crc64fast", &SIZES, |buf| {
                let mut d = crc64fast::Digest::new();
                d.write(black_box(&buf));
                black_box(d.sum64())
            });
        }
        if alg == CrcAlg::Crc64Nvme {
            each_size!(g, "crc64fast-nvme", &SIZES, |buf| {
                let mut d = crc64fast_nvme::Digest::new();
                d.write(black_box(&buf));
                black_box(d.sum64())
            });
        }
        if alg == CrcAlg::Crc32Iscsi {
            each_size!(g, "crc32c", &SIZES, |buf| black_box(crc32c::crc32c(
                black_box(&buf)
            )));
        }
        macro_rules! reference {
            ($w:ty, $p:expr) => {{
                let table16 = crc::Crc::<$w, crc::Table<16>>::new($p);
                each_size!(g, "crc-table16", &SIZES, |buf| black_box(
                    table16.checksum(black_box(&buf))
                ));
                let table1 = crc::Crc::<$w>::new($p);
                each_size!(g, "crc", &SIZES, |buf| black_box(
                    table1.checksum(black_box(&buf))
                ));
            }};
        }
        match alg {
            CrcAlg::Crc32IsoHdlc => reference!(u32, &crc::CRC_32_ISO_HDLC),
            CrcAlg::Crc32Iscsi => reference!(u32, &crc::CRC_32_ISCSI),
            CrcAlg::Crc64Nvme => reference!(u64, &crc::CRC_64_NVME),
            CrcAlg::Crc64Xz => reference!(u64, &crc::CRC_64_XZ),
            _ => reference!(u64, &crc::CRC_64_GO_ISO),
        }
        g.finish();
    }
}

criterion_group!(benches, gcm, gcm_threads, ctr, cbc, xts, crc);
criterion_main!(benches);
