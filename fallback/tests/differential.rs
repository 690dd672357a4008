//! Differential tests: every fallback algorithm and implementation against the
//! independent reference crates (RustCrypto `ctr`, `cbc`, `xts-mode`,
//! `aes-gcm`, `crc`) and against aws-lc-rs, on random keys, IVs, lengths
//! (0–64 KiB) and split points.

use aes::{Aes128, Aes192, Aes256};
use cipher::{BlockModeDecrypt, BlockModeEncrypt, KeyInit, KeyIvInit, StreamCipher};
use crypto_offload_fallback::choice::{Choice, Mode};
use crypto_offload_fallback::{
    Cbc, Crc, CrcAlg, Ctr, Error, Gcm, Implementation, Xts, checksum, combine,
};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    }
}

/// Mostly short lengths (where the edge cases live), some up to 64 KiB.
fn len_upto_64k() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..=80, 2 => 0usize..=4200, 1 => 0usize..=65536]
}

fn aes_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(16usize), Just(24), Just(32)]
        .prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n))
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    // Cheap deterministic filler: the values do not matter, only that they vary.
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Counter blocks near the 128-bit wrap as well as random ones.
fn counter_block() -> impl Strategy<Value = [u8; 16]> {
    prop_oneof![
        any::<[u8; 16]>(),
        (0u128..8).prop_map(|k| (u128::MAX - k).to_be_bytes()),
        (0u64..8).prop_map(|k| ((u64::MAX - k) as u128).to_be_bytes()),
    ]
}

fn ctr_reference(key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    match key.len() {
        16 => ctr::Ctr128BE::<Aes128>::new_from_slices(key, iv)
            .unwrap()
            .apply_keystream(data),
        24 => ctr::Ctr128BE::<Aes192>::new_from_slices(key, iv)
            .unwrap()
            .apply_keystream(data),
        32 => ctr::Ctr128BE::<Aes256>::new_from_slices(key, iv)
            .unwrap()
            .apply_keystream(data),
        _ => unreachable!(),
    }
}

fn aws_lc_ctr(key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    use aws_lc_rs::cipher::{
        AES_128, AES_192, AES_256, EncryptingKey, EncryptionContext, UnboundCipherKey,
    };
    let alg = match key.len() {
        16 => &AES_128,
        24 => &AES_192,
        _ => &AES_256,
    };
    let k = EncryptingKey::ctr(UnboundCipherKey::new(alg, key).unwrap()).unwrap();
    k.less_safe_encrypt(data, EncryptionContext::Iv128((*iv).into()))
        .unwrap();
}

fn cbc_reference(key: &[u8], iv: &[u8; 16], data: &mut [u8], encrypt: bool) {
    let (blocks, _) = data.as_chunks_mut::<16>();
    let blocks = cipher::array::Array::cast_slice_from_core_mut(blocks);
    macro_rules! go {
        ($c:ty) => {
            if encrypt {
                cbc::Encryptor::<$c>::new_from_slices(key, iv)
                    .unwrap()
                    .encrypt_blocks(blocks)
            } else {
                cbc::Decryptor::<$c>::new_from_slices(key, iv)
                    .unwrap()
                    .decrypt_blocks(blocks)
            }
        };
    }
    match key.len() {
        16 => go!(Aes128),
        24 => go!(Aes192),
        32 => go!(Aes256),
        _ => unreachable!(),
    }
}

fn xts_reference(key: &[u8], tweak: [u8; 16], data: &mut [u8], encrypt: bool) {
    let (k1, k2) = key.split_at(key.len() / 2);
    macro_rules! go {
        ($c:ty) => {{
            let x = xts_mode::Xts128::new(
                <$c>::new_from_slice(k1).unwrap(),
                <$c>::new_from_slice(k2).unwrap(),
            );
            if encrypt {
                x.encrypt_sector(data, tweak.into())
            } else {
                x.decrypt_sector(data, tweak.into())
            }
        }};
    }
    match k1.len() {
        16 => go!(Aes128),
        24 => go!(Aes192),
        32 => go!(Aes256),
        _ => unreachable!(),
    }
}

fn gcm_reference(key: &[u8], nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> [u8; 16] {
    use aes_gcm::aead::AeadInOut;
    macro_rules! go {
        ($c:ty) => {
            <$c>::new_from_slice(key)
                .unwrap()
                .encrypt_inout_detached(&(*nonce).into(), aad, data.into())
                .unwrap()
                .0
        };
    }
    match key.len() {
        16 => go!(aes_gcm::Aes128Gcm),
        24 => go!(aes_gcm::AesGcm<Aes192, cipher::consts::U12>),
        32 => go!(aes_gcm::Aes256Gcm),
        _ => unreachable!(),
    }
}

fn aws_lc_gcm(key: &[u8], nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> [u8; 16] {
    use aws_lc_rs::aead::{
        AES_128_GCM, AES_192_GCM, AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey,
    };
    let alg = match key.len() {
        16 => &AES_128_GCM,
        24 => &AES_192_GCM,
        _ => &AES_256_GCM,
    };
    let k = LessSafeKey::new(UnboundKey::new(alg, key).unwrap());
    let tag = k
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), data)
        .unwrap();
    tag.as_ref().try_into().unwrap()
}

fn crc_reference(alg: CrcAlg, data: &[u8]) -> u64 {
    use crc::{CRC_32_ISCSI, CRC_32_ISO_HDLC, CRC_64_GO_ISO, CRC_64_NVME, CRC_64_XZ};
    match alg {
        CrcAlg::Crc32IsoHdlc => crc::Crc::<u32>::new(&CRC_32_ISO_HDLC).checksum(data).into(),
        CrcAlg::Crc32Iscsi => crc::Crc::<u32>::new(&CRC_32_ISCSI).checksum(data).into(),
        CrcAlg::Crc64Nvme => crc::Crc::<u64>::new(&CRC_64_NVME).checksum(data),
        CrcAlg::Crc64Xz => crc::Crc::<u64>::new(&CRC_64_XZ).checksum(data),
        CrcAlg::Crc64GoIso => crc::Crc::<u64>::new(&CRC_64_GO_ISO).checksum(data),
        _ => unreachable!("a new CrcAlg needs a reference here"),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ctr_matches_rustcrypto_ctr_and_aws_lc(key in aes_key(), iv in counter_block(), len in len_upto_64k(), seed: u64) {
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        ctr_reference(&key, &iv, &mut want);
        let mut peer = pt.clone();
        aws_lc_ctr(&key, &iv, &mut peer);
        prop_assert_eq!(&want, &peer, "the two references disagree");
        for &imp in Mode::Ctr.candidates() {
            let ctr = Ctr::with_implementation(&key, imp).unwrap();
            let mut got = pt.clone();
            ctr.apply_keystream(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?}", imp);
            ctr.apply_keystream(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &pt, "{:?} round trip", imp);
        }
    }

    #[test]
    fn ctr_split_at_block_boundary_continues_the_counter(key in aes_key(), iv in counter_block(), blocks in 0usize..40, len in 0usize..700, seed: u64) {
        // Encrypting [0, 16k) then [16k, len) with the counter advanced by k
        // equals encrypting the whole: the counter carries across all 128 bits.
        let pt = bytes(len.max(blocks * 16), seed);
        let ctr = Ctr::new(&key).unwrap();
        let mut whole = pt.clone();
        ctr.apply_keystream(&iv, &mut whole).unwrap();
        let mut parts = pt.clone();
        let (a, b) = parts.split_at_mut(blocks * 16);
        ctr.apply_keystream(&iv, a).unwrap();
        let next = u128::from_be_bytes(iv).wrapping_add(blocks as u128).to_be_bytes();
        ctr.apply_keystream(&next, b).unwrap();
        prop_assert_eq!(parts, whole);
    }

    #[test]
    fn cbc_matches_rustcrypto_cbc_and_aws_lc(key in aes_key(), iv: [u8; 16], blocks in prop_oneof![0usize..8, 0usize..300, 0usize..4097], seed: u64) {
        let pt = bytes(blocks * 16, seed);
        let mut want = pt.clone();
        cbc_reference(&key, &iv, &mut want, true);
        for &imp in Mode::Cbc.candidates() {
            let cbc = Cbc::with_implementation(&key, imp).unwrap();
            let mut got = pt.clone();
            cbc.encrypt(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?} encrypt", imp);
            cbc.decrypt(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &pt, "{:?} decrypt", imp);
        }
        let mut back = want.clone();
        cbc_reference(&key, &iv, &mut back, false);
        prop_assert_eq!(back, pt);
    }

    #[test]
    fn cbc_rejects_partial_blocks_and_leaves_data_alone(key in aes_key(), iv: [u8; 16], len in 0usize..200, seed: u64) {
        prop_assume!(len % 16 != 0);
        let pt = bytes(len, seed);
        for &imp in Mode::Cbc.candidates() {
            let cbc = Cbc::with_implementation(&key, imp).unwrap();
            let mut buf = pt.clone();
            let err = cbc.encrypt(&iv, &mut buf).unwrap_err();
            prop_assert!(matches!(err, Error::DataLength { len: l, .. } if l == len), "{:?}", err);
            prop_assert!(cbc.decrypt(&iv, &mut buf).is_err());
            prop_assert_eq!(&buf, &pt);
        }
    }

    #[test]
    fn xts_matches_xts_mode(klen in prop_oneof![Just(32usize), Just(48), Just(64)], key_seed: u64, tweak: [u8; 16], len in prop_oneof![16usize..80, 16usize..4200, 16usize..65537], seed: u64) {
        let key = bytes(klen, key_seed);
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        xts_reference(&key, tweak, &mut want, true);
        // Every implementation (AWS-LC's is XTS-AES-256 only: the others
        // run on RustCrypto whatever the choice).
        for &imp in Mode::Xts.candidates() {
            let xts = Xts::with_choice(&key, Choice::one(imp)).unwrap();
            prop_assert!(xts.choice() == Choice::one(imp) || klen != 64, "{:?}", imp);
            let mut got = pt.clone();
            xts.encrypt(&tweak, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?}", imp);
            xts.decrypt(&tweak, &mut got).unwrap();
            prop_assert_eq!(&got, &pt, "{:?}", imp);
        }
    }

    #[test]
    fn xts_units_match_one_call_per_unit(key_seed: u64, first: [u8; 16], unit in prop_oneof![Just(512usize), Just(4096), 16usize..600], units in 0usize..70, seed: u64) {
        let key = bytes(64, key_seed);
        let pt = bytes(unit * units, seed);
        let mut want = pt.clone();
        let mut sector = u128::from_le_bytes(first);
        for chunk in want.chunks_mut(unit) {
            xts_reference(&key, sector.to_le_bytes(), chunk, true);
            sector = sector.wrapping_add(1);
        }
        for &imp in Mode::Xts.candidates() {
            let xts = Xts::with_implementation(&key, imp).unwrap();
            let mut got = pt.clone();
            xts.encrypt_units(&first, unit, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?}", imp);
            xts.decrypt_units(&first, unit, &mut got).unwrap();
            prop_assert_eq!(&got, &pt, "{:?}", imp);
        }
    }

    #[test]
    fn gcm_matches_aes_gcm_and_aws_lc(key in aes_key(), nonce: [u8; 12], aad_len in prop_oneof![0usize..40, 0usize..2000], len in len_upto_64k(), seed: u64) {
        let aad = bytes(aad_len, seed ^ 0xaad);
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        let want_tag = gcm_reference(&key, &nonce, &aad, &mut want);
        let mut peer = pt.clone();
        prop_assert_eq!(aws_lc_gcm(&key, &nonce, &aad, &mut peer), want_tag, "the two references disagree");
        prop_assert_eq!(&peer, &want);
        for &imp in Implementation::ALL {
            // ring has no AES-192-GCM.
            let Some(gcm) = gcm_on(&key, imp) else { continue };
            let mut got = pt.clone();
            let tag = gcm.seal_in_place_detached(&nonce, &aad, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?} ciphertext", imp);
            prop_assert_eq!(tag, want_tag, "{:?} tag", imp);
            gcm.open_in_place_detached(&nonce, &aad, &mut got, &tag).unwrap();
            prop_assert_eq!(&got, &pt, "{:?} open", imp);
        }
    }

    #[test]
    fn gcm_on_several_threads_is_gcm(key in aes_key(), nonce: [u8; 12], aad_len in prop_oneof![0usize..40, 0usize..2000], len in len_upto_64k(), threads in 1usize..6, seed: u64) {
        let aad = bytes(aad_len, seed ^ 0x5a);
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        let want_tag = gcm_reference(&key, &nonce, &aad, &mut want);
        for &imp in Implementation::ALL {
            // ring has no AES-192-GCM.
            let Some(gcm) = gcm_on(&key, imp) else { continue };
            let mut got = pt.clone();
            let tag = gcm.seal_in_place_detached_parallel(&nonce, &aad, &mut got, threads).unwrap();
            prop_assert_eq!(&got, &want, "{:?} ciphertext, {} threads", imp, threads);
            prop_assert_eq!(tag, want_tag, "{:?} tag, {} threads", imp, threads);
            gcm.open_in_place_detached_parallel(&nonce, &aad, &mut got, &tag, threads).unwrap();
            prop_assert_eq!(&got, &pt, "{:?} open, {} threads", imp, threads);
        }
    }

    #[test]
    fn gcm_on_several_threads_rejects_tampering_and_wipes(key in aes_key(), nonce: [u8; 12], len in 1usize..5000, flip in any::<prop::sample::Index>(), bit in 0u8..8, what in 0u8..3, threads in 2usize..5, seed: u64) {
        let aad = bytes(13, seed ^ 1);
        let pt = bytes(len, seed);
        for &imp in Implementation::ALL {
            // ring has no AES-192-GCM.
            let Some(gcm) = gcm_on(&key, imp) else { continue };
            let mut ct = pt.clone();
            let mut tag = gcm.seal_in_place_detached(&nonce, &aad, &mut ct).unwrap();
            let mut aad = aad.clone();
            match what {
                0 => ct[flip.index(len)] ^= 1 << bit,
                1 => tag[flip.index(16)] ^= 1 << bit,
                _ => aad[flip.index(13)] ^= 1 << bit,
            }
            let err = gcm.open_in_place_detached_parallel(&nonce, &aad, &mut ct, &tag, threads).unwrap_err();
            prop_assert_eq!(err, Error::Authentication);
            prop_assert!(ct.iter().all(|&b| b == 0), "{:?} released data after a failed open", imp);
        }
    }

    #[test]
    fn gcm_tampering_is_rejected_and_wipes_the_buffer(key in aes_key(), nonce: [u8; 12], len in 1usize..300, flip in any::<prop::sample::Index>(), bit in 0u8..8, what in 0u8..3, seed: u64) {
        let aad = bytes(13, seed ^ 1);
        let pt = bytes(len, seed);
        for &imp in Implementation::ALL {
            // ring has no AES-192-GCM.
            let Some(gcm) = gcm_on(&key, imp) else { continue };
            let mut ct = pt.clone();
            let mut tag = gcm.seal_in_place_detached(&nonce, &aad, &mut ct).unwrap();
            let mut aad = aad.clone();
            match what {
                0 => ct[flip.index(len)] ^= 1 << bit,
                1 => tag[flip.index(16)] ^= 1 << bit,
                _ => aad[flip.index(13)] ^= 1 << bit,
            }
            let err = gcm.open_in_place_detached(&nonce, &aad, &mut ct, &tag).unwrap_err();
            prop_assert_eq!(err, Error::Authentication);
            prop_assert!(ct.iter().all(|&b| b == 0), "{:?} released data after a failed open", imp);
        }
    }

    #[test]
    fn crc_matches_the_crc_crate_with_random_splits(len in len_upto_64k(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6), seed: u64) {
        let data = bytes(len, seed);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(len + 1)).collect();
        cuts.sort_unstable();
        for alg in CrcAlg::ALL {
            let want = crc_reference(alg, &data);
            prop_assert_eq!(checksum(alg, &data), want, "{} one-shot", alg);
            let mut crc = Crc::new(alg);
            let mut at = 0;
            for &c in cuts.iter().chain(std::iter::once(&len)) {
                crc.update(&data[at..c]);
                at = c;
            }
            prop_assert_eq!(crc.finalize(), want, "{} streamed", alg);
            prop_assert_eq!(crc.len(), len as u64);
            prop_assert!(crc.verify(want).is_ok());
            prop_assert_eq!(crc.verify(want ^ 1), Err(Error::ChecksumMismatch { expected: want ^ 1, computed: want }));
        }
    }

    #[test]
    fn crc_resume_continues_a_crc_computed_elsewhere(len in len_upto_64k(), cut in any::<prop::sample::Index>(), seed: u64) {
        let data = bytes(len, seed);
        let (a, b) = data.split_at(cut.index(len + 1));
        for alg in CrcAlg::ALL {
            let mut crc = Crc::resume(alg, checksum(alg, a), a.len() as u64);
            crc.update(b);
            prop_assert_eq!(crc.finalize(), crc_reference(alg, &data), "{}", alg);
            prop_assert_eq!(crc.len(), len as u64);
        }
    }

    #[test]
    fn crc_combine_equals_crc_of_the_concatenation(len in len_upto_64k(), cut in any::<prop::sample::Index>(), seed: u64) {
        let data = bytes(len, seed);
        let cut = cut.index(len + 1);
        let (a, b) = data.split_at(cut);
        for alg in CrcAlg::ALL {
            let got = combine(alg, checksum(alg, a), checksum(alg, b), b.len() as u64);
            prop_assert_eq!(got, crc_reference(alg, &data), "{}", alg);
        }
    }
}

#[test]
fn crc_resumed_at_any_length_does_not_panic() {
    for alg in CrcAlg::ALL {
        for len in [u64::MAX - 3, u64::MAX] {
            let mut crc = Crc::resume(alg, 0x1234, len);
            crc.update(&[0u8; 1000]);
            crc.update(&[1u8; 10]);
            assert_eq!(crc.len(), u64::MAX, "{alg}: saturates");
        }
    }
}

#[test]
fn xts_rejects_bad_keys_and_short_data() {
    for len in [0, 16, 31, 33, 47, 63, 65, 128] {
        assert!(
            matches!(Xts::new(&vec![1u8; len]), Err(Error::KeyLength { .. })),
            "{len}"
        );
    }
    assert_eq!(Xts::new(&[9u8; 64]).unwrap_err(), Error::XtsWeakKey);
    let xts = Xts::new(&bytes(64, 3)).unwrap();
    for len in 0..16 {
        let mut data = vec![0xa5u8; len];
        assert!(
            matches!(
                xts.encrypt(&[0; 16], &mut data),
                Err(Error::DataLength { .. })
            ),
            "{len}"
        );
        assert!(data.iter().all(|&b| b == 0xa5));
    }
    let mut data = vec![0u8; 1000];
    assert!(matches!(
        xts.encrypt_units(&[0; 16], 512, &mut data),
        Err(Error::DataLength { .. })
    ));
    assert!(matches!(
        xts.encrypt_units(&[0; 16], 8, &mut data),
        Err(Error::DataLength { .. })
    ));
    assert!(matches!(
        xts.encrypt_units(&[0; 16], 0, &mut data),
        Err(Error::DataLength { .. })
    ));
    assert!(matches!(
        xts.encrypt_units(&[0; 16], usize::MAX, &mut data),
        Err(Error::DataLength { .. })
    ));
    assert!(xts.encrypt_units(&[0; 16], usize::MAX, &mut []).is_ok());
}

#[test]
fn every_mode_rejects_bad_aes_key_lengths() {
    for len in [0, 1, 15, 17, 23, 25, 31, 33, 64] {
        let key = vec![7u8; len];
        for &imp in Implementation::ALL {
            assert!(matches!(
                Ctr::with_implementation(&key, imp),
                Err(Error::KeyLength { .. })
            ));
            assert!(matches!(
                Cbc::with_implementation(&key, imp),
                Err(Error::KeyLength { .. })
            ));
            assert!(matches!(
                Gcm::with_implementation(&key, imp),
                Err(Error::KeyLength { .. })
            ));
        }
    }
}

#[test]
fn debug_output_shows_no_key_material() {
    let key = [0x5au8; 64];
    let key2: Vec<u8> = (0..64).map(|i| 0x5a ^ i).collect();
    let outputs = [
        format!("{:?}", Ctr::new(&key[..32]).unwrap()),
        format!("{:?}", Cbc::new(&key[..32]).unwrap()),
        format!("{:?}", Gcm::new(&key[..32]).unwrap()),
        format!("{:?}", Xts::new(&key2).unwrap()),
    ];
    // The keys' first bytes as `Debug` would print them: a decimal list
    // ("90, 90", XTS "90, 91") or hex ("5a5a", "5a5b", "0x5a"). Not a bare
    // "90": the measured GCM boundary is printed (`small_max: 1890` on an
    // AMD Zen 4).
    for out in outputs {
        let lower = out.to_ascii_lowercase();
        for leak in ["90, 90", "90, 91", "5a5a", "5a5b", "0x5a"] {
            assert!(!lower.contains(leak), "{leak} in {out}");
        }
        assert!(out.contains("key_size"), "{out}");
    }
}

/// The RustCrypto key schedules inside `Cbc`, `Ctr`, `Xts` and `Gcm` (the
/// `aes::Aes*` ciphers and `aes_gcm::AesGcm`) are wiped when dropped: that
/// comes from the `zeroize` features the workspace turns on for `aes` and
/// `aes-gcm`, and this fails to compile if one is turned off. (The parallel
/// path's `ghash::GHash` wipes its state in `polyval`'s `Drop` under its
/// `zeroize` feature but has no marker trait to assert; `Gcm`'s copy of the
/// key wipes itself in its own `Drop`; aws-lc-rs frees keys with
/// `OPENSSL_cleanse`; ring's keys, which have no zeroize, are kept in
/// `crypto_offload_native::Wiped`, whose test checks what the allocator
/// gets back.)
#[test]
fn key_schedules_are_wiped_on_drop() {
    fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}
    wiped_on_drop::<aes::Aes128>();
    wiped_on_drop::<aes::Aes192>();
    wiped_on_drop::<aes::Aes256>();
    wiped_on_drop::<aes_gcm::Aes128Gcm>();
    wiped_on_drop::<aes_gcm::AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>>();
    wiped_on_drop::<aes_gcm::Aes256Gcm>();
}

/// `key` on `imp`, or `None` where `imp` does not take its size (ring and
/// AES-192): any other error fails the test.
fn gcm_on(key: &[u8], imp: Implementation) -> Option<Gcm> {
    match Gcm::with_implementation(key, imp) {
        Err(Error::Unavailable { .. }) => {
            assert_eq!(key.len(), 24, "{imp:?} refused a {}-byte key", key.len());
            None
        }
        r => Some(r.unwrap()),
    }
}

/// Every length up to well past the CRC-64s' table limit and the CRC-32s'
/// size classes, one-shot and resumed: the `crc` crate's value (each
/// algorithm's one-shot takes its own path per length class).
#[test]
fn crc_every_short_length_matches_the_crc_crate() {
    let data = bytes(1100, 42);
    for alg in CrcAlg::ALL {
        for len in 0..=data.len() {
            let d = &data[..len];
            let want = crc_reference(alg, d);
            assert_eq!(checksum(alg, d), want, "{alg} {len} one-shot");
            let (a, b) = d.split_at(len / 3);
            let mut crc = Crc::resume(alg, checksum(alg, a), a.len() as u64);
            crc.update(b);
            assert_eq!(crc.finalize(), want, "{alg} {len} resumed");
        }
    }
}

// XTS data units of 16–47 bytes, one at a time: the lengths where a lone
// unit runs on AWS-LC's single-block AES (a one-block unit, or under 32
// bytes for XTS-AES-128/-192 keys, when small requests go to AWS-LC) and
// its neighbours, with every key size, every choice and ciphertext
// stealing, against `xts-mode`; and the unit lengths that cannot run them,
// refused with the data untouched.

#[test]
fn every_short_lone_unit_every_key_size_every_choice() {
    // Which implementation a 16-31 byte request says it runs on follows the
    // small class (AWS-LC's single-block AES when it is AWS-LC's).
    let mut n = 0;
    for klen in [32usize, 48, 64] {
        for seed in 0..4u64 {
            let key = bytes(klen, 0x1234 + seed * 77 + klen as u64);
            // Each candidate alone, and every split of two.
            let candidates = Mode::Xts.candidates();
            let choices = candidates.iter().flat_map(|&small| {
                candidates.iter().map(move |&large| match small == large {
                    true => Choice::one(small),
                    false => Choice::split(small, large),
                })
            });
            for choice in choices {
                let xts = Xts::with_choice(&key, choice).unwrap();
                for len in [16, 31] {
                    assert_eq!(xts.implementation_for(len), choice.small, "{choice:?}");
                }
                for len in 16..=47usize {
                    for tweak in [
                        [0u8; 16],
                        [0xff; 16],
                        (u64::MAX as u128).to_le_bytes(),
                        bytes(16, seed ^ len as u64).try_into().unwrap(),
                    ] {
                        let pt = bytes(len, seed * 1000 + len as u64);
                        let mut want = pt.clone();
                        xts_reference(&key, tweak, &mut want, true);
                        let mut got = pt.clone();
                        xts.encrypt(&tweak, &mut got).unwrap();
                        assert_eq!(got, want, "enc klen {klen} len {len} {choice:?}");
                        let mut got2 = pt.clone();
                        xts.encrypt_units(&tweak, len, &mut got2).unwrap();
                        assert_eq!(got2, want);
                        xts.decrypt(&tweak, &mut got).unwrap();
                        assert_eq!(got, pt, "dec klen {klen} len {len} {choice:?}");
                        let mut c = want.clone();
                        xts.decrypt_units(&tweak, len, &mut c).unwrap();
                        assert_eq!(c, pt);
                        n += 1;
                    }
                }
            }
        }
    }
    let choices = Mode::Xts.candidates().len().pow(2);
    assert_eq!(n, 3 * 4 * choices * 32 * 4);
}

#[test]
fn short_lengths_with_other_unit_lens_are_refused_untouched() {
    for klen in [32usize, 48, 64] {
        let xts = Xts::new(&bytes(klen, 9)).unwrap();
        for len in 0..=47usize {
            for unit in [0usize, 1, 8, 15, 16, 17, 24, 31, 32, 33, 47, 48, usize::MAX] {
                let mut d = vec![0xa5u8; len];
                let r = xts.encrypt_units(&[3; 16], unit, &mut d);
                let valid = unit >= 16 && len % unit == 0;
                assert_eq!(r.is_ok(), valid, "len {len} unit {unit}");
                if !valid {
                    assert!(matches!(r, Err(Error::DataLength { .. })));
                    assert!(
                        d.iter().all(|&b| b == 0xa5),
                        "touched: len {len} unit {unit}"
                    );
                }
                let r = xts.decrypt_units(&[3; 16], unit, &mut d);
                assert_eq!(r.is_ok(), valid, "dec len {len} unit {unit}");
            }
        }
    }
}
