//! Review tests for `Xts256` (AWS-LC's XTS-AES-256 through EVP).
//!
//! Every result is checked against an independent reference, RustCrypto's
//! `xts-mode` on `aes` (itself anchored to the IEEE 1619-2007 ciphertext
//! stealing vectors below), one data unit at a time with the tweak computed
//! here (`first + i`, wrapping), never through `Xts256`'s own logic.
//!
//! The sweeps run in child processes (this test binary run again on one
//! `#[ignore]`d test), for two reasons:
//! - the data sits flush against `PROT_NONE` guard pages, so an over- or
//!   under-read or write by AWS-LC's assembly is a SIGSEGV, which the
//!   parent reports as a failure instead of losing the whole test binary;
//! - AWS-LC reads `OPENSSL_ia32cap` once, at load: a child with AES-NI (and
//!   SSSE3) masked runs the other code paths of the same build: AWS-LC's
//!   portable `CRYPTO_xts128_encrypt` on vpaes, and on the constant-time
//!   `aes_nohw`. On a machine with VAES + AVX-512 the default child runs
//!   `aes_hw_xts_*_avx512` and the `:~0x10000` child `aes_hw_xts_*`.
//!
//! Needs `--features aws-lc`; about a second in all.
#![cfg(feature = "aws-lc")]

use std::process::Command;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};

use aes::cipher::KeyInit;
use aes::{Aes128, Aes256};
use crypto_offload_native::{Xts256, XtsError};
use xts_mode::{Xts128, get_tweak_default};

// ---------------------------------------------------------------------------
// Helpers

/// splitmix64: deterministic test bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }

    fn u128(&mut self) -> u128 {
        u128::from(self.next()) << 64 | u128::from(self.next())
    }
}

fn key(seed: u64) -> [u8; 64] {
    let mut k = [0u8; 64];
    Rng(seed).fill(&mut k);
    assert_ne!(k[..32], k[32..]);
    k
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn reference(key: &[u8; 64]) -> Xts128<Aes256> {
    Xts128::new(
        Aes256::new_from_slice(&key[..32]).unwrap(),
        Aes256::new_from_slice(&key[32..]).unwrap(),
    )
}

/// XTS over consecutive units with the reference, one unit at a time, the
/// tweak of unit `i` being `first + i` (wrapping at 2^128).
fn reference_units(x: &Xts128<Aes256>, first: u128, unit: usize, data: &mut [u8], encrypt: bool) {
    assert!(data.len().is_multiple_of(unit));
    for (i, u) in data.chunks_exact_mut(unit).enumerate() {
        let t = get_tweak_default(first.wrapping_add(i as u128));
        if encrypt {
            x.encrypt_sector(u, t);
        } else {
            x.decrypt_sector(u, t);
        }
    }
}

/// A read-write mapping with a `PROT_NONE` page on each side.
struct Guarded {
    base: *mut u8,
    page: usize,
    pages: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let pages = len.div_ceil(page).max(1);
        let total = (pages + 2) * page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        // SAFETY: both ranges are whole pages inside the mapping made above.
        unsafe {
            assert_eq!(libc::mprotect(base.cast(), page, libc::PROT_NONE), 0);
            assert_eq!(
                libc::mprotect(base.add((pages + 1) * page).cast(), page, libc::PROT_NONE),
                0
            );
        }
        Guarded { base, page, pages }
    }

    /// `len` bytes starting right after the lower guard page.
    fn head(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.pages * self.page);
        // SAFETY: inside the read-write pages of the mapping, borrowed from
        // `self` mutably.
        unsafe { core::slice::from_raw_parts_mut(self.base.add(self.page), len) }
    }

    /// `len` bytes ending right before the upper guard page.
    fn tail(&mut self, len: usize) -> &mut [u8] {
        let cap = self.pages * self.page;
        assert!(len <= cap);
        // SAFETY: as for `head`.
        unsafe { core::slice::from_raw_parts_mut(self.base.add(self.page + cap - len), len) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`; no slice of it outlives
        // `self`.
        unsafe {
            libc::munmap(self.base.cast(), (self.pages + 2) * self.page);
        }
    }
}

/// Runs `child_sweep` (or another ignored test) in a child process with
/// `envs` and checks that it passed.
fn run_child(test: &str, envs: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("OPENSSL_ia32cap")
    .env_remove("XTS_REVIEW_EXPECT_AES_HW");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {test} with {envs:?} failed: {:?} (a signal: a guard page was \
         touched)\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "child {test} did not run\n{stdout}"
    );
}

// ---------------------------------------------------------------------------
// The reference itself

/// IEEE 1619-2007 vectors 15-18 (XTS-AES-128, 17- to 20-byte data units,
/// data unit sequence number bytes 9a 78 56 34 12, i.e. 0x123456789a as
/// the little-endian tweak): the reference does ciphertext
/// stealing as the standard does. (There are no XTS-AES-256 stealing
/// vectors in IEEE 1619; the AES-256 reference is the same code.)
#[test]
fn reference_does_ieee_1619_ciphertext_stealing() {
    let x = Xts128::new(
        Aes128::new_from_slice(&hex("fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0")).unwrap(),
        Aes128::new_from_slice(&hex("bfbebdbcbbbab9b8b7b6b5b4b3b2b1b0")).unwrap(),
    );
    for ctx in [
        "6c1625db4671522d3d7599601de7ca09ed",
        "d069444b7a7e0cab09e24447d24deb1fedbf",
        "e5df1351c0544ba1350b3363cd8ef4beedbf9d",
        "9d84c813f719aa2c7be3f66171c7c5c2edbf9dac",
    ] {
        let want = hex(ctx);
        let plain: Vec<u8> = (0..want.len() as u8).collect();
        let mut data = plain.clone();
        x.encrypt_sector(&mut data, get_tweak_default(0x12_3456_789a));
        assert_eq!(data, want, "{} bytes", want.len());
        x.decrypt_sector(&mut data, get_tweak_default(0x12_3456_789a));
        assert_eq!(data, plain);
    }
}

// ---------------------------------------------------------------------------
// The sweeps (child processes)

/// Every single-unit length 16..=600 (all stealing remainders, every
/// AES-NI loop shape: 1..6 blocks, 6-block batches, tails), 1000..=1100, the
/// AVX-512 16-block loop's edges (256·k .. 256·k + 47), around 4 KiB and
/// 64 KiB.
fn sweep_lengths() -> Vec<usize> {
    let mut v: Vec<usize> = (16..=600).collect();
    v.extend(1000..=1100);
    v.extend(4080..=4128);
    v.extend([65535, 65536, 65537, 65551, 65567]);
    v
}

/// Run by the `sweep_*` tests in a child process (see the module doc):
/// `Xts256` against the reference, in place, the data flush against a
/// guard page on one side and then the other, encryption and decryption,
/// single units and runs of units (with tweaks across 2^64 and 2^128).
#[test]
#[ignore = "run in a child process by the sweep_* tests"]
fn child_sweep() {
    if let Ok(want) = std::env::var("XTS_REVIEW_EXPECT_AES_HW") {
        // SAFETY: no preconditions.
        let hw = unsafe { aws_lc_sys::EVP_has_aes_hardware() };
        println!("EVP_has_aes_hardware() = {hw}");
        assert_eq!(hw.to_string(), want, "OPENSSL_ia32cap did not take effect");
    }
    let k = key(1);
    let xts = Xts256::new(&k).unwrap();
    let r = reference(&k);
    let mut rng = Rng(2);

    // Single units: one `Xts256` for all of them, so spare contexts last
    // used on one length (and direction state) serve the next.
    for len in sweep_lengths() {
        let plain = rng.bytes(len);
        let tweak = rng.u128();
        let mut want = plain.clone();
        reference_units(&r, tweak, len, &mut want, true);
        let mut g = Guarded::new(len);
        for head in [false, true] {
            let buf = if head { g.head(len) } else { g.tail(len) };
            buf.copy_from_slice(&plain);
            xts.encrypt_units(&tweak.to_le_bytes(), len, buf).unwrap();
            assert!(buf == &want[..], "encrypt, {len} bytes, head {head}");
            xts.decrypt_units(&tweak.to_le_bytes(), len, buf).unwrap();
            assert!(buf == &plain[..], "decrypt, {len} bytes, head {head}");
        }
        // Decrypting what the reference encrypted (the decryption key
        // schedule is AWS-LC's own AES_set_decrypt_key one).
        let buf = g.tail(len);
        buf.copy_from_slice(&want);
        xts.decrypt_units(&tweak.to_le_bytes(), len, buf).unwrap();
        assert!(buf == &plain[..], "decrypt reference, {len} bytes");
    }

    // Runs of units, the last unit flush against the guard page.
    for unit in [
        16, 17, 31, 32, 33, 47, 255, 256, 257, 300, 511, 512, 520, 4096, 4097,
    ] {
        for units in [1, 2, 3, 5] {
            for first in [
                0,
                u128::from(u64::MAX) - 1,
                u128::MAX - 2,
                u128::MAX,
                rng.u128(),
            ] {
                let len = unit * units;
                let plain = rng.bytes(len);
                let mut want = plain.clone();
                reference_units(&r, first, unit, &mut want, true);
                let mut g = Guarded::new(len);
                let buf = g.tail(len);
                buf.copy_from_slice(&plain);
                xts.encrypt_units(&first.to_le_bytes(), unit, buf).unwrap();
                assert!(
                    buf == &want[..],
                    "encrypt {units} x {unit}, first {first:#x}"
                );
                xts.decrypt_units(&first.to_le_bytes(), unit, buf).unwrap();
                assert!(
                    buf == &plain[..],
                    "decrypt {units} x {unit}, first {first:#x}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_aes_hw() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

/// The build's own dispatch: AES-NI (`aes_hw_xts_*`), or VAES-512
/// (`aes_hw_xts_*_avx512`) on a CPU with VAES, VBMI2, AVX-512 and
/// VPCLMULQDQ.
#[test]
fn sweep_default_path() {
    #[cfg(target_arch = "x86_64")]
    let expect = if has_aes_hw() { "1" } else { "0" };
    #[cfg(target_arch = "x86_64")]
    run_child("child_sweep", &[("XTS_REVIEW_EXPECT_AES_HW", expect)]);
    #[cfg(not(target_arch = "x86_64"))]
    run_child("child_sweep", &[]);
}

/// AVX512F masked: `aes_hw_xts_*` (AES-NI) even on an AVX-512 machine (on
/// one without AVX-512 this is the default path again).
#[cfg(target_arch = "x86_64")]
#[test]
fn sweep_aesni_without_avx512() {
    let expect = if has_aes_hw() { "1" } else { "0" };
    run_child(
        "child_sweep",
        &[
            ("OPENSSL_ia32cap", "~0:~0x10000"),
            ("XTS_REVIEW_EXPECT_AES_HW", expect),
        ],
    );
}

/// AES-NI masked (ECX bit 25): `CRYPTO_xts128_encrypt` in place, on vpaes.
#[cfg(target_arch = "x86_64")]
#[test]
fn sweep_portable_xts_on_vpaes() {
    run_child(
        "child_sweep",
        &[
            ("OPENSSL_ia32cap", "~0x0200000000000000"),
            ("XTS_REVIEW_EXPECT_AES_HW", "0"),
        ],
    );
}

/// AES-NI and SSSE3 masked: `CRYPTO_xts128_encrypt` on `aes_nohw`.
#[cfg(target_arch = "x86_64")]
#[test]
fn sweep_portable_xts_on_aes_nohw() {
    run_child(
        "child_sweep",
        &[
            ("OPENSSL_ia32cap", "~0x0200020000000000"),
            ("XTS_REVIEW_EXPECT_AES_HW", "0"),
        ],
    );
}

// ---------------------------------------------------------------------------
// Limits, lengths, tweaks

/// The 2^20-block limit: a `MAX_UNIT` unit, and one of `MAX_UNIT - 1` bytes
/// (2^20 - 1 whole blocks and a stolen partial one), are taken and decrypt
/// back; AWS-LC's own check (`len > XTS_MAX_BLOCKS_PER_DATA_UNIT *
/// AES_BLOCK_SIZE`, e_aes.c) is never what refuses a unit. (`xts-mode`
/// takes half a second for 16 MiB here, so the ciphertext is checked at
/// its first and last blocks, with the tweaks walked to block 2^20 - 1 in
/// this file.)
#[test]
fn units_at_the_2_pow_20_block_limit() {
    use aes::cipher::BlockCipherEncrypt;

    assert_eq!(Xts256::MAX_UNIT, 1 << 24);
    let k = key(3);
    let xts = Xts256::new(&k).unwrap();
    let k1 = Aes256::new_from_slice(&k[..32]).unwrap();
    let k2 = Aes256::new_from_slice(&k[32..]).unwrap();
    let e1 = |p: [u8; 16], t: u128| -> [u8; 16] {
        let mut b = (u128::from_le_bytes(p) ^ t).to_le_bytes().into();
        k1.encrypt_block(&mut b);
        (u128::from_le_bytes(b.0) ^ t).to_le_bytes()
    };
    let alpha = |t: u128| (t << 1) ^ ((((t as i128) >> 127) as u128) & 0x87);
    let block = |d: &[u8], j: usize| -> [u8; 16] { d[16 * j..16 * j + 16].try_into().unwrap() };
    for len in [Xts256::MAX_UNIT, Xts256::MAX_UNIT - 1] {
        let mut plain = vec![0x3cu8; len];
        Rng(len as u64).fill(&mut plain[..64]);
        Rng(!len as u64).fill(&mut plain[len - 64..]);
        let mut data = plain.clone();
        xts.encrypt_units(&7u128.to_le_bytes(), len, &mut data)
            .unwrap();

        // T_j = E_K2(7) · α^j.
        let mut t0 = 7u128.to_le_bytes().into();
        k2.encrypt_block(&mut t0);
        let mut tweaks = vec![u128::from_le_bytes(t0.0)];
        for _ in 0..(1 << 20) {
            tweaks.push(alpha(*tweaks.last().unwrap()));
        }
        let check = |j: usize| {
            assert_eq!(
                block(&data, j),
                e1(block(&plain, j), tweaks[j]),
                "{len}: block {j}"
            );
        };
        (0..4).for_each(check);
        let m = len / 16; // whole blocks
        let r = len % 16;
        if r == 0 {
            (m - 3..m).for_each(check);
        } else {
            // IEEE 1619 §5.3.2: CC = E(P_{m-1}, T_{m-1}); C_m = CC[..r];
            // C_{m-1} = E(P_m ‖ CC[r..], T_m).
            let cc = e1(block(&plain, m - 1), tweaks[m - 1]);
            assert_eq!(&data[16 * m..], &cc[..r], "{len}: stolen partial block");
            let mut pp = cc;
            pp[..r].copy_from_slice(&plain[16 * m..]);
            assert_eq!(
                block(&data, m - 1),
                e1(pp, tweaks[m]),
                "{len}: last whole block"
            );
            check(m - 2);
        }
        xts.decrypt_units(&7u128.to_le_bytes(), len, &mut data)
            .unwrap();
        assert!(data == plain, "{len}: round trip");
    }
}

/// Lengths `Xts256` refuses leave the data as it was and AWS-LC is never
/// called; zero-length data with a valid unit is a no-op; a unit over
/// `MAX_UNIT` is refused even with no data (the fallback's `Xts` instead
/// accepts that and runs it on RustCrypto: its `evp_for` checks
/// `unit_len <= MAX_UNIT` before calling here).
#[test]
fn refused_lengths_touch_nothing() {
    let xts = Xts256::new(&key(4)).unwrap();
    for (unit, len) in [
        (0, 0),
        (15, 15),
        (15, 30),
        (16, 17),
        (17, 16),
        (32, 48),
        (513, 1024),
        (Xts256::MAX_UNIT + 1, Xts256::MAX_UNIT + 1),
        (Xts256::MAX_UNIT + 16, 0),
        (usize::MAX, 0),
    ] {
        let mut data = vec![0xa5u8; len];
        for dir in 0..2 {
            let r = if dir == 0 {
                xts.encrypt_units(&[1; 16], unit, &mut data)
            } else {
                xts.decrypt_units(&[1; 16], unit, &mut data)
            };
            assert_eq!(
                r,
                Err(XtsError::UnitLength {
                    unit_len: unit,
                    len
                })
            );
        }
        assert!(data.iter().all(|&b| b == 0xa5), "{unit}, {len}");
    }
    for unit in [16, 17, 512, Xts256::MAX_UNIT] {
        assert_eq!(xts.encrypt_units(&[1; 16], unit, &mut []), Ok(()));
        assert_eq!(xts.decrypt_units(&[1; 16], unit, &mut []), Ok(()));
    }
}

/// The tweak of unit `i` is `first + i` modulo 2^128, carried through all
/// 16 bytes: at `u128::MAX` the next unit's tweak is 0, and a carry out of
/// the low 64 bits reaches the high half.
#[test]
fn tweaks_wrap_at_2_pow_128_and_carry_across_64_bits() {
    let k = key(5);
    let xts = Xts256::new(&k).unwrap();
    let r = reference(&k);
    for (first, unit) in [
        (u128::MAX, 512),
        (u128::MAX - 1, 17),
        (u128::from(u64::MAX), 4096),
        (u128::from(u64::MAX) << 64 | u128::from(u64::MAX), 31),
    ] {
        let plain = Rng(first as u64).bytes(unit * 4);
        let mut got = plain.clone();
        xts.encrypt_units(&first.to_le_bytes(), unit, &mut got)
            .unwrap();
        let mut want = plain.clone();
        reference_units(&r, first, unit, &mut want, true);
        assert_eq!(got, want, "{first:#x}");
        // Unit 1 after u128::MAX is unit 0 of a run starting at tweak 0.
        if first == u128::MAX {
            let mut zero = plain[unit..2 * unit].to_vec();
            xts.encrypt_units(&[0; 16], unit, &mut zero).unwrap();
            assert_eq!(zero, got[unit..2 * unit]);
        }
    }
}

/// The key is read in `new` and not kept: wiping the caller's copy changes
/// nothing, and `Xts256` itself is only pointers (no key bytes on the Rust
/// side).
#[test]
fn the_callers_key_is_not_kept() {
    let mut k = key(6);
    let r = reference(&k);
    let xts = Xts256::new(&k).unwrap();
    k.fill(0);
    let mut got = vec![9u8; 1040];
    xts.encrypt_units(&3u128.to_le_bytes(), 520, &mut got)
        .unwrap();
    let mut want = vec![9u8; 1040];
    reference_units(&r, 3, 520, &mut want, true);
    assert_eq!(got, want);
    // Two directions × (the template, 4 spare slots, the per-thread
    // contexts' `ThreadLocal`: 63 bucket pointers and a count, and a count
    // of them): 70 words, pointers and counts, no key schedule.
    assert!(core::mem::size_of::<Xts256>() <= 2 * 70 * core::mem::size_of::<usize>());
}

// ---------------------------------------------------------------------------
// AWS-LC state: the error queue

/// Nothing is left on AWS-LC's thread-local error queue by successful
/// calls or by the refusals `Xts256` makes itself (equal halves, bad
/// lengths: AWS-LC is never called). (The queue is a ring of
/// `ERR_NUM_ERRORS` = 16 entries, err.c: even a call failing in a loop
/// could not grow it; no failure is reachable without running out of
/// memory.)
#[test]
fn nothing_is_left_on_the_error_queue() {
    // SAFETY: no preconditions; this thread's queue.
    unsafe { aws_lc_sys::ERR_clear_error() };
    assert_eq!(Xts256::new(&[7u8; 64]).unwrap_err(), XtsError::EqualHalves);
    let xts = Xts256::new(&key(7)).unwrap();
    let mut data = vec![1u8; 3 * 4097];
    for _ in 0..3 {
        xts.encrypt_units(&[2; 16], 4097, &mut data).unwrap();
        xts.decrypt_units(&[2; 16], 4097, &mut data).unwrap();
        assert!(xts.encrypt_units(&[2; 16], 4096, &mut data).is_err());
    }
    drop(xts);
    // SAFETY: no preconditions.
    assert_eq!(unsafe { aws_lc_sys::ERR_peek_error() }, 0);
}

// ---------------------------------------------------------------------------
// Threads: the shared template, the spare slots

fn assert_send_sync<T: Send + Sync>() {}

/// Many more callers at once than spare slots (4 a direction), released
/// together by a barrier and with requests long enough to overlap, so that
/// the template is copied by several threads at once and contexts go
/// through the slots (swap out, compare-exchange back, free when full)
/// thousands of times; every result checked against the reference. Then the
/// key is moved to another thread and dropped there.
#[test]
fn many_threads_on_one_key() {
    assert_send_sync::<Xts256>();
    let k = key(8);
    let r = reference(&k);
    let xts = Xts256::new(&k).unwrap();
    // (unit, units): stealing and whole-block units, short and long runs.
    let shapes = [(512, 64), (17, 40), (4096, 8), (33, 100), (16, 1)];
    // (unit, units, first tweak, plaintext, ciphertext)
    type Case = (usize, usize, u128, Vec<u8>, Vec<u8>);
    let cases: Vec<Case> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(unit, units))| {
            let plain = Rng(i as u64 + 100).bytes(unit * units);
            let first = u128::MAX - i as u128;
            let mut ct = plain.clone();
            reference_units(&r, first, unit, &mut ct, true);
            (unit, units, first, plain, ct)
        })
        .collect();
    const THREADS: usize = 16;
    let barrier = Barrier::new(THREADS);
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (xts, cases, barrier, done) = (&xts, &cases, &barrier, &done);
            s.spawn(move || {
                barrier.wait();
                for i in 0..60 {
                    let (unit, _, first, plain, ct) = &cases[(t + i) % cases.len()];
                    let mut data = plain.clone();
                    xts.encrypt_units(&first.to_le_bytes(), *unit, &mut data)
                        .unwrap();
                    assert!(data == *ct, "thread {t} round {i} encrypt");
                    xts.decrypt_units(&first.to_le_bytes(), *unit, &mut data)
                        .unwrap();
                    assert!(data == *plain, "thread {t} round {i} decrypt");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(done.load(Ordering::Relaxed), THREADS * 60);
    // Dropped on another thread than the one that made it (and whose
    // contexts were made and last used on other threads still).
    let (unit, _, first, plain, ct) = &cases[0];
    std::thread::spawn({
        let (unit, first, plain, ct) = (*unit, *first, plain.clone(), ct.clone());
        move || {
            let mut data = plain;
            xts.encrypt_units(&first.to_le_bytes(), unit, &mut data)
                .unwrap();
            assert_eq!(data, ct);
            drop(xts);
        }
    })
    .join()
    .unwrap();
}

// ---------------------------------------------------------------------------
// Key material handed back to the allocator

/// What the free hook saw: blocks freed, and those still holding key bytes.
static FREED_WITH_KEY: AtomicUsize = AtomicUsize::new(0);
static FREED_BLOCKS: AtomicUsize = AtomicUsize::new(0);

/// The key the allocator test uses; Key2's first round key (the raw first
/// 16 bytes of Key2) is the first thing in the Key2 schedule AES-NI's
/// `aes_hw_set_encrypt_key` writes, in both directions' contexts.
const HOOK_KEY: [u8; 64] = {
    let mut k = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        k[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    k
};

const PREFIX: usize = 16;

unsafe extern "C" fn hook_malloc(
    size: usize,
    _: *const core::ffi::c_char,
    _: core::ffi::c_int,
) -> *mut core::ffi::c_void {
    // SAFETY: plain malloc; the size prefix is written inside the block.
    unsafe {
        let p = libc::malloc(size + PREFIX).cast::<u8>();
        if p.is_null() {
            return p.cast();
        }
        p.cast::<usize>().write(size);
        p.add(PREFIX).cast()
    }
}

unsafe extern "C" fn hook_free(
    ptr: *mut core::ffi::c_void,
    _: *const core::ffi::c_char,
    _: core::ffi::c_int,
) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from `hook_malloc` (or `hook_realloc`): the size
    // is PREFIX bytes before it, and the block is `size` bytes.
    unsafe {
        let base = ptr.cast::<u8>().sub(PREFIX);
        let size = base.cast::<usize>().read();
        let block = core::slice::from_raw_parts(ptr.cast::<u8>(), size);
        FREED_BLOCKS.fetch_add(1, Ordering::Relaxed);
        if block.windows(16).any(|w| w == &HOOK_KEY[32..48]) {
            FREED_WITH_KEY.fetch_add(1, Ordering::Relaxed);
        }
        libc::free(base.cast());
    }
}

unsafe extern "C" fn hook_realloc(
    ptr: *mut core::ffi::c_void,
    size: usize,
    f: *const core::ffi::c_char,
    l: core::ffi::c_int,
) -> *mut core::ffi::c_void {
    // SAFETY: as for the two above; the old block is `old` bytes.
    unsafe {
        let new = hook_malloc(size, f, l);
        if !ptr.is_null() && !new.is_null() {
            let old = ptr.cast::<u8>().sub(PREFIX).cast::<usize>().read();
            core::ptr::copy_nonoverlapping(ptr.cast::<u8>(), new.cast::<u8>(), old.min(size));
            hook_free(ptr, f, l);
        }
        new
    }
}

/// Run by `key_schedules_reach_a_custom_free_unwiped` in a child process:
/// with allocation functions installed through AWS-LC's public
/// `CRYPTO_set_mem_functions` (which any crate in the process may call,
/// e.g. to track memory), `OPENSSL_free` hands blocks to the hook without
/// cleansing them (mem.c: the `free_impl` branch returns before
/// `OPENSSL_cleanse`; the same for an `OPENSSL_memory_free` override), and
/// `Xts256`'s contexts reach it with their key schedules in them. `xts.rs`
/// says, unconditionally, "AWS-LC wipes the key schedules when a context is
/// freed (`OPENSSL_free` cleanses every allocation it returns)"; `Ctx::drop`
/// does not wipe `cipher_data` itself (it cannot portably: `EVP_CIPHER` and
/// `EVP_AES_XTS_CTX` are opaque, the size is internal).
///
/// This pins the behaviour (it passes today): the key schedules DO reach a
/// custom free unwiped. If `Ctx::drop` ever wipes the context itself, flip
/// the assertion.
#[test]
#[ignore = "run in a child process by key_schedules_reach_a_custom_free_unwiped"]
fn child_custom_free() {
    // SAFETY: the three hooks meet AWS-LC's contract (malloc/realloc/free
    // of blocks they made themselves); nothing in this process has
    // allocated through AWS-LC yet (this test runs alone in it).
    let ok = unsafe {
        aws_lc_sys::CRYPTO_set_mem_functions(Some(hook_malloc), Some(hook_realloc), Some(hook_free))
    };
    assert_eq!(ok, 1, "CRYPTO_set_mem_functions refused");
    // SAFETY: no preconditions.
    if unsafe { aws_lc_sys::EVP_has_aes_hardware() } == 0 {
        println!("no AES-NI: the schedule is not stored as raw key bytes; nothing to check");
        return;
    }
    let xts = Xts256::new(&HOOK_KEY).unwrap();
    // Spare contexts in the slots, and copies freed when the slots are full.
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let mut data = vec![5u8; 1 << 16];
                for _ in 0..20 {
                    xts.encrypt_units(&[0; 16], 4096, &mut data).unwrap();
                    xts.decrypt_units(&[0; 16], 4096, &mut data).unwrap();
                }
            });
        }
    });
    drop(xts);
    let blocks = FREED_BLOCKS.load(Ordering::Relaxed);
    let with_key = FREED_WITH_KEY.load(Ordering::Relaxed);
    println!("blocks freed: {blocks}, with Key2's first round key in them: {with_key}");
    assert!(blocks > 0, "the hook saw no frees");
    // Both directions' templates, at least: the wipe the module doc
    // promises depends on AWS-LC's default allocator.
    assert!(
        with_key >= 2,
        "{with_key} freed blocks held key schedules: has Ctx::drop started \
         wiping contexts itself? Then update this test and the report."
    );
}

/// See `child_custom_free`: a doc inaccuracy in `xts.rs` (the wipe on free
/// is AWS-LC's default allocator's, not unconditional), pinned.
#[test]
fn key_schedules_reach_a_custom_free_unwiped() {
    run_child("child_custom_free", &[]);
}
