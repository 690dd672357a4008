//! What the AF_ALG binding's async mechanisms cost a request: the same
//! requests run synchronously on the calling thread (`crypt_blocking`, the
//! floor any mechanism adds to), through the request threads (`encrypt`: a
//! hand-off to a thread and back) and through native AIO (`crypt_aio`:
//! `io_submit`, completion from a reaper thread), one at a time and 16 in
//! flight, for every `cbc(aes)` driver the kernel lists. Linux only, with AF_ALG (the QEMU test
//! guest runs it: `cargo xtask vm-test --run virtio`).
//!
//! `cargo run --release -p crypto-offload-benches --bin af-alg-overhead`

use std::time::{Duration, Instant};

use crypto_offload_af_alg::{Mode, Skcipher, proc_crypto};

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
        "{:<24} {:>8} {:>10} {:>12} {:>10} {:>10} {:>16} {:>14}",
        "driver",
        "size",
        "sync µs",
        "threads µs",
        "aio µs",
        "aio/sync",
        "threads ×16 µs",
        "aio ×16 µs"
    );
    for driver in &drivers {
        let Ok(s) = Skcipher::bind(Mode::Cbc, Some(driver), &[7; 16]) else {
            continue;
        };
        for size in [16usize, 4096, 65536] {
            let mut buf = vec![0u8; size];
            let sync = per_request(
                || {
                    s.crypt_blocking(true, &[0; 16], &mut buf)
                        .expect("sync request")
                },
                budget,
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
                "{driver:<24} {size:>8} {sync:>10.1} {one:>12.1} {aio:>10.1} {:>10.2} {many:>16.1} {aio_many:>14.1}",
                aio / sync
            );
        }
    }
}
