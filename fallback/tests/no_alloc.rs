//! The fallback's requests allocate nothing: every mode, implementation and
//! size, counted by an instrumented global allocator.
//!
//! A plain `main` (no test harness), so no other thread allocates while the
//! count runs. It counts Rust heap allocations; aws-lc's C code allocates
//! through its own `OPENSSL_malloc`, which this cannot see (its seal/open and
//! AES paths do not allocate per call).

use std::alloc::System;

use crypto_offload_fallback::{Cbc, Crc, CrcAlg, Ctr, Gcm, Implementation, Xts, checksum, combine};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn main() {
    let sizes = [0usize, 16, 17, 64, 512, 4096, 65536];
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0x5a; n]).collect();
    let key: Vec<u8> = (0..64u8).collect();
    let mut keys = Vec::new();
    for &imp in Implementation::ALL {
        // ring runs GCM only: its CTR and CBC slots take the default.
        let cipher = if imp.has_ctr_and_cbc() {
            imp
        } else {
            Implementation::RustCrypto
        };
        keys.push((
            Ctr::with_implementation(&key[..32], cipher).unwrap(),
            Cbc::with_implementation(&key[..32], cipher).unwrap(),
            Gcm::with_implementation(&key[..32], imp).unwrap(),
        ));
    }
    let xts = Xts::new(&key).unwrap();
    let mut crcs: Vec<Crc> = CrcAlg::ALL.iter().map(|&a| Crc::new(a)).collect();

    // A thread's first XTS-AES-256 request on EVP XTS (one of more than a
    // block) in each direction makes the thread's own AWS-LC context
    // (`crypto_offload_native::Xts256`), and with it a `thread_local`
    // bucket on the Rust heap (16 bytes): once per thread and key, not per
    // request. Every request after allocates nothing, which is what is
    // counted below.
    let mut first = [0u8; 512];
    xts.encrypt(&[4; 16], &mut first).unwrap();
    xts.decrypt(&[4; 16], &mut first).unwrap();

    let region = Region::new(GLOBAL);
    for buf in &mut bufs {
        for (ctr, cbc, gcm) in &keys {
            ctr.apply_keystream(&[1; 16], buf).unwrap();
            if buf.len() % 16 == 0 {
                cbc.encrypt(&[2; 16], buf).unwrap();
                cbc.decrypt(&[2; 16], buf).unwrap();
            }
            let tag = gcm.seal_in_place_detached(&[3; 12], b"aad", buf).unwrap();
            gcm.open_in_place_detached(&[3; 12], b"aad", buf, &tag)
                .unwrap();
            let mut bad = tag;
            bad[0] ^= 1;
            assert!(
                gcm.open_in_place_detached(&[3; 12], b"aad", buf, &bad)
                    .is_err()
            );
        }
        if buf.len() >= 16 {
            xts.encrypt(&[4; 16], buf).unwrap();
            xts.decrypt(&[4; 16], buf).unwrap();
        }
        if buf.len() >= 512 {
            xts.encrypt_units(&[4; 16], 512, buf).unwrap();
            xts.decrypt_units(&[4; 16], 512, buf).unwrap();
        }
        for crc in &mut crcs {
            crc.update(buf);
            let c = checksum(crc.alg(), buf);
            std::hint::black_box(combine(crc.alg(), crc.finalize(), c, buf.len() as u64));
            std::hint::black_box(Crc::resume(crc.alg(), c, 7));
        }
    }
    let stats = region.change();
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "requests allocated: {stats:?}"
    );
    println!(
        "no_alloc: 0 allocations over {} request kinds × {} sizes",
        12,
        sizes.len()
    );
}
