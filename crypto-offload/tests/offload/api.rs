//! The session API: what callers can rely on. Every way a request can be
//! refused is in the bad-input table, `tests/offload/bad_input.rs`.

use crate::common;

use bytes::BytesMut;
use crypto_offload::backend::SecretKey;
use crypto_offload::{
    AeadAlg, AeadSession, CipherAlg, CipherSession, CrcAlg, CrcSession, Error, Offload,
    RequestError,
};

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(3))
        .collect()
}

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

#[test]
fn offload_and_sessions_can_cross_tasks() {
    assert_send_sync::<Offload>();
    assert_send_sync::<CipherSession>();
    assert_send_sync::<AeadSession>();
    assert_send_sync::<CrcSession>();
    assert_send_sync::<Error>();
    assert_send::<RequestError<Vec<u8>>>();
}

#[tokio::test]
async fn request_futures_are_send() {
    let offload = Offload::discover().await.unwrap();
    let s = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let g = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let mut c = offload.crc(CrcAlg::Crc32Iscsi).await.unwrap();
    fn is_send<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    is_send(s.encrypt([0; 16], vec![1u8; 8])).await.unwrap();
    is_send(g.seal([0; 12], b"", BytesMut::from(&b"x"[..])))
        .await
        .unwrap();
    is_send(c.update(vec![0u8; 3])).await.unwrap();
    // A session moved into a spawned task keeps working.
    let handle =
        tokio::spawn(async move { s.encrypt([0; 16], vec![0u8; 32]).await.map_err(Error::from) });
    assert_eq!(handle.await.unwrap().unwrap().len(), 32);
}

#[tokio::test]
async fn one_session_serves_many_concurrent_requests() {
    let offload = Offload::discover().await.unwrap();
    let s = std::sync::Arc::new(
        offload
            .cipher(CipherAlg::Aes256Xts, &key(64))
            .await
            .unwrap(),
    );
    let mut tasks = Vec::new();
    for i in 0..64u128 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let pt = vec![i as u8; 4096];
            let ct = s.encrypt(i.to_le_bytes(), pt.clone()).await.unwrap();
            assert_ne!(ct, pt);
            let back = s.decrypt(i.to_le_bytes(), ct).await.unwrap();
            assert_eq!(back, pt);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn xts_data_units_use_consecutive_tweaks() {
    let offload = Offload::discover().await.unwrap();
    let k = key(64);
    let whole = offload
        .cipher(CipherAlg::Aes256Xts, &k)
        .await
        .unwrap()
        .with_data_unit(512)
        .unwrap();
    let single = offload.cipher(CipherAlg::Aes256Xts, &k).await.unwrap();
    let pt: Vec<u8> = (0..8 * 512).map(|i| i as u8).collect();
    let first = u128::MAX - 2; // wraps after 3 units
    let got = whole
        .encrypt(first.to_le_bytes(), pt.clone())
        .await
        .unwrap();
    for (i, unit) in pt.chunks(512).enumerate() {
        let tweak = first.wrapping_add(i as u128).to_le_bytes();
        let want = single.encrypt(tweak, unit.to_vec()).await.unwrap();
        assert_eq!(got[i * 512..(i + 1) * 512], want[..], "unit {i}");
    }
}

#[tokio::test]
async fn aad_only_and_empty_messages_work() {
    let offload = Offload::discover().await.unwrap();
    let g = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let sealed = g.seal([0; 12], b"only aad", Vec::new()).await.unwrap();
    assert_eq!(sealed.len(), 16);
    assert!(
        g.open([0; 12], b"only aad", sealed.clone())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(g.open([0; 12], b"other aad", sealed).await.is_err());
    let ctr = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    assert!(ctr.encrypt([0; 16], Vec::new()).await.unwrap().is_empty());
    let cbc = offload
        .cipher(CipherAlg::Aes128Cbc, &key(16))
        .await
        .unwrap();
    assert!(
        cbc.encrypt([0; 16], BytesMut::new())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn request_errors_convert_for_question_mark_and_hide_the_buffer() {
    async fn use_it(offload: &Offload) -> Result<Vec<u8>, Error> {
        let s = offload.cipher(CipherAlg::Aes128Cbc, &[0u8; 16]).await?;
        Ok(s.encrypt([0; 16], b"secret plaintext!".to_vec()).await?)
    }
    let offload = Offload::discover().await.unwrap();
    let e = use_it(&offload).await.unwrap_err();
    assert!(matches!(e, Error::DataLength { len: 17, .. }));

    let s = offload
        .cipher(CipherAlg::Aes128Cbc, &[0u8; 16])
        .await
        .unwrap();
    let re = s
        .encrypt([0; 16], b"secret plaintext!".to_vec())
        .await
        .unwrap_err();
    let shown = format!("{re:?} {re}");
    assert!(
        !shown.contains("secret") && !shown.contains("115, 101"),
        "{shown}"
    );
}

#[tokio::test]
async fn debug_output_never_shows_key_bytes() {
    let offload = Offload::discover().await.unwrap();
    // Sessions whose contexts an engine holds (the `dyn Backend` path).
    let sim = std::sync::Arc::new(crypto_offload_sim::SimEngine::new(
        crypto_offload_sim::SimConfig::new(
            "sim:keys",
            vec![CipherAlg::Aes256Xts.into(), AeadAlg::Aes256Gcm.into()],
            std::time::Duration::from_micros(10),
            1e9,
        ),
    ));
    let engine = Offload::builder()
        .backend(sim.clone())
        .pin("sim:keys")
        .build()
        .unwrap();
    let k: Vec<u8> = vec![0xa7; 64];
    let mut k2 = k.clone();
    k2[40] = 0x11;
    let shown = [
        format!(
            "{:?}",
            engine.cipher(CipherAlg::Aes256Xts, &k2).await.unwrap()
        ),
        format!(
            "{:?}",
            engine.aead(AeadAlg::Aes256Gcm, &k[..32]).await.unwrap()
        ),
        format!("{engine:?}"),
        format!("{sim:?}"),
        format!("{:?}", SecretKey::new(&k).unwrap()),
        format!(
            "{:?}",
            offload.cipher(CipherAlg::Aes256Xts, &k2).await.unwrap()
        ),
        format!(
            "{:?}",
            offload
                .cipher(CipherAlg::Aes256Cbc, &k[..32])
                .await
                .unwrap()
        ),
        format!(
            "{:?}",
            offload.aead(AeadAlg::Aes256Gcm, &k[..32]).await.unwrap()
        ),
        format!("{offload:?}"),
        // A backend's buffer (plaintext, maybe): its length only.
        format!("{:?}", crypto_offload::backend::IoBuf::from(k.clone())),
        format!(
            "{:?}",
            crypto_offload::backend::Failed::new(
                crypto_offload::backend::BackendError::DeviceGone,
                crypto_offload::backend::IoBuf::from(BytesMut::from(&k[..]))
            )
        ),
    ];
    // The key as `Debug` would print it: a decimal list or hex. Not a
    // bare "167" or "a7": measured figures and lengths are printed too (the
    // fallback's test tripped on a GCM boundary of 1890 B against "90").
    for s in shown {
        let lower = s.to_ascii_lowercase();
        for needle in ["167, 167", "a7a7", "0xa7"] {
            assert!(!lower.contains(needle), "{needle} in {s}");
        }
    }
    assert!(SecretKey::new(&[0u8; 65]).is_none());
}

#[tokio::test]
async fn crc_streams_across_updates_and_verifies() {
    let offload = Offload::discover().await.unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    for alg in CrcAlg::ALL {
        let mut s = offload.crc(alg).await.unwrap();
        let back = s.update(data[..3333].to_vec()).await.unwrap();
        assert_eq!(back, data[..3333]);
        s.update(BytesMut::from(&data[3333..9000])).await.unwrap();
        s.update_from_slice(&data[9000..]);
        let want = crypto_offload_fallback::checksum(alg, &data);
        assert_eq!(s.finalize(), want, "{alg}");
        assert_eq!(s.len(), data.len() as u64);
        s.verify(want).unwrap();
        assert!(matches!(
            s.verify(want ^ 4),
            Err(Error::ChecksumMismatch { .. })
        ));
        s.reset();
        assert!(s.is_empty());
        assert_eq!(s.finalize(), crypto_offload_fallback::checksum(alg, b""));
    }
}

#[tokio::test]
async fn builder_refuses_unknown_and_duplicate_backends() {
    assert!(matches!(
        Offload::builder().pin("nope").build(),
        Err(Error::UnknownBackend(n)) if n == "nope"
    ));
    let r = Offload::builder()
        .backend(common::Engine::new("cpu").shared())
        .build();
    assert!(r.is_err(), "a backend may not take the CPU's name");
    let r = Offload::builder()
        .backend(common::Engine::new("x").shared())
        .backend(common::Engine::new("x").shared())
        .build();
    assert!(r.is_err());
    let o = Offload::builder()
        .backend(common::Engine::new("x").shared())
        .pin("cpu")
        .build()
        .unwrap();
    let names: Vec<_> = o
        .backends()
        .into_iter()
        .map(|b| (b.name, b.pinned))
        .collect();
    assert_eq!(names, [("cpu".to_owned(), true), ("x".to_owned(), false)]);
}

#[tokio::test]
async fn requests_a_backend_fails_complete_on_the_cpu_with_the_same_result() {
    let engine = common::Engine::new("flaky").failing_every(3);
    let requests = engine.requests.clone();
    let flaky = Offload::builder()
        .backend(engine.shared())
        .pin("flaky")
        .build()
        .unwrap();
    let cpu = Offload::discover().await.unwrap();

    let a = flaky.cipher(CipherAlg::Aes256Xts, &key(64)).await.unwrap();
    let b = cpu.cipher(CipherAlg::Aes256Xts, &key(64)).await.unwrap();
    let g = flaky.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let h = cpu.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let mut c = flaky.crc(CrcAlg::Crc64Nvme).await.unwrap();
    let mut d = cpu.crc(CrcAlg::Crc64Nvme).await.unwrap();
    assert_eq!(
        a.backend_for(crypto_offload::Direction::Encrypt, 4096),
        "flaky"
    );
    for i in 0..30u128 {
        let pt: Vec<u8> = (0..(16 + i as usize * 37))
            .map(|j| (j as u128 ^ i) as u8)
            .collect();
        let x = a.encrypt(i.to_le_bytes(), pt.clone()).await.unwrap();
        let y = b.encrypt(i.to_le_bytes(), pt.clone()).await.unwrap();
        assert_eq!(x, y, "request {i}");
        assert_eq!(a.decrypt(i.to_le_bytes(), x).await.unwrap(), pt);
        let nonce = [i as u8; 12];
        let s1 = g.seal(nonce, b"h", pt.clone()).await.unwrap();
        assert_eq!(s1, h.seal(nonce, b"h", pt.clone()).await.unwrap());
        assert_eq!(g.open(nonce, b"h", s1).await.unwrap(), pt);
        c.update(pt.clone()).await.unwrap();
        d.update(pt).await.unwrap();
        assert_eq!(c.finalize(), d.finalize());
    }
    assert!(requests.load(std::sync::atomic::Ordering::Relaxed) >= 150);
}

#[tokio::test]
async fn a_request_shape_a_backend_refuses_replays_without_opening_its_breaker() {
    // An AF_ALG engine refuses a GCM message with more associated data than
    // one operation takes: that is the request, not a failing device.
    let offload = Offload::builder()
        .backend(
            common::Engine::new("picky")
                .failing_every(2)
                .refusing()
                .shared(),
        )
        .pin("picky")
        .build()
        .unwrap();
    let cpu = Offload::discover().await.unwrap();
    let a = offload
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let b = cpu.cipher(CipherAlg::Aes128Ctr, &key(16)).await.unwrap();
    for i in 0..10u128 {
        let pt = vec![i as u8; 100];
        let x = a.encrypt(i.to_le_bytes(), pt.clone()).await.unwrap();
        assert_eq!(x, b.encrypt(i.to_le_bytes(), pt).await.unwrap());
    }
    let stats = offload.backends()[1].stats;
    assert_eq!(stats.failures, 5);
    assert_eq!(
        stats.breaker_opened, 0,
        "a refused shape opened the breaker"
    );
    assert_eq!(
        a.backend_for(crypto_offload::Direction::Encrypt, 100),
        "picky"
    );
}

#[tokio::test]
async fn an_engine_that_takes_a_unit_per_operation_is_charged_per_unit() {
    // The CPU: 1 ns a byte. The engine: 10 µs an operation, fast per byte,
    // one XTS data unit per operation (as the kernel's xts(aes) through
    // AF_ALG).
    let profile = crypto_offload::Profile::from_toml(
        r#"
[[entry]]
backend = "cpu"
alg = "aes-256-xts"
dir = "encrypt"
fixed_ns = 0.0
per_byte_ns = 1.0
cpu_fixed_ns = 0.0
cpu_per_byte_ns = 1.0
parallelism = 1

[[entry]]
backend = "units"
alg = "aes-256-xts"
dir = "encrypt"
fixed_ns = 10000.0
per_byte_ns = 0.01
cpu_fixed_ns = 100.0
cpu_per_byte_ns = 0.0
parallelism = 1
"#,
    )
    .unwrap();
    let offload = Offload::builder()
        .backend(common::Engine::new("units").per_unit().shared())
        .profile(profile)
        .build()
        .unwrap();
    let enc = crypto_offload::Direction::Encrypt;
    // One 64 KiB unit: 10.7 µs on the engine against 65.5 µs here.
    let whole = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap();
    assert_eq!(whole.backend_for(enc, 65536), "units");
    // 128 sectors of 512 bytes: 128 operations, 1.3 ms on the engine.
    let sectors = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap()
        .with_data_unit(512)
        .unwrap();
    assert_eq!(sectors.backend_for(enc, 65536), "cpu");
    // And the request itself goes where backend_for says.
    let pt = vec![7u8; 65536];
    let got = sectors.encrypt([0; 16], pt.clone()).await.unwrap();
    let cpu = Offload::discover().await.unwrap();
    let reference = cpu
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap()
        .with_data_unit(512)
        .unwrap();
    assert_eq!(got, reference.encrypt([0; 16], pt).await.unwrap());
    assert_eq!(offload.backends()[1].stats.requests, 0);
}

#[tokio::test]
async fn lengths_an_engine_cannot_take_go_to_the_cpu_not_to_a_failure() {
    // Pinned to an engine that takes only whole blocks (a virtio-crypto
    // device has no XTS ciphertext stealing).
    let engine = common::Engine::new("blocks").multiple_of(16);
    let requests = engine.requests.clone();
    let offload = Offload::builder()
        .backend(engine.shared())
        .pin("blocks")
        .build()
        .unwrap();
    let xts = offload
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap();
    let enc = crypto_offload::Direction::Encrypt;
    assert_eq!(xts.backend_for(enc, 4096), "blocks");
    assert_eq!(xts.backend_for(enc, 4100), "cpu");
    let why = offload.explain(CipherAlg::Aes256Xts, enc, 4100);
    let blocks = why
        .candidates
        .iter()
        .find(|c| c.backend == "blocks")
        .unwrap();
    assert_eq!(
        blocks.excluded.as_deref(),
        Some("takes only multiples of 16 bytes")
    );
    let sealed = xts.encrypt([1; 16], vec![5u8; 4100]).await.unwrap();
    let cpu = Offload::discover().await.unwrap();
    let want = cpu
        .cipher(CipherAlg::Aes256Xts, &key(64))
        .await
        .unwrap()
        .encrypt([1; 16], vec![5u8; 4100])
        .await
        .unwrap();
    assert_eq!(sealed, want);
    assert_eq!(requests.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(offload.backends()[1].stats.failures, 0);
}

/// The CPU implementation of each mode is measured once and saved with
/// the profile; a profile loaded elsewhere gives it (no measurement), a
/// forced implementation overrides both, and a name this build lacks
/// leaves the mode measured. GCM sealed under each agrees.
#[tokio::test]
async fn the_cpu_choice_is_measured_saved_and_loaded_with_the_profile() {
    use crypto_offload::cpu::ChoiceSource;
    use crypto_offload::cpu_choice::{Choice, Mode};
    use crypto_offload::{Implementation, Profile};

    let measured = Offload::builder().build().unwrap();
    let (choice, source) = measured.cpu_choice(Mode::Gcm);
    assert_eq!(source, ChoiceSource::Measured);
    assert_eq!(choice, crypto_offload::cpu_choice::measured(Mode::Gcm));
    let text = measured.profile().to_toml().unwrap();
    assert!(text.contains("[[cpu_implementation]]"), "{text}");
    let saved = Profile::from_toml(&text).unwrap();
    assert_eq!(saved, measured.profile());

    // Every chosen mode is saved.
    assert_eq!(saved.cpu_implementations.len(), Mode::ALL.len());

    // Loaded: given, whatever this process would measure.
    let other = |mode: Mode| Choice {
        small: Implementation::RustCrypto,
        large: *mode.candidates().last().unwrap(),
        small_max: 1000,
    };
    let mut given = saved.clone();
    given.cpu_implementations = Mode::ALL
        .into_iter()
        .map(|mode| crypto_offload::CpuImplementation::new(mode, other(mode)))
        .collect();
    let loaded = Offload::builder().profile(given.clone()).build().unwrap();
    for mode in Mode::ALL {
        assert_eq!(loaded.cpu_choice(mode), (other(mode), ChoiceSource::Given));
    }
    assert_eq!(
        loaded.profile().cpu_implementations,
        given.cpu_implementations
    );
    // A profile from before CBC decryption was chosen apart (only `cbc`):
    // decryption takes the same choice, given, not measured.
    let mut old = saved.clone();
    old.cpu_implementations
        .retain(|c| c.choice().is_some_and(|(m, _)| m != Mode::CbcDecrypt));
    let cbc = other(Mode::Cbc);
    for c in &mut old.cpu_implementations {
        if c.choice().is_some_and(|(m, _)| m == Mode::Cbc) {
            *c = crypto_offload::CpuImplementation::new(Mode::Cbc, cbc);
        }
    }
    let loaded_old = Offload::builder().profile(old).build().unwrap();
    assert_eq!(
        loaded_old.cpu_choice(Mode::CbcDecrypt),
        (cbc, ChoiceSource::Given)
    );
    // An explicit choice beats the profile's, whichever is set first.
    let mine = Choice::one(Implementation::RustCrypto);
    let explicit = Offload::builder()
        .cpu_choice(Mode::Gcm, mine)
        .profile(given.clone())
        .build()
        .unwrap();
    assert_eq!(explicit.cpu_choice(Mode::Gcm), (mine, ChoiceSource::Given));
    // Forced beats the profile.
    let forced = Offload::builder()
        .profile(given)
        .cpu_implementation(Implementation::RustCrypto)
        .build()
        .unwrap();
    assert_eq!(
        forced.cpu_choice(Mode::Gcm),
        (
            Choice::one(Implementation::RustCrypto),
            ChoiceSource::Forced
        )
    );
    // A name this build lacks: measured.
    let unknown = Profile::from_toml(
        "[[cpu_implementation]]\nmode = \"gcm\"\nsmall = \"no-such\"\nlarge = \"ring\"\n",
    )
    .unwrap();
    let fresh = Offload::builder().profile(unknown).build().unwrap();
    assert_eq!(fresh.cpu_choice(Mode::Gcm).1, ChoiceSource::Measured);

    // The same bytes whichever runs, on both sides of the size classes.
    let k = key(32);
    for len in [0usize, 100, crypto_offload::cpu_choice::SMALL_MAX + 1, 5000] {
        let mut sealed = Vec::new();
        for o in [&measured, &loaded, &forced] {
            let s = o.aead(AeadAlg::Aes256Gcm, &k).await.unwrap();
            sealed.push(s.seal([9; 12], b"aad", vec![7u8; len]).await.unwrap());
        }
        assert!(sealed.windows(2).all(|w| w[0] == w[1]), "len {len}");
    }
    let k = key(64);
    for len in [16usize, 100, 512, 4096, 5000] {
        let mut sealed = Vec::new();
        for o in [&measured, &loaded, &forced] {
            let s = o.cipher(CipherAlg::Aes256Xts, &k).await.unwrap();
            sealed.push(s.encrypt([3; 16], vec![7u8; len]).await.unwrap());
        }
        assert!(sealed.windows(2).all(|w| w[0] == w[1]), "XTS len {len}");
    }
}

/// A server that lives in `io::Result` uses `?` on sessions and requests:
/// the kind says what happened, and the crate's error is inside.
#[tokio::test]
async fn errors_convert_into_io_errors_with_their_kind() {
    use std::io::ErrorKind;

    async fn open_cipher(offload: &Offload, key: &[u8]) -> std::io::Result<CipherSession> {
        Ok(offload.cipher(CipherAlg::Aes128Cbc, key).await?)
    }
    async fn open_sealed(s: &AeadSession, msg: Vec<u8>) -> std::io::Result<Vec<u8>> {
        Ok(s.open([0; 12], b"", msg).await?)
    }

    let offload = Offload::discover().await.unwrap();
    let e = open_cipher(&offload, &key(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<Error>());
    assert!(
        matches!(inner, Some(Error::KeyLength { len: 5, .. })),
        "{e:?}"
    );

    let s = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
    let mut sealed = s.seal([0; 12], b"", vec![7u8; 40]).await.unwrap();
    sealed[3] ^= 1;
    let e = open_sealed(&s, sealed).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    assert_eq!(e.to_string(), "authentication failed");

    let e: std::io::Error = Error::ChecksumMismatch {
        expected: 1,
        computed: 2,
    }
    .into();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    let e: std::io::Error = Error::UnknownBackend("x".into()).into();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);

    // A backend's OS error is not the caller's: EINTR inside a driver must
    // not read as `Interrupted` (which `write_all` retries), nor a driver's
    // EINVAL as the caller's bad input; the errno stays in the chain.
    use crypto_offload::backend::BackendError;
    for (errno, kind) in [
        (4, ErrorKind::Other),  // EINTR
        (11, ErrorKind::Other), // EAGAIN
        (22, ErrorKind::Other), // EINVAL
        (110, ErrorKind::TimedOut),
    ] {
        let e: std::io::Error = Error::Backend {
            backend: "engine".into(),
            source: BackendError::Io {
                op: "sendmsg",
                source: std::io::Error::from_raw_os_error(errno),
            },
        }
        .into();
        assert_eq!(e.kind(), kind, "errno {errno}");
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        let mut found = None;
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                found = found.or(io.raw_os_error());
            }
            source = s.source();
        }
        assert_eq!(found, Some(errno), "the errno is kept");
    }
}

/// `discover()?` works where errors are boxed: `Unavailable` is an error.
#[cfg(all(feature = "af-alg", target_os = "linux"))]
#[test]
fn engine_discovery_errors_are_errors() {
    fn discover() -> Result<usize, Box<dyn std::error::Error>> {
        Ok(crypto_offload::af_alg::AfAlgBackend::discover()?.len())
    }
    // Either outcome is fine here (the host may have no AF_ALG); what is
    // tested is that `?` compiles and the reason prints.
    if let Err(e) = discover() {
        assert!(!e.to_string().is_empty());
    }
}

/// `explain` says what is true of the backend that runs the request: the
/// CPU alone is always eligible, a pinned engine is pinned — neither is
/// "excluded" while chosen.
#[tokio::test]
async fn explain_never_calls_the_chosen_backend_excluded() {
    use crypto_offload::Direction;
    let cpu_only = Offload::builder().build().unwrap();
    let e = cpu_only.explain(CipherAlg::Aes128Cbc, Direction::Encrypt, 4096);
    assert_eq!(e.choice, "cpu");
    let cpu = &e.candidates[0];
    assert_eq!(cpu.excluded, None, "{e}");
    assert!(e.to_string().contains("always eligible"), "{e}");
    assert!(!e.to_string().contains("excluded"), "{e}");

    let pinned = Offload::builder()
        .backend(common::Engine::new("engine").shared())
        .pin("engine")
        .build()
        .unwrap();
    let e = pinned.explain(CipherAlg::Aes128Cbc, Direction::Encrypt, 4096);
    assert_eq!(e.choice, "engine");
    let engine = e.candidates.iter().find(|c| c.backend == "engine").unwrap();
    assert_eq!(engine.excluded, None, "{e}");
    assert!(engine.note.as_deref().unwrap().starts_with("pinned"), "{e}");
    let cpu = e.candidates.iter().find(|c| c.backend == "cpu").unwrap();
    assert_eq!(
        cpu.excluded.as_deref(),
        Some("sessions are pinned to engine"),
        "{e}"
    );

    // Pinned, but the request is larger than the engine takes: the CPU
    // runs it, and is not "excluded" for the pin.
    let small = Offload::builder()
        .backend(common::Engine::new("small").at_most(1024).shared())
        .pin("small")
        .build()
        .unwrap();
    let e = small.explain(CipherAlg::Aes128Cbc, Direction::Encrypt, 4096);
    assert_eq!(e.choice, "cpu", "{e}");
    let cpu = e.candidates.iter().find(|c| c.backend == "cpu").unwrap();
    assert_eq!(cpu.excluded, None, "{e}");
    assert!(
        cpu.note
            .as_deref()
            .unwrap()
            .contains("pinned backend cannot take"),
        "{e}"
    );
    let engine = e.candidates.iter().find(|c| c.backend == "small").unwrap();
    assert!(
        engine.excluded.as_deref().unwrap().contains("at most 1024"),
        "{e}"
    );
}

/// One CRC session shared by many tasks: `checksum(&self)` one-shots, more
/// in flight than a pinned engine's ring holds (4 queues of 2 slots, 256
/// requests), a quarter of them failed by the engine and completed on the
/// CPU. Every result matches the CRC computed directly; the session's
/// running CRC is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_crc_session_serves_concurrent_one_shots_past_the_engines_ring() {
    use crypto_offload::Algorithm;
    use crypto_offload_sim::{SimConfig, SimEngine, SimFaults, SimTimer};
    use std::sync::Arc;
    use std::time::Duration;

    for alg in [CrcAlg::CRC32C, CrcAlg::Crc64Nvme] {
        let mut c = SimConfig::new(
            "ring",
            vec![Algorithm::Crc(alg)],
            Duration::from_micros(50),
            4e9,
        );
        c.timer = SimTimer::Tokio;
        c.queues = 4;
        c.queue_depth = 2;
        c.faults = SimFaults {
            error_rate: 0.25,
            seed: 7,
            ..SimFaults::default()
        };
        let sim = Arc::new(SimEngine::new(c));
        let offload = Offload::builder()
            .backend(sim.clone())
            .pin("ring")
            .build()
            .unwrap();
        let mut session = offload.crc(alg).await.unwrap();
        session.update_from_slice(b"running");
        let running = session.finalize();
        let session = Arc::new(session);
        let tasks: Vec<_> = (0..256usize)
            .map(|i| {
                let s = session.clone();
                tokio::spawn(async move {
                    let data: Vec<u8> = (0..i * 37 + 1).map(|j| (j * 7 + i) as u8).collect();
                    let want = crypto_offload_fallback::checksum(alg, &data);
                    let (back, crc) = s.checksum(data.clone()).await.unwrap();
                    assert_eq!(back, data, "{alg} request {i}: buffer changed");
                    assert_eq!(crc, want, "{alg} request {i}");
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(session.finalize(), running, "{alg}: running CRC changed");
        let stats = offload
            .backends()
            .into_iter()
            .find(|b| b.name == "ring")
            .unwrap()
            .stats;
        assert!(stats.requests > 0 && stats.failures > 0, "{alg}: {stats:?}");
    }
}

/// `Offload::discovery` says, per kind of engine, whether it was looked
/// for and what came of it — here (no AF_ALG on the build hosts, VFIO off
/// in this build unless `--all-features`) and in the guest alike.
#[tokio::test]
async fn discovery_says_what_it_looked_for_and_what_joined() {
    use crypto_offload::{BackendKind, SearchOutcome};
    assert!(Offload::builder().build().unwrap().discovery().is_empty());
    let offload = Offload::discover().await.unwrap();
    let d = offload.discovery();
    assert_eq!(
        d.iter().map(|s| s.kind).collect::<Vec<_>>(),
        ["AF_ALG", "VFIO"]
    );
    for (search, kind, compiled) in [
        (
            &d[0],
            BackendKind::Kernel,
            cfg!(all(feature = "af-alg", target_os = "linux")),
        ),
        (
            &d[1],
            BackendKind::Device,
            cfg!(all(feature = "vfio", target_os = "linux")),
        ),
    ] {
        let joined: Vec<String> = offload
            .backends()
            .into_iter()
            .filter(|b| b.kind == kind)
            .map(|b| b.name)
            .collect();
        let text = search.to_string();
        match &search.outcome {
            SearchOutcome::NotCompiled { feature } => {
                assert!(!compiled, "{text}");
                assert!(
                    text.contains(&format!("feature `{feature}` is off")),
                    "{text}"
                );
                assert!(joined.is_empty());
            }
            SearchOutcome::Unavailable(why) => {
                assert!(compiled && !why.is_empty(), "{text}");
                assert!(text.contains("unavailable: "), "{text}");
                assert!(joined.is_empty());
            }
            SearchOutcome::Found { backends, .. } => {
                assert!(compiled, "{text}");
                assert_eq!(*backends, joined, "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
}
