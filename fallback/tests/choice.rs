//! The implementation chosen per machine: a key on any choice (one
//! implementation for small requests, another for large) gives the same
//! bytes as the reference, and the measurement moves the choice away from
//! an implementation slowed by hiding CPU features from it.

use crypto_offload_fallback::choice::{self, Choice, Mode, SMALL_MAX};
use crypto_offload_fallback::{Cbc, Crc, CrcAlg, Ctr, Gcm, Implementation, Xts, checksum_with};
use proptest::prelude::*;

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 57)) as u8 ^ i as u8)
        .collect()
}

fn reference(key: &[u8], nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> [u8; 16] {
    Gcm::with_implementation(key, Implementation::RustCrypto)
        .unwrap()
        .seal_in_place_detached(nonce, aad, data)
        .unwrap()
}

/// `key` on every (small, large) pair of GCM candidates.
fn splits(key: &[u8]) -> impl Iterator<Item = (Implementation, Implementation, Gcm)> + '_ {
    let all = Mode::Gcm.candidates();
    all.iter().flat_map(move |&small| {
        all.iter().map(move |&large| {
            let gcm = Gcm::with_choice(key, Choice::split(small, large)).unwrap();
            (small, large, gcm)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every pair of candidates as (small, large), at lengths on both
    /// sides of the class boundary: the bytes and tags of RustCrypto's
    /// GCM, and what one seals the other opens. An implementation without
    /// the key size (ring and AES-192) falls back to the default.
    #[test]
    fn a_key_split_across_implementations_is_one_gcm(
        key_len in prop_oneof![Just(16usize), Just(24), Just(32)],
        len in prop_oneof![0usize..2 * SMALL_MAX, SMALL_MAX - 16..SMALL_MAX + 16, 0usize..20_000],
        seed: u64,
    ) {
        let key = bytes(key_len, seed ^ 7);
        let nonce = [seed as u8; 12];
        let aad = bytes(seed as usize % 40, seed);
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        let want_tag = reference(&key, &nonce, &aad, &mut want);
        for (small, large, gcm) in splits(&key) {
            let ran = gcm.implementation_for(len);
            let meant = if len <= SMALL_MAX { small } else { large };
            prop_assert!(ran == meant || key_len == 24, "{:?} ran, {:?} meant", ran, meant);
            let mut got = pt.clone();
            let tag = gcm.seal_in_place_detached(&nonce, &aad, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?}/{:?} ciphertext", small, large);
            prop_assert_eq!(tag, want_tag, "{:?}/{:?} tag", small, large);
            gcm.open_in_place_detached(&nonce, &aad, &mut got, &tag).unwrap();
            prop_assert_eq!(&got, &pt);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The parallel path (CTR and GHASH in chunks) on a split key: its
    /// CTR and hash come from the large requests' implementation, the
    /// hash of a chunk through a seal on the small one's — the same bytes
    /// and tag whichever pair.
    #[test]
    fn a_split_key_on_several_threads_is_one_gcm(
        len in SMALL_MAX + 1..40_000usize,
        threads in 2usize..5,
        seed: u64,
    ) {
        let key = bytes(32, seed ^ 3);
        let nonce = [seed as u8 ^ 0x33; 12];
        let aad = bytes(seed as usize % 70, seed);
        let pt = bytes(len, seed);
        let mut want = pt.clone();
        let want_tag = reference(&key, &nonce, &aad, &mut want);
        for (small, large, gcm) in splits(&key) {
            let mut got = pt.clone();
            let tag = gcm
                .seal_in_place_detached_parallel(&nonce, &aad, &mut got, threads)
                .unwrap();
            prop_assert_eq!(&got, &want, "{:?}/{:?} ciphertext", small, large);
            prop_assert_eq!(tag, want_tag, "{:?}/{:?} tag", small, large);
            gcm.open_in_place_detached_parallel(&nonce, &aad, &mut got, &tag, threads)
                .unwrap();
            prop_assert_eq!(&got, &pt);
        }
    }
}

/// `key` on every (small, large) pair of `mode`'s candidates, parting at
/// `small_max`, made by `make`.
fn pairs<K>(
    mode: Mode,
    key: &[u8],
    small_max: usize,
    make: impl Fn(&[u8], Choice) -> K,
) -> Vec<(Choice, K)> {
    let all = mode.candidates();
    all.iter()
        .flat_map(|&small| {
            all.iter().map(move |&large| Choice {
                small,
                large,
                small_max,
            })
        })
        .map(|c| (c, make(key, c)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// CTR, CBC and XTS on every pair of candidates as (small, large), at
    /// lengths on both sides of the class boundary: the bytes of the
    /// RustCrypto implementation (itself checked against the `ctr`, `cbc`
    /// and `xts-mode` crates in `differential.rs`), and the request runs
    /// on the implementation its length's class names (XTS-AES-128 and
    /// -192 on RustCrypto whatever the choice: AWS-LC has only -256).
    #[test]
    fn a_cipher_key_split_across_implementations_is_one_cipher(
        key_len in prop_oneof![Just(16usize), Just(24), Just(32)],
        len in prop_oneof![0usize..2 * SMALL_MAX, SMALL_MAX - 32..SMALL_MAX + 32, 0usize..20_000],
        unit in prop_oneof![Just(0usize), Just(16), Just(512), 16usize..600],
        small_max in prop_oneof![Just(SMALL_MAX), 0usize..20_000],
        seed: u64,
    ) {
        let key = bytes(key_len, seed ^ 5);
        let iv = [seed as u8 ^ 0x5c; 16];
        let pt = bytes(len, seed);
        let meant = |c: Choice, len: usize| c.for_len(len);

        let reference = Ctr::with_implementation(&key, Implementation::RustCrypto).unwrap();
        let mut want = pt.clone();
        reference.apply_keystream(&iv, &mut want).unwrap();
        for (c, ctr) in pairs(Mode::Ctr, &key, small_max, |k, c| Ctr::with_choice(k, c).unwrap()) {
            prop_assert_eq!(ctr.implementation_for(len), meant(c, len));
            let mut got = pt.clone();
            ctr.apply_keystream(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "CTR {:?}", c);
        }

        let blocks = &pt[..len / 16 * 16];
        let reference = Cbc::with_implementation(&key, Implementation::RustCrypto).unwrap();
        let mut want = blocks.to_vec();
        reference.encrypt(&iv, &mut want).unwrap();
        // Decryption on its own choice: the encryption's with small and
        // large swapped.
        let swapped = |c: Choice| Choice { small: c.large, large: c.small, ..c };
        for (c, cbc) in pairs(Mode::Cbc, &key, small_max, |k, c| {
            Cbc::with_choices(k, c, swapped(c)).unwrap()
        }) {
            prop_assert_eq!(cbc.implementation_for(blocks.len()), meant(c, blocks.len()));
            prop_assert_eq!(
                cbc.decrypt_implementation_for(blocks.len()),
                meant(swapped(c), blocks.len())
            );
            let mut got = blocks.to_vec();
            cbc.encrypt(&iv, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "CBC {:?}", c);
            cbc.decrypt(&iv, &mut got).unwrap();
            prop_assert_eq!(&got[..], blocks, "CBC {:?} decrypt", c);
        }

        // XTS: the request as one unit (`unit` 0) or as units of `unit`
        // bytes (the data cut to a whole number of them).
        let xts_key = bytes(key_len * 2, seed ^ 9);
        let unit = if unit == 0 { len.max(16) } else { unit };
        let data = &bytes(len.max(16), seed)[..len.max(16) / unit * unit];
        let reference = Xts::with_implementation(&xts_key, Implementation::RustCrypto).unwrap();
        let mut want = data.to_vec();
        reference.encrypt_units(&iv, unit, &mut want).unwrap();
        for (c, xts) in pairs(Mode::Xts, &xts_key, small_max, |k, c| Xts::with_choice(k, c).unwrap()) {
            let ran = xts.implementation_for(data.len());
            prop_assert!(
                ran == meant(c, data.len()) || (key_len != 32 && ran == Implementation::RustCrypto),
                "XTS {:?} ran on {:?}", c, ran
            );
            let mut got = data.to_vec();
            xts.encrypt_units(&iv, unit, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "XTS {:?} unit {}", c, unit);
            xts.decrypt_units(&iv, unit, &mut got).unwrap();
            prop_assert_eq!(&got[..], data, "XTS {:?} decrypt", c);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The CRC-32s on every pair of candidates as (small, large) — and on
    /// an implementation of the other CRC-32, which means crc-fast — fed in
    /// pieces on both sides of the class boundary, and in one call: the
    /// `crc` crate's value every time.
    #[test]
    fn a_crc_split_across_implementations_is_one_crc(
        len in prop_oneof![0usize..3 * SMALL_MAX, 0usize..40_000],
        cuts in proptest::collection::vec(0usize..2 * SMALL_MAX + 64, 0..8),
        small_max in prop_oneof![Just(SMALL_MAX), 0usize..2_000],
        seed: u64,
    ) {
        let data = bytes(len, seed);
        for (alg, reference) in [
            (CrcAlg::Crc32IsoHdlc, crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC)),
            (CrcAlg::Crc32Iscsi, crc::Crc::<u32>::new(&crc::CRC_32_ISCSI)),
        ] {
            let want = u64::from(reference.checksum(&data));
            let mode = Mode::of_crc(alg).unwrap();
            let mut choices: Vec<Choice> = pairs(mode, &[], small_max, |_, c| c).into_iter().map(|(c, _)| c).collect();
            choices.extend(Implementation::CRC.iter().map(|&i| Choice::one(i)));
            for c in choices {
                prop_assert_eq!(checksum_with(alg, c, &data), want, "{} {:?} one call", alg, c);
                let mut crc = Crc::with_choice(alg, c);
                let mut rest = &data[..];
                for &cut in &cuts {
                    let (piece, tail) = rest.split_at(cut.min(rest.len()));
                    let ran = crc.implementation_for(piece.len());
                    prop_assert!(
                        ran == c.for_len(piece.len()) || !mode.candidates().contains(&c.for_len(piece.len())),
                        "{} {:?}: {} B ran on {:?}", alg, c, piece.len(), ran
                    );
                    crc.update(piece);
                    rest = tail;
                }
                crc.update(rest);
                prop_assert_eq!(crc.finalize(), want, "{} {:?} in pieces {:?}", alg, c, &cuts);
            }
        }
    }
}

/// Set in the child this test file runs of itself.
const CHILD: &str = "CRYPTO_OFFLOAD_CHOICE_CHILD";

/// In the child (`CHILD` set, `OPENSSL_ia32cap` as the parent put it):
/// measures GCM among every candidate and among RustCrypto and aws-lc
/// alone, and prints each choice and its timings on a line.
#[test]
fn child_prints_the_measured_gcm_choice() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let pair: Vec<Implementation> = ["rustcrypto", "aws-lc"]
        .iter()
        .filter_map(|n| Implementation::from_name(n))
        .collect();
    for (tag, mode, among) in [
        ("ALL", Mode::Gcm, Mode::Gcm.candidates()),
        ("PAIR", Mode::Gcm, &pair[..]),
        ("XTS", Mode::Xts, Mode::Xts.candidates()),
    ] {
        let m = choice::measure_among(mode, among);
        let timings: Vec<String> = m
            .timings
            .iter()
            .map(|t| {
                format!(
                    "{}={}/{}",
                    t.implementation.name(),
                    t.small().as_nanos(),
                    t.large().as_nanos()
                )
            })
            .collect();
        println!(
            "{tag} small={} large={} at512={} at1024={} ns(16B/16KiB):{}",
            m.choice.small.name(),
            m.choice.large.name(),
            m.choice.for_len(512).name(),
            m.choice.for_len(1024).name(),
            timings.join(",")
        );
    }
}

/// A child's line: its chosen (small, large) implementations and the line.
#[cfg(all(target_arch = "x86_64", feature = "aws-lc"))]
struct Line(String);

#[cfg(all(target_arch = "x86_64", feature = "aws-lc"))]
impl Line {
    fn get(&self, k: &str) -> &str {
        self.0.split(' ').find_map(|w| w.strip_prefix(k)).unwrap()
    }
    fn ns(&self, imp: &str) -> (f64, f64) {
        let list = self.0.rsplit(':').next().unwrap();
        let (s, l) = list
            .split(',')
            .find_map(|w| w.strip_prefix(&format!("{imp}=")))
            .unwrap()
            .split_once('/')
            .unwrap();
        (s.parse().unwrap(), l.parse().unwrap())
    }
}

/// Runs the child with `OPENSSL_ia32cap` set to `mask` (`None`: unset):
/// its ALL and PAIR lines.
#[cfg(all(target_arch = "x86_64", feature = "aws-lc"))]
fn child(mask: Option<&str>) -> (Line, Line, Line) {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_prints_the_measured_gcm_choice",
        "--nocapture",
    ])
    .env(CHILD, "1")
    .env_remove("OPENSSL_ia32cap");
    if let Some(m) = mask {
        c.env("OPENSSL_ia32cap", m);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |tag: &str| {
        Line(
            text.lines()
                .find_map(|l| l.strip_prefix(tag))
                .unwrap_or_else(|| panic!("no {tag} line from the child: {text}"))
                .to_owned(),
        )
    };
    (line("ALL "), line("PAIR "), line("XTS "))
}

/// AWS-LC takes the CPU features it may use from `OPENSSL_ia32cap`: with
/// AES-NI hidden from it (bit 57 of the first word) its GCM drops to its
/// constant-time code. Between RustCrypto (which still has AES-NI) and
/// aws-lc, the measurement must then move large requests from aws-lc
/// (chosen unmasked: its GCM is 2-5x RustCrypto's on AES-NI machines) to
/// RustCrypto; among every candidate (ring's AES-NI or VAES code among
/// them), no request from 512 bytes may stay on aws-lc. Small requests
/// between the two alone are printed, not judged: masked aws-lc and
/// RustCrypto's GCM came within 1.2x of each other at 16–64 B here. On the developer's own
/// machine, whatever its CPU.
#[cfg(all(target_arch = "x86_64", feature = "aws-lc"))]
#[test]
fn hiding_aes_ni_from_aws_lc_moves_the_gcm_choice_off_it() {
    if !std::arch::is_x86_feature_detected!("aes") || std::env::var_os(CHILD).is_some() {
        return;
    }
    let (all, pair, xts) = child(None);
    eprintln!(
        "unmasked:               ALL {}\n                        PAIR {}",
        all.0, pair.0
    );
    let (all_m, pair_m, xts_m) = child(Some("~0x200000000000000"));
    eprintln!(
        "AES-NI hidden (aws-lc): ALL {}\n                        PAIR {}",
        all_m.0, pair_m.0
    );
    // The mask took: aws-lc's large requests are several times slower.
    assert!(
        pair_m.ns("aws-lc").1 > 2.0 * pair.ns("aws-lc").1,
        "{} / {}",
        pair.0,
        pair_m.0
    );
    assert_eq!(pair.get("large="), "aws-lc", "{}", pair.0);
    assert_eq!(pair_m.get("large="), "rustcrypto", "{}", pair_m.0);
    if cfg!(feature = "ring") {
        for at in ["at512=", "at1024=", "large="] {
            assert_ne!(all_m.get(at), "aws-lc", "{}", all_m.0);
        }
    }
    // XTS: AWS-LC's EVP XTS without AES-NI runs its C XTS over the
    // constant-time AES (4x slower than RustCrypto's in the weak guest):
    // both classes leave it. Unmasked, either may win (aws-lc here).
    eprintln!(
        "XTS unmasked: {}\nXTS AES-NI hidden (aws-lc): {}",
        xts.0, xts_m.0
    );
    assert!(
        xts_m.ns("aws-lc").1 > 2.0 * xts.ns("aws-lc").1,
        "{} / {}",
        xts.0,
        xts_m.0
    );
    // (Judged from one 512-byte sector up: a lone unit under 32 bytes runs
    // on AWS-LC's single-block AES whichever XTS is chosen.)
    for at in ["at512=", "at1024=", "large="] {
        assert_eq!(xts_m.get(at), "rustcrypto", "{}", xts_m.0);
    }
}

/// A key reports the choice it was given, boundary included, even one that
/// sends every request to `small` (a `small_max` past any length).
#[test]
fn a_key_reports_the_choice_it_was_given() {
    let key: Vec<u8> = (0..64u8).collect();
    for small_max in [0, 700, usize::MAX] {
        for (small, large) in [(0, 1), (1, 0)] {
            let all = Mode::Ctr.candidates();
            let Some((&small, &large)) = all.get(small).zip(all.get(large)) else {
                continue;
            };
            let c = Choice {
                small,
                large,
                small_max,
            };
            assert_eq!(Ctr::with_choice(&key[..16], c).unwrap().choice(), c);
            assert_eq!(Cbc::with_choice(&key[..16], c).unwrap().choice(), c);
            let one = Choice::one(small);
            let cbc = Cbc::with_choices(&key[..16], one, c).unwrap();
            assert_eq!((cbc.choice(), cbc.decrypt_choice()), (one, c));
            assert_eq!(Gcm::with_choice(&key[..16], c).unwrap().choice(), c);
            assert_eq!(Xts::with_choice(&key, c).unwrap().choice(), c);
        }
    }
}
