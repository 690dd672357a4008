//! Sessions against the fallback primitives they wrap (which are themselves
//! checked against RustCrypto's reference crates and aws-lc-rs in the
//! fallback's own tests): random algorithms, keys, IVs, lengths up to 64 KiB,
//! both buffer types, the inline CPU path and a `dyn Backend` path.

use crate::common;

use bytes::BytesMut;
use crypto_offload::{AeadAlg, CipherAlg, CipherMode, CrcAlg, Offload};
use crypto_offload_fallback as fb;
use futures::FutureExt;
use proptest::prelude::*;

fn block<F: std::future::Future>(f: F) -> F::Output {
    // Both paths here complete without waiting on anything.
    f.now_or_never().expect("completes in one poll")
}

fn offloads() -> [Offload; 2] {
    [
        // Not `block`: discovery takes a process-wide lock (VFIO devices
        // are shared) and waits for it while another test discovers.
        futures::executor::block_on(Offload::discover()).unwrap(),
        Offload::builder()
            .backend(common::Engine::new("engine").shared())
            .pin("engine")
            .build()
            .unwrap(),
    ]
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..100, 2 => 0usize..5000, 1 => 0usize..65537]
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn cipher_sessions_match_the_primitive(alg in prop::sample::select(CipherAlg::ALL.to_vec()), seed: u8, iv: [u8; 16], len in len(), unit in prop_oneof![Just(None), Just(Some(512usize)), (16usize..100).prop_map(Some)]) {
        let mut key = bytes(alg.key_len(), seed);
        key[0] ^= 0xff; // XTS halves always differ
        let len = match alg.mode() {
            CipherMode::Cbc => len / 16 * 16,
            CipherMode::Xts => match unit { Some(u) => (len / u).max(1) * u, None => len.max(16) },
            _ => len,
        };
        let unit = if alg.mode() == CipherMode::Xts { unit } else { None };
        let pt = bytes(len, seed ^ 0x55);
        let mut want = pt.clone();
        match alg.mode() {
            CipherMode::Cbc => fb::Cbc::new(&key).unwrap().encrypt(&iv, &mut want).unwrap(),
            CipherMode::Ctr => fb::Ctr::new(&key).unwrap().apply_keystream(&iv, &mut want).unwrap(),
            _ => fb::Xts::new(&key).unwrap().encrypt_units(&iv, unit.unwrap_or(len), &mut want).unwrap(),
        }
        for offload in offloads() {
            let mut s = block(offload.cipher(alg, &key)).unwrap();
            if let Some(u) = unit {
                s = s.with_data_unit(u).unwrap();
            }
            let ct = block(s.encrypt(iv, pt.clone())).unwrap();
            prop_assert_eq!(&ct, &want, "{} on {:?}", alg, s);
            let back = block(s.decrypt(iv, BytesMut::from(&ct[..]))).unwrap();
            prop_assert_eq!(&back[..], &pt[..]);
        }
    }

    #[test]
    fn aead_sessions_match_the_primitive(alg in prop::sample::select(AeadAlg::ALL.to_vec()), seed: u8, nonce: [u8; 12], aad_len in 0usize..64, len in len()) {
        let key = bytes(alg.key_len(), seed);
        let aad = bytes(aad_len, seed ^ 1);
        let pt = bytes(len, seed ^ 2);
        let mut want = pt.clone();
        let tag = fb::Gcm::new(&key).unwrap().seal_in_place_detached(&nonce, &aad, &mut want).unwrap();
        want.extend_from_slice(&tag);
        for offload in offloads() {
            let s = block(offload.aead(alg, &key)).unwrap();
            let sealed = block(s.seal(nonce, &aad, BytesMut::from(&pt[..]))).unwrap();
            prop_assert_eq!(&sealed[..], &want[..]);
            let opened = block(s.open(nonce, &aad, sealed.to_vec())).unwrap();
            prop_assert_eq!(&opened, &pt);
        }
    }

    #[test]
    fn crc_sessions_match_one_shot_checksums(alg in prop::sample::select(CrcAlg::ALL.to_vec()), len in len(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..5), seed: u8) {
        let data = bytes(len, seed);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(len + 1)).collect();
        cuts.sort_unstable();
        cuts.push(len);
        for offload in offloads() {
            let mut s = block(offload.crc(alg)).unwrap();
            let mut at = 0;
            for (i, &c) in cuts.iter().enumerate() {
                if i % 2 == 0 {
                    block(s.update(data[at..c].to_vec())).unwrap();
                } else {
                    s.update_from_slice(&data[at..c]);
                }
                at = c;
            }
            prop_assert_eq!(s.finalize(), fb::checksum(alg, &data), "{} on {:?}", alg, s);
        }
    }
}
