//! What the AF_ALG binding's async mechanisms cost a request: the same
//! requests run synchronously on the calling thread (`crypt_blocking`, the
//! floor any mechanism adds to), through the request threads (`encrypt`: a
//! hand-off to a thread and back) and through native AIO (`crypt_aio`:
//! `io_submit`, completion from a reaper thread), one at a time and 16 in
//! flight, for every `cbc(aes)` driver the kernel lists; and the input
//! copied into the socket (`sendmsg`) against its pages spliced
//! (`vmsplice` + `splice`), synchronously, in alternating rounds. Linux only, with AF_ALG (the QEMU test
//! guest runs it: `cargo xtask vm-test --run virtio`).
//!
//! `cargo run --release -p crypto-offload-benches --bin af-alg-overhead`

use std::time::{Duration, Instant};

use crypto_offload_af_alg::{Mechanism, Mode, Skcipher, proc_crypto};

fn per_request(mut f: impl FnMut(), budget: Duration) -> f64 {
    f(); // warm up: the operation socket is opened here
    let start = Instant::now();
    let mut n = 0u32;
    while n < 3 || start.elapsed() < budget {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

/// Per-request µs of `a` and `b`, measured in alternating rounds (so that
/// drift in the guest's speed falls on both alike): the median round each.
fn paired(mut a: impl FnMut(), mut b: impl FnMut(), budget: Duration) -> (f64, f64) {
    const ROUNDS: u32 = 10;
    let round = budget / ROUNDS;
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ra.push(per_request(&mut a, round));
        rb.push(per_request(&mut b, round));
    }
    (median(&mut ra), median(&mut rb))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if let Err(e) = crypto_offload_af_alg::probe() {
        eprintln!("{}", crypto_offload_af_alg::unavailable_reason(&e));
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("a runtime");
    let budget = Duration::from_millis(300);
    let drivers: Vec<String> = proc_crypto::read()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.name == "cbc(aes)" && r.af_alg_type() == Some("skcipher"))
        .map(|r| r.driver)
        .collect();
    println!(
        "{:<24} {:>8} {:>10} {:>12} {:>14} {:>12} {:>10} {:>10} {:>16} {:>14}",
        "driver",
        "size",
        "sync µs",
        "splice µs",
        "splice/copy",
        "threads µs",
        "aio µs",
        "aio/sync",
        "threads ×16 µs",
        "aio ×16 µs"
    );
    for driver in &drivers {
        // `encrypt` on the request threads (AIO is what `crypt_aio`
        // measures).
        let Ok(s) = Skcipher::bind(Mode::Cbc, Some(driver), &[7; 16]) else {
            continue;
        };
        let s = s.with_mechanism(Mechanism::Threads);
        // The same driver twice: one copying every request into the socket,
        // one splicing every request's pages.
        let copying = s.clone().with_splice_from(None);
        let Ok(splicing) = Skcipher::bind(Mode::Cbc, Some(driver), &[7; 16]) else {
            continue;
        };
        let splicing = splicing.with_splice_from(Some(0));
        for size in [16usize, 4096, 8192, 16384, 32768, 65536] {
            let (mut b1, mut b2) = (vec![0u8; size], vec![0u8; size]);
            let (sync, spliced) = paired(
                || {
                    copying
                        .crypt_blocking(true, &[0; 16], &mut b1)
                        .expect("copied request")
                },
                || {
                    splicing
                        .crypt_blocking(true, &[0; 16], &mut b2)
                        .expect("spliced request")
                },
                budget * 2,
            );
            let mut owned = Some(vec![0u8; size]);
            let one = per_request(
                || {
                    let b = owned.take().unwrap_or_default();
                    owned = Some(rt.block_on(s.encrypt(&[0; 16], b)).expect("async request"));
                },
                budget,
            );
            let mut owned = Some(vec![0u8; size]);
            let aio = per_request(
                || {
                    let b = owned.take().unwrap_or_default();
                    owned = Some(
                        rt.block_on(s.crypt_aio(true, &[0; 16], b))
                            .expect("aio request"),
                    );
                },
                budget,
            );
            let aio_many = per_request(
                || {
                    rt.block_on(async {
                        let tasks: Vec<_> = (0..16)
                            .map(|_| {
                                let s = s.clone();
                                tokio::spawn(async move {
                                    s.crypt_aio(true, &[0; 16], vec![0; size]).await
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("task").expect("request");
                        }
                    })
                },
                budget,
            ) / 16.0;
            // 16 requests in flight at once, per request.
            let many = per_request(
                || {
                    rt.block_on(async {
                        let tasks: Vec<_> = (0..16)
                            .map(|_| {
                                let s = s.clone();
                                tokio::spawn(
                                    async move { s.encrypt(&[0; 16], vec![0; size]).await },
                                )
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("task").expect("request");
                        }
                    })
                },
                budget,
            ) / 16.0;
            println!(
                "{driver:<24} {size:>8} {sync:>10.1} {spliced:>12.1} {:>14.2} {one:>12.1} {aio:>10.1} {:>10.2} {many:>16.1} {aio_many:>14.1}",
                spliced / sync,
                aio / sync
            );
        }
    }
}
