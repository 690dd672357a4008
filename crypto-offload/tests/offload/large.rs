//! Large CPU requests leave the async worker and split over the cores; the
//! result must be the same as one call to the fallback, at every split.

use crypto_offload::{AeadAlg, CipherAlg, CrcAlg, Offload};
use crypto_offload_fallback as fb;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(131) ^ seed)
        .collect()
}

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(5))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_cpu_requests_match_the_fallback() {
    for cores in [1usize, 2, 3, 8] {
        let offload = Offload::builder().cores(cores).build().unwrap();
        // Sizes around the blocking (256 KiB) and split (1 MiB) thresholds,
        // including ones that do not divide evenly.
        for len in [256 << 10, (1 << 20) + 16 * 7, 3 << 20] {
            let pt = data(len, cores as u8);
            let iv = [0xffu8; 16]; // the CTR counter wraps inside the request

            let ctr = offload
                .cipher(CipherAlg::Aes128Ctr, &key(16))
                .await
                .unwrap();
            let mut want = pt.clone();
            fb::Ctr::new(&key(16))
                .unwrap()
                .apply_keystream(&iv, &mut want)
                .unwrap();
            assert_eq!(
                ctr.encrypt(iv, pt.clone()).await.unwrap(),
                want,
                "ctr {len} {cores}"
            );

            let cbc = offload
                .cipher(CipherAlg::Aes256Cbc, &key(32))
                .await
                .unwrap();
            let blocks = len / 16 * 16;
            let ct = cbc.encrypt(iv, pt[..blocks].to_vec()).await.unwrap();
            let mut want = ct.clone();
            fb::Cbc::new(&key(32))
                .unwrap()
                .decrypt(&iv, &mut want)
                .unwrap();
            assert_eq!(want, pt[..blocks], "cbc reference");
            assert_eq!(
                cbc.decrypt(iv, ct).await.unwrap(),
                pt[..blocks],
                "cbc {len} {cores}"
            );

            let units = len / 4096 * 4096;
            let xts = offload
                .cipher(CipherAlg::Aes256Xts, &key(64))
                .await
                .unwrap()
                .with_data_unit(4096)
                .unwrap();
            let first = (u128::MAX - 5).to_le_bytes(); // the tweak wraps too
            let mut want = pt[..units].to_vec();
            fb::Xts::new(&key(64))
                .unwrap()
                .encrypt_units(&first, 4096, &mut want)
                .unwrap();
            let ct = xts.encrypt(first, pt[..units].to_vec()).await.unwrap();
            assert_eq!(ct, want, "xts {len} {cores}");
            assert_eq!(xts.decrypt(first, ct).await.unwrap(), pt[..units]);

            let gcm = offload.aead(AeadAlg::Aes256Gcm, &key(32)).await.unwrap();
            let sealed = gcm.seal([4; 12], b"aad", pt.clone()).await.unwrap();
            let mut want = pt.clone();
            let tag = fb::Gcm::new(&key(32))
                .unwrap()
                .seal_in_place_detached(&[4; 12], b"aad", &mut want)
                .unwrap();
            want.extend_from_slice(&tag);
            assert_eq!(sealed, want, "gcm {len}");
            assert_eq!(gcm.open([4; 12], b"aad", sealed).await.unwrap(), pt);

            for alg in CrcAlg::ALL {
                let mut crc = offload.crc(alg).await.unwrap();
                crc.update_from_slice(&pt[..100]);
                crc.update(pt[100..].to_vec()).await.unwrap();
                assert_eq!(
                    crc.finalize(),
                    fb::checksum(alg, &pt),
                    "{alg} {len} {cores}"
                );
            }
        }
    }
}

#[test]
fn large_requests_outside_a_runtime_run_inline() {
    let offload = Offload::builder().build().unwrap();
    let pt = data(2 << 20, 9);
    let out = futures::executor::block_on(async {
        let s = offload
            .cipher(CipherAlg::Aes128Ctr, &key(16))
            .await
            .unwrap();
        s.encrypt([0; 16], pt.clone()).await.unwrap()
    });
    let mut want = pt;
    fb::Ctr::new(&key(16))
        .unwrap()
        .apply_keystream(&[0; 16], &mut want)
        .unwrap();
    assert_eq!(out, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcm_split_over_cores_matches_the_fallback_and_still_authenticates() {
    // Long enough that a GCM job leaves the worker and, with 3+ cores, runs
    // on several threads (GHASH combined).
    let len = (16 << 20) + 16 * 5 + 7;
    let pt = data(len, 3);
    let mut want = pt.clone();
    let tag = fb::Gcm::new(&key(16))
        .unwrap()
        .seal_in_place_detached(&[9; 12], b"header", &mut want)
        .unwrap();
    for cores in [2usize, 3, 8] {
        let offload = Offload::builder().cores(cores).build().unwrap();
        let gcm = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
        let (ct, got) = gcm
            .seal_detached([9; 12], b"header", pt.clone())
            .await
            .unwrap();
        assert_eq!(got, tag, "tag, {cores} cores");
        assert!(ct == want, "ciphertext, {cores} cores");
        let back = gcm
            .open_detached([9; 12], b"header", ct.clone(), &tag)
            .await
            .unwrap();
        assert!(back == pt, "open, {cores} cores");
        let mut bad = ct;
        bad[len / 2] ^= 1;
        let (e, buf) = gcm
            .open_detached([9; 12], b"header", bad, &tag)
            .await
            .unwrap_err()
            .into_parts();
        assert!(matches!(e, crypto_offload::Error::Authentication), "{e}");
        assert!(buf.iter().all(|&b| b == 0), "no plaintext released");
    }
}
