//! Tests against a real kernel's AF_ALG: every mode and CRC by generic name
//! and by every driver `/proc/crypto` lists for it (`virtio_crypto_aes_cbc`
//! in the guest with the device), differential against the CPU fallback,
//! bad input, a bad tag, large requests and many requests in flight.
//!
//! They run in the QEMU guest (`cargo xtask vm-test`), which sets
//! `CRYPTO_OFFLOAD_GUEST=1`: there AF_ALG must work. On a host without
//! AF_ALG they check instead that its absence is reported as
//! `Error::Unavailable` with a reason — and say that the kernel tests did not
//! run.

use crypto_offload_af_alg::{
    AIO_DEPTH, Aead, Crc, CrcKind, Error, Mechanism, Mode, Skcipher, proc_crypto,
    unavailable_reason,
};
use crypto_offload_fallback as fb;
use proptest::prelude::*;

/// Whether AF_ALG works here; in the guest it must.
fn af_alg() -> bool {
    match crypto_offload_af_alg::probe() {
        Ok(()) => true,
        Err(e) => {
            assert!(
                e.is_unavailable(),
                "probe failed other than unavailable: {e:?}"
            );
            let reason = unavailable_reason(&e);
            assert!(!reason.is_empty());
            assert!(
                std::env::var_os("CRYPTO_OFFLOAD_GUEST").is_none(),
                "AF_ALG must work in the test guest: {reason}"
            );
            eprintln!("AF_ALG unavailable here ({reason}): kernel tests not run");
            false
        }
    }
}

fn in_virtio_guest() -> bool {
    std::env::var("VMTEST_RUN").is_ok_and(|r| r == "virtio")
}

/// `None` (generic name) and every driver the kernel lists for `name`.
fn bindings(name: &str, af_alg_type: &str) -> Vec<Option<String>> {
    let mut out = vec![None];
    for r in proc_crypto::read().unwrap_or_default() {
        if r.name == name && r.af_alg_type() == Some(af_alg_type) && r.selftest_passed {
            out.push(Some(r.driver));
        }
    }
    out
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

/// The fallback's result for one skcipher request.
fn reference(mode: Mode, encrypt: bool, key: &[u8], iv: &[u8], data: &mut [u8]) {
    let iv16: [u8; 16] = if iv.is_empty() {
        [0; 16]
    } else {
        iv.try_into().unwrap()
    };
    match mode {
        Mode::Ecb => {
            let c = fb::Cbc::new(key).unwrap();
            for block in data.chunks_mut(16) {
                if encrypt {
                    c.encrypt(&[0; 16], block).unwrap();
                } else {
                    c.decrypt(&[0; 16], block).unwrap();
                }
            }
        }
        Mode::Cbc => {
            let c = fb::Cbc::new(key).unwrap();
            if encrypt {
                c.encrypt(&iv16, data).unwrap();
            } else {
                c.decrypt(&iv16, data).unwrap();
            }
        }
        Mode::Ctr => fb::Ctr::new(key)
            .unwrap()
            .apply_keystream(&iv16, data)
            .unwrap(),
        Mode::Xts => {
            let x = fb::Xts::new(key).unwrap();
            if encrypt {
                x.encrypt(&iv16, data).unwrap();
            } else {
                x.decrypt(&iv16, data).unwrap();
            }
        }
        _ => unreachable!(),
    }
}

/// `iv` as a big-endian 128-bit counter, `blocks` on.
fn ctr_add(iv: &[u8], blocks: usize) -> Vec<u8> {
    let n = u128::from_be_bytes(iv.try_into().unwrap()).wrapping_add(blocks as u128);
    n.to_be_bytes().to_vec()
}

fn valid_len(mode: Mode, len: usize) -> usize {
    match mode {
        Mode::Ecb | Mode::Cbc => len / 16 * 16,
        Mode::Xts => len.max(16),
        _ => len,
    }
}

fn xts_key(mut key: Vec<u8>) -> Vec<u8> {
    // Distinct halves (the kernel refuses equal ones in FIPS mode, the
    // fallback always).
    let half = key.len() / 2;
    key[half] ^= 0x80;
    if key[..half] == key[half..] {
        key[0] ^= 1;
    }
    key
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn skcipher_matches_the_fallback(
        mode in prop::sample::select(Mode::ALL.to_vec()),
        key_pick in 0usize..3,
        key_seed in any::<[u8; 64]>(),
        iv in any::<[u8; 16]>(),
        len in 0usize..150_000,
        split in 0usize..150_000,
        fill in any::<u8>(),
        splice in any::<bool>(),
        threads in any::<bool>(),
    ) {
        if !af_alg() { return Ok(()); }
        let key_len = mode.key_lens()[key_pick % mode.key_lens().len()];
        let mut key = key_seed[..key_len].to_vec();
        if mode == Mode::Xts { key = xts_key(key); }
        let iv = &iv[..mode.iv_len()];
        let len = valid_len(mode, len);
        let plain: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ fill).collect();
        let rt = rt();
        for driver in bindings(mode.generic_name(), "skcipher") {
            let s = match Skcipher::bind(mode, driver.as_deref(), &key) {
                Ok(s) => s.with_splice_from(splice.then_some(0)).with_mechanism(if threads {
                    Mechanism::Threads
                } else {
                    Mechanism::Aio
                }),
                // A driver that does not take this key size (virtio-crypto
                // devices may not) is no failure of the binding.
                Err(Error::InvalidParameter { .. }) if driver.is_some() => continue,
                Err(e) => panic!("{mode:?} {driver:?}: {e}"),
            };
            let mut want = plain.clone();
            reference(mode, true, &key, iv, &mut want);
            let got = rt.block_on(s.encrypt(iv, plain.clone())).unwrap();
            prop_assert!(got == want, "{:?} {:?} encrypt len {} splice {}", mode, driver, len, splice);
            let back = rt.block_on(s.decrypt(iv, got)).unwrap();
            prop_assert!(back == plain, "{:?} {:?} decrypt len {} splice {}", mode, driver, len, splice);
            // 6.1 splices: no refusal made the transform fall back to copies.
            prop_assert_eq!(s.splice_from(), splice.then_some(0));
            prop_assert_eq!(s.spliced_operations() > 0, splice && len > 0);
            // Two requests split at a block boundary, the second from the
            // first's chained IV, make the whole message's ciphertext.
            if mode != Mode::Xts {
                let at = split.min(len) / 16 * 16;
                let first = rt.block_on(s.encrypt(iv, plain[..at].to_vec())).unwrap();
                let next_iv = match mode {
                    Mode::Cbc if at > 0 => first[at - 16..].to_vec(),
                    Mode::Ctr => ctr_add(iv, at / 16),
                    _ => iv.to_vec(),
                };
                let second = rt.block_on(s.encrypt(&next_iv, plain[at..].to_vec())).unwrap();
                prop_assert!(
                    first == want[..at] && second == want[at..],
                    "{:?} {:?} split {} of {} splice {}", mode, driver, at, len, splice
                );
            }
        }
    }

    #[test]
    fn gcm_matches_the_fallback(
        key_pick in 0usize..3,
        key_seed in any::<[u8; 32]>(),
        nonce in any::<[u8; 12]>(),
        aad in prop::collection::vec(any::<u8>(), 0..64),
        len in 0usize..40_000,
        splice in any::<bool>(),
    ) {
        if !af_alg() { return Ok(()); }
        let key = &key_seed[..[16, 24, 32][key_pick]];
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let rt = rt();
        for driver in bindings("gcm(aes)", "aead") {
            let g = Aead::bind(driver.as_deref(), key).unwrap().with_splice_from(splice.then_some(0));
            let mut want = plain.clone();
            let want_tag = fb::Gcm::new(key).unwrap().seal_in_place_detached(&nonce, &aad, &mut want).unwrap();
            let (ct, tag) = rt.block_on(g.seal(nonce, &aad, plain.clone())).unwrap();
            prop_assert!(ct == want, "{:?} seal len {} splice {}", driver, len, splice);
            prop_assert_eq!(tag, want_tag);
            let back = rt.block_on(g.open(nonce, &aad, ct, tag)).unwrap();
            prop_assert!(back == plain, "{:?} open len {} splice {}", driver, len, splice);
            prop_assert_eq!(g.splice_from(), splice.then_some(0));
            prop_assert_eq!(g.spliced_operations() > 0, splice);
        }
    }

    #[test]
    fn crcs_match_the_fallback(
        data in prop::collection::vec(any::<u8>(), 0..40_000),
        split in 0usize..40_000,
        splice in any::<bool>(),
    ) {
        if !af_alg() { return Ok(()); }
        let rt = rt();
        let at = split.min(data.len());
        for (kind, alg) in [
            (CrcKind::Crc32, fb::CrcAlg::Crc32IsoHdlc),
            (CrcKind::Crc32c, fb::CrcAlg::Crc32Iscsi),
            (CrcKind::Crc64Nvme, fb::CrcAlg::Crc64Nvme),
        ] {
            let c = Crc::bind(kind, None).unwrap().with_splice_from(splice.then_some(0));
            let (_, got) = rt.block_on(c.checksum(data.clone())).unwrap();
            let whole = fb::checksum(alg, &data);
            prop_assert_eq!(got, whole, "{:?} len {} splice {}", kind, data.len(), splice);
            // Two pieces checksummed apart combine into the whole's.
            let (_, a) = rt.block_on(c.checksum(data[..at].to_vec())).unwrap();
            let (_, b) = rt.block_on(c.checksum(data[at..].to_vec())).unwrap();
            let combined = fb::combine(alg, a, b, (data.len() - at) as u64);
            prop_assert_eq!(combined, whole, "{:?} split {} of {}", kind, at, data.len());
            prop_assert_eq!(c.splice_from(), splice.then_some(0));
            prop_assert_eq!(c.spliced_operations() > 0, splice && !data.is_empty());
        }
    }
}

#[test]
fn crc_check_values_by_generic_and_driver_name() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    for (kind, check) in [
        (CrcKind::Crc32, 0xcbf4_3926u64),
        (CrcKind::Crc32c, 0xe306_9283),
        (CrcKind::Crc64Nvme, 0xae8b_1486_0a79_9888),
    ] {
        let mut drivers = vec![None];
        for name in kind.kernel_names() {
            drivers.extend(bindings(name, "hash").into_iter().flatten().map(Some));
        }
        for driver in drivers {
            let c = Crc::bind(kind, driver.as_deref()).unwrap();
            let (_, got) = rt.block_on(c.checksum(b"123456789".to_vec())).unwrap();
            assert_eq!(got, check, "{kind:?} {driver:?}");
        }
    }
}

#[test]
fn a_bad_tag_is_an_authentication_error_and_releases_no_plaintext() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let g = Aead::bind(None, &[3; 16]).unwrap();
    let (ct, mut tag) = rt
        .block_on(g.seal([1; 12], b"hdr", vec![0x55; 1000]))
        .unwrap();
    tag[0] ^= 1;
    let failed = rt.block_on(g.open([1; 12], b"hdr", ct, tag)).unwrap_err();
    assert!(matches!(failed.error, Error::Authentication), "{failed:?}");
    assert_eq!(failed.error.raw_os_error(), Some(libc_ebadmsg()));
    assert_eq!(failed.buf.len(), 1000);
    assert!(failed.buf.iter().all(|&b| b == 0), "plaintext was released");
    // The session still works after the failure.
    let (ct, tag) = rt.block_on(g.seal([2; 12], b"", vec![9; 64])).unwrap();
    assert_eq!(
        rt.block_on(g.open([2; 12], b"", ct, tag)).unwrap(),
        vec![9; 64]
    );
}

fn libc_ebadmsg() -> i32 {
    74
}

#[test]
fn bad_input_is_a_typed_error_with_the_buffer_back() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let cbc = Skcipher::bind(Mode::Cbc, None, &[1; 16]).unwrap();
    let f = rt.block_on(cbc.encrypt(&[0; 16], vec![7; 15])).unwrap_err();
    assert!(matches!(f.error, Error::Invalid { what: "length", .. }));
    assert_eq!(f.buf, vec![7; 15]);
    let f = rt.block_on(cbc.encrypt(&[0; 8], vec![7; 16])).unwrap_err();
    assert!(matches!(
        f.error,
        Error::Invalid {
            what: "IV length",
            ..
        }
    ));
    assert_eq!(f.buf, vec![7; 16]);
    assert!(matches!(
        Skcipher::bind(Mode::Xts, None, &[1; 20]).unwrap_err(),
        Error::Invalid { .. }
    ));
    assert!(matches!(
        Skcipher::bind(Mode::Cbc, Some("no-such-driver"), &[1; 16]).unwrap_err(),
        Error::Unavailable { .. }
    ));
    let long = "x".repeat(200);
    assert!(matches!(
        Skcipher::bind(Mode::Cbc, Some(&long), &[1; 16]).unwrap_err(),
        Error::Invalid { .. }
    ));
    // Empty requests complete without reaching the kernel.
    assert!(
        rt.block_on(cbc.encrypt(&[0; 16], Vec::new()))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn large_requests_split_and_chain_or_say_too_large() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let len = 3 << 20; // beyond any one operation's send buffer
    let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    for mode in [Mode::Cbc, Mode::Ctr, Mode::Ecb] {
        let key = [0x42; 32];
        let iv = &[0xfe; 16][..mode.iv_len()];
        let s = Skcipher::bind(mode, None, &key).unwrap();
        let mut want = plain.clone();
        reference(mode, true, &key, iv, &mut want);
        let got = rt.block_on(s.encrypt(iv, plain.clone())).unwrap();
        assert!(got == want, "{mode:?} 3 MiB differs from the fallback");
        assert!(
            rt.block_on(s.decrypt(iv, got)).unwrap() == plain,
            "{mode:?}"
        );
    }
    let xts = Skcipher::bind(Mode::Xts, None, &xts_key(vec![5; 64])).unwrap();
    let f = rt
        .block_on(xts.encrypt(&[0; 16], plain.clone()))
        .unwrap_err();
    assert!(matches!(f.error, Error::TooLarge { .. }), "{f:?}");
    assert!(f.buf == plain);
    let gcm = Aead::bind(None, &[1; 16]).unwrap();
    let f = rt
        .block_on(gcm.seal([0; 12], b"", plain.clone()))
        .unwrap_err();
    assert!(matches!(f.error, Error::TooLarge { .. }), "{f:?}");
    assert!(f.buf == plain);
}

/// More requests at once than the AIO context holds (`AIO_DEPTH`) on the
/// AIO path: the ones beyond wait for room instead of failing; some are
/// dropped while they wait or while the kernel has them, at random; every
/// one that completes is right, and the sockets all come back. Alone in a
/// child process, for the descriptor count (as the test above).
#[test]
fn more_aio_requests_than_the_context_holds_wait_for_room() {
    if !af_alg() {
        return;
    }
    if !alone("more_aio_requests_than_the_context_holds_wait_for_room") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let key = [0x3cu8; 16];
    // The kernel's best cbc(aes) (virtio_crypto in the virtio guest).
    let s = Skcipher::bind(Mode::Cbc, None, &key)
        .unwrap()
        .with_mechanism(Mechanism::Aio);
    rt.block_on(s.encrypt(&[0; 16], vec![0; 16]))
        .map_err(|f| f.error)
        .unwrap();
    let before = open_fds();
    let n = 2 * AIO_DEPTH + 37;
    let (completed, dropped) = rt.block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut rng = 0x2545_f491_4f6c_dd1d ^ (i as u64 + 1);
                    let plain = vec![i as u8; 16 * (1 + next(&mut rng) as usize % 16)];
                    let iv = [(i >> 3) as u8; 16];
                    let mut want = plain.clone();
                    fb::Cbc::new(&key).unwrap().encrypt(&iv, &mut want).unwrap();
                    if i % 3 == 0 {
                        let wait = std::time::Duration::from_micros(next(&mut rng) % 20_000);
                        match tokio::time::timeout(wait, s.encrypt(&iv, plain)).await {
                            Err(_) => return (0, 1),
                            Ok(got) => assert!(got.map_err(|f| f.error).unwrap() == want),
                        }
                    } else {
                        let got = s.encrypt(&iv, plain).await.map_err(|f| f.error).unwrap();
                        assert!(got == want, "request {i}");
                    }
                    (1, 0)
                })
            })
            .collect();
        tally(tasks).await
    });
    eprintln!("{completed} completed, {dropped} dropped of {n}");
    assert_eq!(completed + dropped, n);
    assert!(completed > AIO_DEPTH);
    drop(s);
    assert!(fds_settled(before) <= before, "sockets leaked");
}

#[test]
fn many_requests_in_flight_on_one_session_and_across_sessions() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let key = [9u8; 16];
    let mut drivers = bindings("cbc(aes)", "skcipher");
    if in_virtio_guest() {
        assert!(
            drivers
                .iter()
                .flatten()
                .any(|d| d == "virtio_crypto_aes_cbc"),
            "the virtio guest must list virtio_crypto_aes_cbc: {drivers:?}"
        );
    }
    drivers.truncate(4);
    for driver in drivers {
        let one = Skcipher::bind(Mode::Cbc, driver.as_deref(), &key).unwrap();
        let sessions: Vec<Skcipher> = (0..8)
            .map(|_| Skcipher::bind(Mode::Cbc, driver.as_deref(), &key).unwrap())
            .collect();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..128usize {
                let s = if i < 64 {
                    one.clone()
                } else {
                    sessions[i % 8].clone()
                };
                tasks.push(tokio::spawn(async move {
                    let plain = vec![i as u8; 16 * (1 + i % 64)];
                    let iv = [i as u8; 16];
                    let got = s.encrypt(&iv, plain.clone()).await.unwrap();
                    let mut want = plain.clone();
                    fb::Cbc::new(&key).unwrap().encrypt(&iv, &mut want).unwrap();
                    assert_eq!(got, want, "request {i}");
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
    }
}

/// A small deterministic generator (xorshift64*) for the drop points.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The process's open file descriptors (each AF_ALG request holds an
/// operation socket until the kernel is done with it).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The open descriptors once they are back to `before`, or after 20 s
/// (dropped requests' sockets close when the kernel is done with them).
fn fds_settled(before: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while open_fds() > before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    open_fds()
}

/// Whether this process should run the test's body: a test that counts
/// the process's descriptors runs alone, in a child process of this test
/// binary (`AF_ALG_TEST_ALONE` set) — the parent runs the child, checks it
/// passed, and returns `false`.
fn alone(name: &str) -> bool {
    const ALONE: &str = "AF_ALG_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .status()
        .unwrap();
    assert!(status.success(), "{name} failed alone: {status}");
    false
}

/// The (completed, dropped) counts of `tasks`, summed.
async fn tally(tasks: Vec<tokio::task::JoinHandle<(usize, usize)>>) -> (usize, usize) {
    let (mut completed, mut dropped) = (0, 0);
    for t in tasks {
        let (c, d) = t.await.unwrap();
        completed += c;
        dropped += d;
    }
    (completed, dropped)
}

/// Under load (eight tasks on two sessions, one on batched native AIO and
/// one on the request threads, and `crypt_aio` on either),
/// each request is dropped at a random point — after
/// its first poll, or at a random deadline of up to 2 ms, before or after
/// the kernel took it — or runs to the end. Those that complete are right;
/// the dropped ones finish in the kernel and free their sockets (the open
/// descriptors return to where they were once the sessions are gone); and
/// the sessions still compute right.
///
/// It runs alone in a child process of this test binary: libtest runs the
/// other tests on parallel threads, and their sockets would come and go in
/// the process-wide count of descriptors.
#[test]
fn requests_dropped_at_random_points_lose_nothing() {
    if !af_alg() {
        return;
    }
    if !alone("requests_dropped_at_random_points_lose_nothing") {
        return;
    }
    // With the timer, for the deadlines.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let key = [0x5au8; 16];
    for driver in bindings("cbc(aes)", "skcipher") {
        // What stays for the process once used (the AIO context, its
        // reaper) is set up first, outside the count.
        let warm = Skcipher::bind(Mode::Cbc, driver.as_deref(), &key).unwrap();
        rt.block_on(warm.crypt_aio(true, &[0; 16], vec![0; 16]))
            .map_err(|f| f.error)
            .unwrap();
        rt.block_on(warm.encrypt(&[0; 16], vec![0; 16]))
            .map_err(|f| f.error)
            .unwrap();
        drop(warm);
        let before = open_fds();
        let sessions = [
            Skcipher::bind(Mode::Cbc, driver.as_deref(), &key)
                .unwrap()
                .with_mechanism(Mechanism::Aio),
            Skcipher::bind(Mode::Cbc, driver.as_deref(), &key)
                .unwrap()
                .with_mechanism(Mechanism::Threads),
        ];
        let (completed, dropped) = rt.block_on(async {
            let tasks: Vec<_> = (0..8u64)
                .map(|t| {
                    let s = sessions[t as usize % 2].clone();
                    tokio::spawn(async move {
                        let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                        let (mut completed, mut dropped) = (0, 0);
                        for i in 0..64u64 {
                            let len = 16 * (1 + next(&mut rng) as usize % 512);
                            let plain: Vec<u8> =
                                (0..len).map(|j| (j as u64 ^ i ^ t) as u8).collect();
                            let iv = [(i ^ t) as u8; 16];
                            let mut want = plain.clone();
                            fb::Cbc::new(&key).unwrap().encrypt(&iv, &mut want).unwrap();
                            let how = next(&mut rng) % 4;
                            let deadline = std::time::Duration::from_micros(next(&mut rng) % 2000);
                            if how == 0 {
                                let f = s.encrypt(&iv, plain);
                                let mut f = std::pin::pin!(f);
                                let waker = std::task::Waker::noop();
                                let _ = f.as_mut().poll(&mut std::task::Context::from_waker(waker));
                                dropped += 1;
                                continue;
                            }
                            let r = if how == 1 {
                                tokio::time::timeout(deadline, s.crypt_aio(true, &iv, plain)).await
                            } else {
                                tokio::time::timeout(deadline, s.encrypt(&iv, plain)).await
                            };
                            match r {
                                Err(_) => dropped += 1,
                                Ok(got) => {
                                    let got = got.map_err(|f| f.error).unwrap();
                                    assert!(got == want, "request {i} of task {t}");
                                    completed += 1;
                                }
                            }
                        }
                        (completed, dropped)
                    })
                })
                .collect();
            let (completed, dropped) = tally(tasks).await;
            for s in &sessions {
                let mut want = vec![3u8; 4096];
                fb::Cbc::new(&key)
                    .unwrap()
                    .encrypt(&[4; 16], &mut want)
                    .unwrap();
                let got = s.encrypt(&[4; 16], vec![3; 4096]).await;
                assert!(got.map_err(|f| f.error).unwrap() == want);
            }
            (completed, dropped)
        });
        eprintln!("{driver:?}: {completed} completed, {dropped} dropped");
        assert!(completed > 0 && dropped > 0);
        drop(sessions);
        assert_eq!(fds_settled(before), before, "{driver:?}: sockets leaked");
    }
}

#[test]
fn discovery_lists_the_bound_implementations() {
    if !af_alg() {
        return;
    }
    let all = proc_crypto::read().unwrap();
    for name in ["cbc(aes)", "ctr(aes)", "xts(aes)", "gcm(aes)", "crc32c"] {
        assert!(
            all.iter()
                .any(|r| r.name == name && r.af_alg_type().is_some()),
            "{name} not in /proc/crypto"
        );
    }
    if in_virtio_guest() {
        let v = all
            .iter()
            .find(|r| r.driver == "virtio_crypto_aes_cbc")
            .expect("virtio_crypto_aes_cbc registered");
        assert!(v.is_async);
        let e = crypto_offload_af_alg::engine::classify(&v.driver);
        assert!(e.hardware);
        assert_eq!(e.short_name, "virtio_crypto");
    }
}

#[test]
fn xts_units_take_consecutive_tweaks_carrying_and_wrapping() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let key = xts_key((0..64).collect());
    let x = Skcipher::bind(Mode::Xts, None, &key).unwrap();
    let reference = fb::Xts::new(&key).unwrap();
    // Low 64 bits about to carry; and the top of the 128-bit range.
    let mut carry = [0xffu8; 16];
    carry[8..].fill(0);
    for first in [carry, [0xff; 16], [3; 16]] {
        let plain: Vec<u8> = (0..8 * 512).map(|i| (i % 251) as u8).collect();
        let mut want = plain.clone();
        reference.encrypt_units(&first, 512, &mut want).unwrap();
        let got = rt
            .block_on(x.crypt_units(true, &first, 512, plain.clone()))
            .unwrap();
        assert!(got == want, "tweak {first:02x?}");
        let back = rt.block_on(x.crypt_units(false, &first, 512, got)).unwrap();
        assert!(back == plain);
    }
    let f = rt
        .block_on(x.crypt_units(true, &[0; 16], 300, vec![0; 1000]))
        .unwrap_err();
    assert!(matches!(f.error, Error::Invalid { .. }));
    assert_eq!(f.buf.len(), 1000);
}

#[test]
fn empty_messages_and_the_largest_one_operation_takes() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let g = Aead::bind(None, &[4; 16]).unwrap();
    let gcm = fb::Gcm::new(&[4; 16]).unwrap();
    let (ct, tag) = rt.block_on(g.seal([5; 12], b"", Vec::new())).unwrap();
    assert!(ct.is_empty());
    assert_eq!(
        tag,
        gcm.seal_in_place_detached(&[5; 12], b"", &mut []).unwrap()
    );
    assert!(
        rt.block_on(g.open([5; 12], b"", ct, tag))
            .unwrap()
            .is_empty()
    );
    // An empty message with a wrong tag is refused too.
    let mut bad = tag;
    bad[15] ^= 0x80;
    let f = rt
        .block_on(g.open([5; 12], b"", Vec::new(), bad))
        .unwrap_err();
    assert!(matches!(f.error, Error::Authentication), "{}", f.error);
    for (kind, alg) in [
        (CrcKind::Crc32, fb::CrcAlg::Crc32IsoHdlc),
        (CrcKind::Crc32c, fb::CrcAlg::Crc32Iscsi),
        (CrcKind::Crc64Nvme, fb::CrcAlg::Crc64Nvme),
    ] {
        let c = Crc::bind(kind, None).unwrap();
        assert_eq!(
            rt.block_on(c.checksum(Vec::new())).unwrap().1,
            fb::checksum(alg, &[])
        );
    }
    // GCM and one XTS unit right at the limit round-trip (the result must
    // fit one read as well as one send).
    let limit = crypto_offload_af_alg::operation_limit();
    let aad = [7u8; 64];
    let len = limit - aad.len() - 16;
    let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut want = plain.clone();
    let want_tag = gcm
        .seal_in_place_detached(&[6; 12], &aad, &mut want)
        .unwrap();
    let (ct, tag) = rt.block_on(g.seal([6; 12], &aad, plain.clone())).unwrap();
    assert!(ct == want && tag == want_tag, "GCM at {len} bytes");
    assert!(rt.block_on(g.open([6; 12], &aad, ct, tag)).unwrap() == plain);
    let key = xts_key(vec![9; 32]);
    let x = Skcipher::bind(Mode::Xts, None, &key).unwrap();
    let unit = limit / 16 * 16;
    let plain = vec![0x5a; unit];
    let mut want = plain.clone();
    fb::Xts::new(&key)
        .unwrap()
        .encrypt(&[1; 16], &mut want)
        .unwrap();
    assert!(
        rt.block_on(x.encrypt(&[1; 16], plain)).unwrap() == want,
        "XTS at {unit}"
    );
}

#[test]
fn aio_requests_match_the_fallback_on_every_cbc_driver() {
    if !af_alg() {
        return;
    }
    let rt = rt();
    let key = [0x31u8; 16];
    for driver in bindings("cbc(aes)", "skcipher") {
        let s = Skcipher::bind(Mode::Cbc, driver.as_deref(), &key).unwrap();
        for len in [16usize, 4096, 65536] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let mut want = plain.clone();
            fb::Cbc::new(&key)
                .unwrap()
                .encrypt(&[2; 16], &mut want)
                .unwrap();
            let got = rt
                .block_on(s.crypt_aio(true, &[2; 16], plain.clone()))
                .map_err(|f| f.error)
                .unwrap();
            assert!(got == want, "{driver:?} {len}");
            let back = rt
                .block_on(s.crypt_aio(false, &[2; 16], got))
                .map_err(|f| f.error)
                .unwrap();
            assert!(back == plain, "{driver:?} {len}");
        }
        // One operation at most; the buffer comes back with the error.
        let big = vec![1u8; crypto_offload_af_alg::operation_limit() + 16];
        let f = rt.block_on(s.crypt_aio(true, &[0; 16], big)).unwrap_err();
        assert!(matches!(f.error, Error::TooLarge { .. }));
        assert!(f.buf.iter().all(|&b| b == 1));
    }
}

/// Where the kernel refuses `vmsplice` or `splice` (a kernel without them,
/// or a seccomp policy: here a filter on the test's own thread returns
/// `ENOSYS`), a request that would splice is copied instead and succeeds,
/// and so do the ones after it.
#[test]
fn a_refused_splice_falls_back_to_copying() {
    if !af_alg() {
        return;
    }
    for (name, refused) in [
        ("vmsplice", nix::libc::SYS_vmsplice),
        ("splice", nix::libc::SYS_splice),
    ] {
        let s = Skcipher::bind(Mode::Cbc, None, &[7; 16])
            .unwrap()
            .with_splice_from(Some(0));
        let plain: Vec<u8> = (0..64 * 1024).map(|i| i as u8).collect();
        let mut want = plain.clone();
        reference(Mode::Cbc, true, &[7; 16], &[1; 16], &mut want);
        std::thread::spawn(move || {
            // Spliced while the kernel lets it.
            let mut data = plain.clone();
            s.crypt_blocking(true, &[1; 16], &mut data).unwrap();
            assert!(data == want);
            assert_eq!(s.spliced_operations(), 1);
            let filter = seccompiler::SeccompFilter::new(
                [(refused, vec![])].into_iter().collect(),
                seccompiler::SeccompAction::Allow,
                seccompiler::SeccompAction::Errno(nix::libc::ENOSYS as u32),
                std::env::consts::ARCH.try_into().unwrap(),
            )
            .unwrap();
            let program: seccompiler::BpfProgram = filter.try_into().unwrap();
            seccompiler::apply_filter(&program).unwrap();
            for _ in 0..3 {
                let mut data = plain.clone();
                s.crypt_blocking(true, &[1; 16], &mut data)
                    .unwrap_or_else(|e| panic!("{name} refused: {e}"));
                assert!(data == want, "{name} refused: wrong ciphertext");
            }
            assert_eq!(s.splice_from(), None, "{name} refused: still splicing");
            assert_eq!(s.spliced_operations(), 1, "{name} refused: spliced anyway");
        })
        .join()
        .unwrap();
    }
}

/// The targets of a process's descriptors, from `/proc/<pid>/fd`.
fn fd_targets(dir: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A program the server execs inherits none of the AF_ALG sockets — the
/// transform's (which holds the key) nor the operation sockets accepted
/// from it (which compute with it). Checked by exec'ing a child that lists
/// its own descriptors.
#[test]
fn a_child_process_inherits_no_af_alg_socket() {
    if !af_alg() {
        return;
    }
    let s = Skcipher::bind(Mode::Cbc, None, &[6; 16]).unwrap();
    // Two requests at once: operation sockets accepted, then kept idle.
    let rt = rt();
    rt.block_on(async {
        let both = futures::future::join_all([
            s.encrypt(&[0; 16], vec![1; 64]),
            s.encrypt(&[1; 16], vec![2; 64]),
        ])
        .await;
        for r in both {
            r.unwrap();
        }
    });
    let ours = fd_targets("/proc/self/fd");
    let sockets = ours.iter().filter(|t| t.starts_with("socket:")).count();
    assert!(
        sockets >= 2,
        "this process holds no AF_ALG sockets: {ours:?}"
    );
    // The guest has busybox; a host, coreutils.
    let (program, args): (&str, &[&str]) = if std::path::Path::new("/bin/busybox").exists() {
        ("/bin/busybox", &["ls", "-l", "/proc/self/fd"])
    } else {
        ("ls", &["-l", "/proc/self/fd"])
    };
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .expect("ls");
    let listing = String::from_utf8_lossy(&out.stdout);
    let inherited: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_once(" -> ").map(|(_, t)| t))
        .collect();
    assert!(!inherited.is_empty(), "no listing: {listing}");
    assert!(
        !inherited.iter().any(|t| t.starts_with("socket:")),
        "a child inherited a socket: {inherited:?} (this process: {sockets} sockets)"
    );
    drop(s);
}
