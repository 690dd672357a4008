//! The bad-input table: every public entry point given every kind of bad
//! input, on the CPU alone and pinned to a third-party engine (the `dyn`
//! backend path; it takes at most [`ENGINE_MAX`] bytes a request). Each row
//! must give its documented typed error — with the buffer handed back as it
//! went in, or wiped where an AEAD open failed — or its documented success,
//! never a panic. Every failing row is reported, not just the first.

use crate::common;

use std::fmt::Display;

use crypto_offload::{
    AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg, Error, LengthRule, Offload, RequestError,
};

/// The largest request the engine target takes.
const ENGINE_MAX: usize = 4096;

/// Key lengths no algorithm takes, and the valid ones of the others.
const KEY_LENGTHS: [usize; 10] = [0, 15, 16, 17, 24, 32, 33, 48, 64, 65];

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(3))
        .collect()
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 1) as u8).collect()
}

/// The rows run and the ones that failed, reported together at the end.
#[derive(Default)]
struct Table {
    rows: usize,
    failures: Vec<String>,
}

impl Table {
    fn row(&mut self, what: impl Display, ok: bool, got: impl Display) {
        self.rows += 1;
        if !ok {
            self.failures.push(format!("{what}: got {got}"));
        }
    }

    /// A refused request: the error matches and the buffer came back as
    /// it went in.
    fn refused(
        &mut self,
        what: impl Display,
        r: Result<Vec<u8>, RequestError<Vec<u8>>>,
        sent: &[u8],
        expected: impl Fn(&Error) -> bool,
    ) {
        match r {
            Ok(out) => self.row(what, false, format!("Ok({} bytes)", out.len())),
            Err(e) => {
                let (e, buf) = e.into_parts();
                let ok = expected(&e) && buf == sent;
                self.row(what, ok, format!("{e} (buffer intact: {})", buf == sent));
            }
        }
    }

    /// A failed AEAD open: the opaque error, and the buffer wiped.
    fn unauthentic(
        &mut self,
        what: impl Display,
        r: Result<Vec<u8>, RequestError<Vec<u8>>>,
        len: usize,
    ) {
        match r {
            Ok(out) => self.row(
                what,
                false,
                format!("plaintext released ({} bytes)", out.len()),
            ),
            Err(e) => {
                let (e, buf) = e.into_parts();
                let wiped = buf == vec![0u8; len];
                let ok = matches!(e, Error::Authentication)
                    && e.to_string() == "authentication failed"
                    && wiped;
                let n = buf.len();
                self.row(what, ok, format!("{e}, {n} bytes back, wiped: {wiped}"));
            }
        }
    }

    fn finish(self) {
        eprintln!("{} rows", self.rows);
        assert!(
            self.failures.is_empty(),
            "{} of {} rows failed:\n{}",
            self.failures.len(),
            self.rows,
            self.failures.join("\n")
        );
    }
}

/// The CPU alone, and pinned to an engine that takes at most
/// [`ENGINE_MAX`] bytes a request.
async fn targets() -> Vec<(&'static str, Offload)> {
    let engine = Offload::builder()
        .backend(common::Engine::new("engine").at_most(ENGINE_MAX).shared())
        .pin("engine")
        .build()
        .unwrap();
    vec![
        ("cpu", Offload::discover().await.unwrap()),
        ("engine", engine),
    ]
}

#[tokio::test]
async fn keys_of_every_wrong_length_and_weak_xts_keys() {
    let mut t = Table::default();
    for (target, offload) in targets().await {
        for alg in CipherAlg::ALL {
            for len in KEY_LENGTHS {
                let r = offload.cipher(alg, &key(len)).await;
                let what = format!("{target} {alg} key of {len} bytes");
                match r {
                    Ok(_) => t.row(what, len == alg.key_len(), "Ok"),
                    Err(e) => t.row(
                        what,
                        len != alg.key_len()
                            && matches!(e, Error::KeyLength { len: l, expected, .. }
                                if l == len && expected == alg.key_len()),
                        e,
                    ),
                }
            }
            if alg.mode() == CipherMode::Xts {
                let half = key(alg.key_len() / 2);
                let e = offload.cipher(alg, &[half.clone(), half].concat()).await;
                let ok =
                    matches!(&e, Err(Error::WeakKey { alg: a }) if *a == Algorithm::Cipher(alg));
                t.row(format!("{target} {alg} equal halves"), ok, ok_or_err(e));
            }
        }
        for alg in AeadAlg::ALL {
            for len in KEY_LENGTHS {
                let r = offload.aead(alg, &key(len)).await;
                let what = format!("{target} {alg} key of {len} bytes");
                match r {
                    Ok(_) => t.row(what, len == alg.key_len(), "Ok"),
                    Err(e) => t.row(
                        what,
                        len != alg.key_len()
                            && matches!(e, Error::KeyLength { len: l, expected, .. }
                                if l == len && expected == alg.key_len()),
                        e,
                    ),
                }
            }
        }
    }
    t.finish();
}

fn ok_or_err<T>(r: Result<T, Error>) -> String {
    match r {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn cipher_requests_of_every_bad_shape_in_both_directions() {
    let mut t = Table::default();
    let reference = Offload::discover().await.unwrap();
    for (target, offload) in targets().await {
        for alg in CipherAlg::ALL {
            let k = key(alg.key_len());
            let s = offload.cipher(alg, &k).await.unwrap();
            let cpu = reference.cipher(alg, &k).await.unwrap();
            let mode = alg.mode();
            for encrypt in [true, false] {
                let dir = if encrypt { "encrypt" } else { "decrypt" };
                let run = |iv: Vec<u8>, buf: Vec<u8>| {
                    let s = &s;
                    async move {
                        if encrypt {
                            s.encrypt(&iv, buf).await
                        } else {
                            s.decrypt(&iv, buf).await
                        }
                    }
                };
                // IVs, counters and tweaks are 16 bytes.
                for iv in [0usize, 8, 15, 17, 32] {
                    let sent = data(32);
                    let r = run(vec![0; iv], sent.clone()).await;
                    t.refused(
                        format!("{target} {alg} {dir} IV of {iv} bytes"),
                        r,
                        &sent,
                        |e| matches!(e, Error::IvLength { len, expected: 16, .. } if *len == iv),
                    );
                }
                // Lengths: what each mode refuses, and what it takes.
                for len in [0usize, 1, 15, 16, 17, 31, 4096, 2 * ENGINE_MAX + 16] {
                    let rule = match mode {
                        CipherMode::Cbc if len % 16 != 0 => Some(LengthRule::MultipleOfBlock),
                        CipherMode::Xts if len < 16 => Some(LengthRule::AtLeastOneBlock),
                        _ => None,
                    };
                    let sent = data(len);
                    let r = run(vec![3; 16], sent.clone()).await;
                    let what = format!("{target} {alg} {dir} {len} bytes");
                    match rule {
                        Some(rule) => t.refused(what, r, &sent, |e| {
                            matches!(e, Error::DataLength { len: l, rule: r, .. } if *l == len && *r == rule)
                        }),
                        // A documented success: what the CPU computes (a
                        // request above the engine's maximum runs on the
                        // CPU, never fails).
                        None => {
                            let want = if encrypt {
                                cpu.encrypt([3; 16], sent).await
                            } else {
                                cpu.decrypt([3; 16], sent).await
                            };
                            let got = r.map_err(|e| Error::from(e).to_string());
                            let want = want.map_err(|e| Error::from(e).to_string());
                            t.row(what, got.is_ok() && got == want, format!("{got:?}"));
                        }
                    }
                }
            }
            // Data units: XTS only, at least a block, and requests whole
            // units.
            let units = offload.cipher(alg, &k).await.unwrap().with_data_unit(512);
            if mode == CipherMode::Xts {
                let units = units.unwrap();
                let sent = data(600);
                let r = units.encrypt([0; 16], sent.clone()).await;
                t.refused(
                    format!("{target} {alg} 600 bytes in 512-byte units"),
                    r,
                    &sent,
                    |e| {
                        matches!(
                            e,
                            Error::DataLength {
                                rule: LengthRule::MultipleOfDataUnit(512),
                                ..
                            }
                        )
                    },
                );
                for unit in [0usize, 15] {
                    let small = offload.cipher(alg, &k).await.unwrap().with_data_unit(unit);
                    let ok = matches!(small, Err(Error::DataLength { len, .. }) if len == unit);
                    t.row(
                        format!("{target} {alg} {unit}-byte data unit"),
                        ok,
                        ok_or_err(small),
                    );
                }
            } else {
                let ok = matches!(units, Err(Error::DataLength { .. }));
                t.row(format!("{target} {alg} data units"), ok, ok_or_err(units));
            }
        }
    }
    t.finish();
}

#[tokio::test]
async fn aead_nonces_tags_tampering_and_aad_only_messages() {
    let mut t = Table::default();
    let reference = Offload::discover().await.unwrap();
    for (target, offload) in targets().await {
        for alg in AeadAlg::ALL {
            let k = key(alg.key_len());
            let g = offload.aead(alg, &k).await.unwrap();
            let cpu = reference.aead(alg, &k).await.unwrap();
            let pt = data(100);
            let (ct, tag) = cpu
                .seal_detached([1; 12], b"aad", pt.clone())
                .await
                .unwrap();
            let combined = [ct.clone(), tag.to_vec()].concat();
            // Nonces are 12 bytes, on all four entry points.
            for n in [0usize, 8, 11, 13, 16] {
                let nonce = vec![1; n];
                let bad =
                    |e: &Error| matches!(e, Error::IvLength { len, expected: 12, .. } if *len == n);
                let what = |f: &str| format!("{target} {alg} {f} nonce of {n} bytes");
                t.refused(
                    what("seal"),
                    g.seal(&nonce, b"", pt.clone()).await,
                    &pt,
                    bad,
                );
                let r = g
                    .seal_detached(&nonce, b"", pt.clone())
                    .await
                    .map(|(b, _)| b);
                t.refused(what("seal_detached"), r, &pt, bad);
                let r = g.open(&nonce, b"aad", combined.clone()).await;
                t.refused(what("open"), r, &combined, bad);
                let r = g.open_detached(&nonce, b"aad", ct.clone(), &tag).await;
                t.refused(what("open_detached"), r, &ct, bad);
            }
            // Tags are 16 bytes; a combined message shorter than a tag has
            // none.
            for n in [0usize, 15, 17] {
                let r = g
                    .open_detached([1; 12], b"aad", ct.clone(), &vec![0; n])
                    .await;
                t.refused(
                    format!("{target} {alg} tag of {n} bytes"),
                    r,
                    &ct,
                    |e| matches!(e, Error::TagLength { len, .. } if *len == n),
                );
            }
            for n in [0usize, 15] {
                let short = data(n);
                let r = g.open([1; 12], b"aad", short.clone()).await;
                t.refused(
                    format!("{target} {alg} open of {n} bytes"),
                    r,
                    &short,
                    |e| matches!(e, Error::TagLength { len, .. } if *len == n),
                );
            }
            // Tampering: no plaintext is released, the buffer is wiped.
            let mut bad_tag = tag;
            bad_tag[15] ^= 0x80;
            let mut bad_ct = ct.clone();
            bad_ct[40] ^= 1;
            let len = ct.len();
            let what = |f: &str| format!("{target} {alg} {f}");
            let r = g.open_detached([1; 12], b"aad", ct.clone(), &bad_tag).await;
            t.unauthentic(what("flipped tag bit"), r, len);
            let r = g.open_detached([1; 12], b"aad", bad_ct.clone(), &tag).await;
            t.unauthentic(what("flipped ciphertext bit"), r, len);
            let r = g.open_detached([1; 12], b"aaD", ct.clone(), &tag).await;
            t.unauthentic(what("other AAD"), r, len);
            let r = g.open_detached([2; 12], b"aad", ct.clone(), &tag).await;
            t.unauthentic(what("other nonce"), r, len);
            let r = g
                .open_detached([1; 12], b"aad", ct[..len - 1].to_vec(), &tag)
                .await;
            t.unauthentic(what("truncated ciphertext"), r, len - 1);
            let r = g.open([1; 12], b"aad", combined[1..].to_vec()).await;
            t.unauthentic(what("combined, first byte cut"), r, len - 1);
            // Documented successes: AAD only, nothing at all, and a message
            // above the engine's maximum (it runs on the CPU).
            for (aad, len) in [
                (&b"only aad"[..], 0usize),
                (b"", 0),
                (b"h", 2 * ENGINE_MAX + 3),
            ] {
                let pt = data(len);
                let sealed = g.seal([4; 12], aad, pt.clone()).await.map_err(Error::from);
                let want = cpu
                    .seal([4; 12], aad, pt.clone())
                    .await
                    .map_err(Error::from);
                let what = format!("{target} {alg} seal {len} bytes, {} of AAD", aad.len());
                let same = matches!((&sealed, &want), (Ok(a), Ok(b)) if a == b);
                t.row(&what, same, format!("{:?}", sealed.as_ref().map(Vec::len)));
                if let Ok(sealed) = sealed {
                    let opened = g.open([4; 12], aad, sealed).await.map_err(Error::from);
                    let ok = matches!(&opened, Ok(o) if *o == pt);
                    t.row(format!("{what}, opened"), ok, ok_or_err(opened));
                }
                // The same, detached.
                let sealed = g
                    .seal_detached([4; 12], aad, pt.clone())
                    .await
                    .map_err(Error::from);
                let want = cpu
                    .seal_detached([4; 12], aad, pt.clone())
                    .await
                    .map_err(Error::from);
                let same = matches!((&sealed, &want), (Ok(a), Ok(b)) if a == b);
                let what = format!("{what}, detached");
                t.row(
                    &what,
                    same,
                    format!("{:?}", sealed.as_ref().map(|s| s.0.len())),
                );
                if let Ok((ct, tag)) = sealed {
                    let opened = g
                        .open_detached([4; 12], aad, ct, &tag)
                        .await
                        .map_err(Error::from);
                    let ok = matches!(&opened, Ok(o) if *o == pt);
                    t.row(format!("{what}, opened"), ok, ok_or_err(opened));
                }
            }
        }
    }
    t.finish();
}

#[tokio::test]
async fn crc_mismatches_empty_and_large_updates() {
    let mut t = Table::default();
    let reference = Offload::discover().await.unwrap();
    for (target, offload) in targets().await {
        for alg in CrcAlg::ALL {
            let mut c = offload.crc(alg).await.unwrap();
            let mut cpu = reference.crc(alg).await.unwrap();
            let empty = c.update(Vec::new()).await.map_err(Error::from);
            t.row(
                format!("{target} {alg} empty update"),
                matches!(&empty, Ok(b) if b.is_empty()) && c.is_empty(),
                ok_or_err(empty),
            );
            // Above the engine's maximum: the CPU computes it.
            let big = data(2 * ENGINE_MAX + 5);
            let r = c.update(big.clone()).await.map_err(Error::from);
            cpu.update_from_slice(&big);
            let ok = matches!(&r, Ok(b) if *b == big) && c.finalize() == cpu.finalize();
            t.row(
                format!("{target} {alg} {} bytes", big.len()),
                ok,
                ok_or_err(r),
            );
            let right = c.finalize();
            t.row(
                format!("{target} {alg} verify"),
                c.verify(right).is_ok(),
                "Err",
            );
            let wrong = c.verify(right ^ 1);
            let ok = matches!(wrong, Err(Error::ChecksumMismatch { .. }));
            t.row(
                format!("{target} {alg} verify a wrong CRC"),
                ok,
                ok_or_err(wrong),
            );
            // Borrowed bytes, empty and large; the length; a reset.
            c.update_from_slice(&[]);
            let ok = c.finalize() == right && c.len() == big.len() as u64;
            t.row(format!("{target} {alg} empty slice"), ok, c.len());
            c.update_from_slice(&big);
            cpu.update_from_slice(&big);
            let ok = c.finalize() == cpu.finalize() && c.len() == 2 * big.len() as u64;
            t.row(format!("{target} {alg} large slice"), ok, c.len());
            c.reset();
            let fresh = reference.crc(alg).await.unwrap();
            let ok = c.is_empty() && c.finalize() == fresh.finalize();
            t.row(format!("{target} {alg} reset"), ok, c.len());
            // Combination: an empty second part changes nothing, a 1-byte
            // one gives the whole's CRC, and any length is taken (no panic,
            // no overflow; the result fits the CRC's width).
            let crc = |bytes: &[u8]| crypto_offload_fallback::checksum(alg, bytes);
            let combine = crypto_offload::crc_combine;
            let ok = combine(alg, right, crc(&[]), 0) == right;
            t.row(format!("{alg} combine with an empty part"), ok, "other CRC");
            let whole = data(101);
            let got = combine(alg, crc(&whole[..100]), crc(&whole[100..]), 1);
            t.row(
                format!("{alg} combine, 1-byte part"),
                got == crc(&whole),
                got,
            );
            for len in [u64::from(u32::MAX) + 1, u64::MAX] {
                let got = combine(alg, right, crc(&[7]), len);
                let fits = alg.width() == 64 || got >> alg.width() == 0;
                t.row(format!("{alg} combine, part of {len} bytes"), fits, got);
            }
        }
    }
    t.finish();
}

#[tokio::test]
async fn an_algorithm_the_pinned_backend_lacks_is_refused_at_open() {
    let offload = Offload::builder()
        .backend(
            common::Engine::new("crc-only")
                .only(Algorithm::Crc(CrcAlg::Crc32Iscsi))
                .shared(),
        )
        .pin("crc-only")
        .build()
        .unwrap();
    let mut t = Table::default();
    let unsupported =
        |e: &Error| matches!(e, Error::Unsupported { backend, .. } if backend == "crc-only");
    for alg in CipherAlg::ALL {
        let r = offload.cipher(alg, &key(alg.key_len())).await;
        let ok = r.as_ref().is_err_and(unsupported);
        t.row(format!("crc-only {alg}"), ok, ok_or_err(r));
    }
    for alg in AeadAlg::ALL {
        let r = offload.aead(alg, &key(alg.key_len())).await;
        let ok = r.as_ref().is_err_and(unsupported);
        t.row(format!("crc-only {alg}"), ok, ok_or_err(r));
    }
    for alg in CrcAlg::ALL {
        let r = offload.crc(alg).await;
        let ok = if alg == CrcAlg::Crc32Iscsi {
            r.as_ref().is_ok_and(|c| c.backend_for(4096) == "crc-only")
        } else {
            r.as_ref().is_err_and(unsupported)
        };
        t.row(format!("crc-only {alg}"), ok, ok_or_err(r));
    }
    t.finish();
}

#[tokio::test]
async fn selector_queries_and_builder_settings_at_their_extremes() {
    use crypto_offload::Direction;
    let mut t = Table::default();
    for (target, offload) in targets().await {
        let names: Vec<String> = offload.backends().into_iter().map(|b| b.name).collect();
        let known = |n: &str| names.iter().any(|b| b == n);
        let cbc = offload
            .cipher(CipherAlg::Aes128Cbc, &key(16))
            .await
            .unwrap();
        let gcm = offload.aead(AeadAlg::Aes128Gcm, &key(16)).await.unwrap();
        let c = offload.crc(CrcAlg::Crc32Iscsi).await.unwrap();
        for len in [0usize, 1, usize::MAX] {
            for dir in [Direction::Encrypt, Direction::Decrypt] {
                let b = cbc.backend_for(dir, len);
                t.row(
                    format!("{target} cipher backend_for({dir:?}, {len})"),
                    known(b),
                    b,
                );
                let b = gcm.backend_for(dir, len);
                t.row(
                    format!("{target} aead backend_for({dir:?}, {len})"),
                    known(b),
                    b,
                );
                let e = offload.explain(CipherAlg::Aes256Xts, dir, len);
                let ok = known(&e.choice) && e.len == len && !e.candidates.is_empty();
                t.row(format!("{target} explain({dir:?}, {len})"), ok, &e.choice);
            }
            let b = c.backend_for(len);
            t.row(format!("{target} crc backend_for({len})"), known(b), b);
        }
        for alg in Algorithm::all() {
            // None with the CPU alone; a size or None with an engine.
            let be = offload.break_even(alg, Direction::Encrypt);
            let ok = names.len() > 1 || be.is_none();
            t.row(
                format!("{target} break_even({alg:?})"),
                ok,
                format!("{be:?}"),
            );
        }
    }
    // No cores is one core: requests still run, right.
    let one = Offload::builder().cores(0).build().unwrap();
    let s = one.cipher(CipherAlg::Aes128Ctr, &key(16)).await.unwrap();
    let reference = Offload::builder().build().unwrap();
    let cpu = reference
        .cipher(CipherAlg::Aes128Ctr, &key(16))
        .await
        .unwrap();
    let big = data(1 << 20);
    let got = s.encrypt([3; 16], big.clone()).await.map_err(Error::from);
    let want = cpu.encrypt([3; 16], big).await.unwrap();
    let ok = matches!(&got, Ok(g) if *g == want);
    t.row(
        "cores(0): a 1 MiB request",
        ok,
        ok_or_err(got.map(|g| g.len())),
    );
    t.finish();
}

/// Keys: what holds one wipes it on drop. (Reading freed key storage back
/// is not possible through the API; `Debug` of every key holder is checked
/// in `tests/offload/api.rs`, `debug_output_never_shows_key_bytes`.)
#[test]
fn the_key_type_is_wiped_on_drop() {
    fn wiped_on_drop<T: zeroize::ZeroizeOnDrop + zeroize::Zeroize>() {}
    wiped_on_drop::<crypto_offload::backend::SecretKey>();
}
