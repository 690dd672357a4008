//! Tests against real virtio-crypto devices through VFIO: in the QEMU guest
//! (`cargo xtask vm-test --run vfio`), which binds its two devices to
//! `vfio-pci` and lists them in `VMTEST_VFIO_DEVICES`. Elsewhere they check
//! that the absence of devices is reported with a reason, and say that the
//! device tests did not run.

use std::future::Future;
use std::io::Write;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use crypto_offload_vfio::{CipherAlgo, CryptoDevice, Error, devices, unavailable_reason};
use proptest::prelude::*;

mod reference;
use reference::reference;

/// The devices the guest bound for us; none elsewhere.
fn guest_devices() -> Vec<String> {
    match std::env::var("VMTEST_VFIO_DEVICES") {
        Ok(list) => {
            let listed: Vec<String> = list.split_whitespace().map(str::to_owned).collect();
            assert!(!listed.is_empty(), "the vfio run bound no device");
            let (usable, elsewhere) = devices();
            assert_eq!(
                usable, listed,
                "discovery disagrees with the guest (elsewhere: {elsewhere:?})"
            );
            listed
        }
        Err(_) => {
            let reason = unavailable_reason();
            eprintln!("no VFIO virtio-crypto device here ({reason:?}): device tests not run");
            if devices().0.is_empty() {
                assert!(reason.is_some(), "no device and no reason");
            }
            Vec::new()
        }
    }
}

/// A VFIO group opens once at a time: tests take turns with the devices.
fn exclusive() -> MutexGuard<'static, ()> {
    static DEVICES: Mutex<()> = Mutex::new(());
    DEVICES.lock().unwrap_or_else(|p| p.into_inner())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn key(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn valid_len(algo: CipherAlgo, len: usize) -> usize {
    match algo {
        CipherAlgo::AesEcb | CipherAlgo::AesCbc => len / 16 * 16,
        // Whole blocks: the device has no ciphertext stealing.
        CipherAlgo::AesXts => (len / 16 * 16).max(16),
        CipherAlgo::AesCtr => len,
    }
}

/// Runs `test` on each of the first `limit` devices the guest bound (none
/// on a host), one test at a time, each device opened afresh.
fn on_devices(limit: usize, test: impl AsyncFn(&str, CryptoDevice)) {
    let _turn = exclusive();
    let rt = rt();
    for address in guest_devices().into_iter().take(limit) {
        rt.block_on(async {
            let dev = CryptoDevice::open(&address).await.unwrap();
            test(&address, dev).await;
        });
    }
}

/// Writes a figure past libtest's capture, so that the guest's log has it.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Samples `dev.in_flight()` until `done`, keeping the highest.
fn sample_peak(dev: &CryptoDevice, done: &Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let (dev, done) = (dev.clone(), done.clone());
    tokio::spawn(async move {
        let mut peak = 0;
        while !done.load(Ordering::Acquire) {
            peak = peak.max(dev.in_flight());
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        peak
    })
}

/// ≥ 4x as many small CBC requests as the device's queue holds, all
/// released at once: each waits for room in the ring (none lost), all
/// match the CPU within a bound, nothing is left in flight and every DMA
/// unit comes back. (The driver lost requests past the ring before the
/// fix: issue 15.)
#[test]
fn four_times_the_queue_depth_at_once_on_every_device() {
    on_devices(usize::MAX, async |address, dev| {
        let idle = dev.dma_units_in_use();
        let depth = dev.queue_depth();
        let n = 4 * depth;
        let k = key(16, 11);
        let s = Arc::new(dev.cipher_session(CipherAlgo::AesCbc, &k).await.unwrap());
        // Inputs and the CPU's results made first (slow under TCG).
        let jobs: Vec<(Vec<u8>, [u8; 16], Vec<u8>)> = (0..n)
            .map(|i| {
                let plain: Vec<u8> = (0..16 * (1 + i % 16)).map(|j| (i ^ j) as u8).collect();
                let iv = [(i % 251) as u8; 16];
                let mut want = plain.clone();
                reference(CipherAlgo::AesCbc, true, &k, &iv, &mut want);
                (plain, iv, want)
            })
            .collect();
        let (gate, opened) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::with_capacity(n);
        for (plain, iv, want) in jobs {
            let (s, mut opened) = (s.clone(), opened.clone());
            tasks.push(tokio::spawn(async move {
                let _ = opened.wait_for(|&open| open).await;
                (s.encrypt(&iv, plain).await, want)
            }));
        }
        let done = Arc::new(AtomicBool::new(false));
        let peak = sample_peak(&dev, &done);
        let start = Instant::now();
        gate.send_replace(true);
        let all = tokio::time::timeout(Duration::from_secs(120), async {
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{address}: requests still waiting after 120 s: {}",
                dev.diagnose()
            )
        });
        let took = start.elapsed();
        done.store(true, Ordering::Release);
        let peak = peak.await.unwrap();
        let waits = dev.queue_full_count();
        for (i, (got, want)) in all.into_iter().enumerate() {
            assert!(got.unwrap() == want, "{address}: request {i} wrong");
        }
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        note(&format!(
            "{address}: {n} CBC requests of 16-256 B at once (4x the queue depth of {depth}): \
             all right in {:.0} ms ({:.0} requests/s), at most {peak} sampled in the device, \
             {waits} times the ring was full",
            took.as_secs_f64() * 1e3,
            n as f64 / took.as_secs_f64()
        ));
        // Tasks submit one by one, and under TCG the device drains the ring
        // as fast as they do: a burst of the same 4x finds it full (it
        // stages what fits, the rest waits for room).
        let mut burst = Vec::with_capacity(n);
        let mut wants = Vec::with_capacity(n);
        for i in 0..n {
            let plain: Vec<u8> = (0..16 * (1 + i % 16))
                .map(|j| ((i * 3) ^ j) as u8)
                .collect();
            let iv = [(i % 239) as u8; 16];
            let mut want = plain.clone();
            reference(CipherAlgo::AesCbc, true, &k, &iv, &mut want);
            burst.push(s.prepare(true, &iv, &plain).await.unwrap());
            wants.push(want);
        }
        let before = dev.queue_full_count();
        let start = Instant::now();
        let done = tokio::time::timeout(Duration::from_secs(120), s.run_burst(burst))
            .await
            .unwrap_or_else(|_| panic!("{address}: the burst hung: {}", dev.diagnose()))
            .unwrap();
        let took = start.elapsed();
        for (i, (r, want)) in done.iter().zip(&wants).enumerate() {
            let mut out = vec![0u8; want.len()];
            r.output(&mut out).unwrap();
            assert!(&out == want, "{address}: burst request {i} wrong");
        }
        let waits = dev.queue_full_count() - before;
        drop(done);
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        note(&format!(
            "{address}: a burst of {n} (4x the queue depth): all right in {:.0} ms, \
             {waits} times the ring was full",
            took.as_secs_f64() * 1e3
        ));
        assert!(waits > 0, "{address}: the burst never found the ring full");
    });
}

/// Three concurrent 8 MiB AES-256-XTS requests in 4 KiB data units — six
/// times the whole DMA pool — each keeping a bounded window of units in
/// flight: all complete (before the fix, none did in 240 s), match the CPU,
/// and every DMA unit comes back. Then 16 concurrent 1 MiB requests, whose
/// windows together need more than the pool: a request that finds it full
/// collects its oldest unit instead of waiting while it holds some.
#[test]
fn xts_units_needing_more_than_the_whole_pool_complete_on_every_device() {
    on_devices(usize::MAX, async |address, dev| {
        let idle = dev.dma_units_in_use();
        let k = key(64, 12);
        let s = Arc::new(dev.cipher_session(CipherAlgo::AesXts, &k).await.unwrap());
        let len = 8 << 20;
        assert!(3 * len > 4 * dev.pool_bytes());
        let many = run_xts(&dev, &s, &k, 16, 1 << 20).await;
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        note(&format!(
            "{address}: 16 x 1 MiB AES-256-XTS in 4 KiB units at once (their windows need \
             {} KiB of a {} KiB pool): all right in {:.0} ms",
            (16 * crypto_offload_vfio::UNITS_IN_FLIGHT * s.request_bytes(4096)) >> 10,
            dev.pool_bytes() >> 10,
            many.as_secs_f64() * 1e3
        ));
        let done = Arc::new(AtomicBool::new(false));
        let peak = sample_peak(&dev, &done);
        let took = run_xts(&dev, &s, &k, 3, len).await;
        done.store(true, Ordering::Release);
        let peak = peak.await.unwrap();
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        note(&format!(
            "{address}: 3 x 8 MiB AES-256-XTS in 4 KiB units ({} units, {:.1}x the {} KiB DMA pool) \
             at once: all right in {:.0} ms ({:.1} MB/s), at most {peak} units sampled in the device",
            3 * len / 4096,
            (3 * len) as f64 / dev.pool_bytes() as f64,
            dev.pool_bytes() >> 10,
            took.as_secs_f64() * 1e3,
            (3 * len) as f64 / took.as_secs_f64() / 1e6
        ));
    });
}

/// `n` concurrent XTS requests of `len` bytes in 4 KiB units on `s`, each
/// checked against the CPU; how long they took.
async fn run_xts(
    dev: &CryptoDevice,
    s: &Arc<crypto_offload_vfio::CipherSession>,
    k: &[u8],
    n: u8,
    len: usize,
) -> Duration {
    let jobs: Vec<(Vec<u8>, [u8; 16], Vec<u8>)> = (0..n)
        .map(|i| {
            let plain: Vec<u8> = (0..len).map(|j| (j as u8).wrapping_mul(11) ^ i).collect();
            let first = [i.wrapping_mul(17); 16];
            let mut want = plain.clone();
            let t0 = u128::from_le_bytes(first);
            for (u, unit) in want.chunks_mut(4096).enumerate() {
                let tweak = t0.wrapping_add(u as u128).to_le_bytes();
                reference(CipherAlgo::AesXts, true, k, &tweak, unit);
            }
            (plain, first, want)
        })
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = jobs
        .into_iter()
        .map(|(plain, first, want)| {
            let s = s.clone();
            tokio::spawn(async move { (s.crypt_units(true, &first, 4096, plain).await, want) })
        })
        .collect();
    let all = tokio::time::timeout(Duration::from_secs(240), async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
    .await
    .unwrap_or_else(|_| panic!("XTS requests deadlocked: {}", dev.diagnose()));
    let took = start.elapsed();
    for (i, (got, want)) in all.into_iter().enumerate() {
        assert!(got.unwrap() == want, "XTS request {i} wrong");
    }
    took
}

/// Suspends and resumes race session creation and requests on the real
/// device: a register access in D3hot is a SIGBUS (the test binary would
/// die), and a session once made is never lost to a suspend.
#[test]
fn suspend_racing_submissions_never_touches_a_suspended_device() {
    on_devices(1, async |address, dev| {
        let k = key(16, 13);
        let mut want = vec![3u8; 256];
        reference(CipherAlgo::AesCbc, true, &k, &[0; 16], &mut want);
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let users: Vec<_> = (0..2u64)
            .map(|u| {
                let (dev, k, want, stop, served) = (
                    dev.clone(),
                    k.clone(),
                    want.clone(),
                    stop.clone(),
                    served.clone(),
                );
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Acquire) {
                        i += 1;
                        for _ in 0..(i * 7 + u) % 5 {
                            tokio::task::yield_now().await;
                        }
                        let Ok(s) = dev.cipher_session(CipherAlgo::AesCbc, &k).await else {
                            continue;
                        };
                        let got = s.encrypt(&[0; 16], vec![3; 256]).await.unwrap();
                        assert!(got == want);
                        served.fetch_add(1, Ordering::Relaxed);
                        s.close().await.unwrap();
                    }
                })
            })
            .collect();
        let (mut cycles, mut refused) = (0, 0);
        let start = Instant::now();
        while cycles < 40 && start.elapsed() < Duration::from_secs(20) {
            match dev.suspend().await {
                Ok(()) => {
                    cycles += 1;
                    tokio::task::yield_now().await;
                    dev.resume().unwrap();
                }
                Err(Error::Invalid { .. }) => {
                    refused += 1;
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("{address}: {e}"),
            }
        }
        stop.store(true, Ordering::Release);
        for u in users {
            u.await.unwrap();
        }
        let served = served.load(Ordering::Relaxed);
        note(&format!(
            "{address}: {cycles} suspend/resume cycles raced {served} sessions \
             ({refused} suspends refused while a session lived) in {:.1} s",
            start.elapsed().as_secs_f64()
        ));
        assert!(
            cycles > 0 && served > 0,
            "{cycles} cycles, {served} sessions"
        );
        assert!(!dev.is_suspended());
    });
}

/// What a child process inherits: its descriptors as `ls -l /proc/self/fd`
/// lists them (`N -> target`), run while `hold` is alive.
fn child_fds() -> Vec<String> {
    let out = std::process::Command::new("/bin/busybox")
        .args(["ls", "-l", "/proc/self/fd"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .expect("busybox ls");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" -> ").map(|(_, t)| t.to_owned()))
        .collect()
}

/// A program the server execs gets none of the device's descriptors (the
/// VFIO device and group, the interrupt and removal eventfds).
#[test]
fn a_child_process_inherits_no_device_descriptor() {
    on_devices(1, async |address, dev| {
        let s = dev
            .cipher_session(CipherAlgo::AesCbc, &[5; 16])
            .await
            .unwrap();
        s.encrypt(&[0; 16], vec![1; 64]).await.unwrap();
        let ours: Vec<String> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.display().to_string())
            .collect();
        assert!(
            ours.iter().any(|t| t.starts_with("/dev/vfio")),
            "this process holds no VFIO descriptor: {ours:?}"
        );
        let inherited = child_fds();
        note(&format!(
            "{address}: a child process started with {inherited:?}"
        ));
        for t in &inherited {
            assert!(
                !(t.contains("vfio") || t.starts_with("anon_inode") || t.starts_with("socket")),
                "{address}: a child inherited {t}"
            );
        }
    });
}

/// The first thing to check on a new machine: one session and one request,
/// each within 10 s, with the device's state printed if not.
#[test]
fn a_first_request_completes() {
    on_devices(usize::MAX, async |address, dev| {
        eprintln!("{address}: opened: {}", dev.diagnose());
        let within = std::time::Duration::from_secs(10);
        let s = match tokio::time::timeout(within, dev.cipher_session(CipherAlgo::AesCbc, &[1; 16]))
            .await
        {
            Ok(s) => s.unwrap(),
            Err(_) => panic!("{address}: no session within 10 s: {}", dev.diagnose()),
        };
        match tokio::time::timeout(within, s.encrypt(&[0; 16], vec![0; 16])).await {
            Ok(r) => {
                let mut want = vec![0u8; 16];
                reference(CipherAlgo::AesCbc, true, &[1; 16], &[0; 16], &mut want);
                assert_eq!(r.unwrap(), want);
            }
            Err(_) => panic!("{address}: no completion within 10 s: {}", dev.diagnose()),
        }
        // CTR with a partial last block: the device refuses it (status
        // ERR); the driver pads to whole blocks.
        let c = dev
            .cipher_session(CipherAlgo::AesCtr, &[2; 16])
            .await
            .unwrap();
        let mut want = vec![3u8; 20];
        reference(CipherAlgo::AesCtr, true, &[2; 16], &[0; 16], &mut want);
        assert_eq!(c.encrypt(&[0; 16], vec![3; 20]).await.unwrap(), want);
    });
}

#[test]
fn every_mode_and_key_size_matches_the_fallback_on_every_device() {
    on_devices(usize::MAX, async |address, dev| {
        eprintln!("{address}: {:?}", dev.config());
        for algo in CipherAlgo::ALL {
            for &key_len in algo.key_lens() {
                let k = key(key_len, key_len as u8);
                let s = match dev.cipher_session(algo, &k).await {
                    Ok(s) => s,
                    Err(e) => panic!("{address} {algo:?} {key_len}-byte key: {e}"),
                };
                let iv: Vec<u8> = (0..algo.iv_len() as u8).collect();
                for len in [16usize, 32, 48, 512, 4096, 65536] {
                    let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                    let mut want = plain.clone();
                    reference(algo, true, &k, &iv, &mut want);
                    let got = s.encrypt(&iv, plain.clone()).await.unwrap();
                    assert!(got == want, "{address} {algo:?} {key_len} encrypt {len}");
                    let back = s.decrypt(&iv, got).await.unwrap();
                    assert!(back == plain, "{address} {algo:?} {key_len} decrypt {len}");
                }
            }
        }
    });
}

#[test]
fn long_requests_chain_and_xts_units_take_consecutive_tweaks() {
    on_devices(1, async |_address, dev| {
        let idle = dev.dma_units_in_use();
        // Past MAX_REQUEST: pieces with the IV chained.
        for algo in [CipherAlgo::AesCbc, CipherAlgo::AesCtr, CipherAlgo::AesEcb] {
            let k = key(16, 5);
            let s = dev.cipher_session(algo, &k).await.unwrap();
            let iv = vec![0xfe; algo.iv_len()];
            let len = 3 * crypto_offload_vfio::MAX_REQUEST + 48;
            let plain: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut want = plain.clone();
            reference(algo, true, &k, &iv, &mut want);
            let got = s.encrypt(&iv, plain.clone()).await.unwrap();
            assert!(got == want, "{algo:?} {len} bytes chained");
            assert!(s.decrypt(&iv, got).await.unwrap() == plain);
        }
        // A session's Debug names the device and the algorithm, never the
        // key (0xa7 = 167).
        let mut marked = vec![0xa7u8; 64];
        marked[40] = 0x11;
        let s = dev
            .cipher_session(CipherAlgo::AesXts, &marked)
            .await
            .unwrap();
        let shown = format!("{s:?}");
        for needle in ["a7", "A7", "167"] {
            assert!(!shown.contains(needle), "{shown}");
        }
        drop(s);
        // XTS: 16 sectors of 512 bytes, tweaks carrying across a byte.
        let k = key(64, 6);
        let x = dev.cipher_session(CipherAlgo::AesXts, &k).await.unwrap();
        let mut first = [0u8; 16];
        first[0] = 0xf8;
        let plain: Vec<u8> = (0..16 * 512).map(|i| (i * 3) as u8).collect();
        let got = x
            .crypt_units(true, &first, 512, plain.clone())
            .await
            .unwrap();
        let t0 = u128::from_le_bytes(first);
        for (i, (unit, out)) in plain.chunks(512).zip(got.chunks(512)).enumerate() {
            let mut want = unit.to_vec();
            let tweak = t0.wrapping_add(i as u128).to_le_bytes();
            reference(CipherAlgo::AesXts, true, &k, &tweak, &mut want);
            assert!(out == want.as_slice(), "unit {i}");
        }
        let back = x.crypt_units(false, &first, 512, got).await.unwrap();
        assert!(back == plain);
        let f = x.crypt_units(true, &first, 500, plain).await.unwrap_err();
        assert!(matches!(
            f.error,
            Error::Invalid {
                what: "data unit",
                ..
            }
        ));
        assert_eq!(dev.dma_units_in_use(), idle);
    });
}

#[test]
fn sixty_four_requests_in_flight_on_one_session() {
    on_devices(usize::MAX, async |_address, dev| {
        let idle = dev.dma_units_in_use();
        let k = key(16, 1);
        let s = std::sync::Arc::new(dev.cipher_session(CipherAlgo::AesCbc, &k).await.unwrap());
        let tasks: Vec<_> = (0..64u8)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    let plain = vec![i; 1024 + 16 * usize::from(i)];
                    let iv = [i; 16];
                    (plain.clone(), iv, s.encrypt(&iv, plain).await)
                })
            })
            .collect();
        for t in tasks {
            let (plain, iv, got) = t.await.unwrap();
            let mut want = plain;
            reference(CipherAlgo::AesCbc, true, &k, &iv, &mut want);
            assert!(got.unwrap() == want);
        }
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
    });
}

/// Polls `f` once (submitting its request) and drops it.
fn poll_once_and_drop<F: Future>(f: F) {
    let mut f = pin!(f);
    let _ = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
}

#[test]
fn dropped_requests_free_their_memory_only_after_the_device_completes() {
    on_devices(usize::MAX, async |_address, dev| {
        let idle = dev.dma_units_in_use();
        let s = dev
            .cipher_session(CipherAlgo::AesCtr, &key(32, 3))
            .await
            .unwrap();
        for _ in 0..200 {
            poll_once_and_drop(s.encrypt(&[9; 16], vec![5; 8192]));
        }
        // The device still completes them; then all is returned.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while dev.in_flight() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(dev.in_flight(), 0, "completions never came");
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        // And the session still works.
        let mut want = vec![1u8; 100];
        reference(CipherAlgo::AesCtr, true, &key(32, 3), &[2; 16], &mut want);
        assert_eq!(s.encrypt(&[2; 16], vec![1; 100]).await.unwrap(), want);
    });
}

/// A small deterministic generator (xorshift64*) for the drop points.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// How a request of [`requests_dropped_at_random_points_lose_nothing`]
/// ended.
#[derive(Debug, Default)]
struct Ends {
    completed: usize,
    dropped: usize,
}

/// Under load (eight tasks, single requests and bursts on two sessions),
/// each request is dropped at a random point — after its first poll, or
/// at a random deadline of up to 2 ms, before or after the device took
/// it — or runs to the end. Those that complete are right; once the device
/// has completed the rest, nothing is in flight and every DMA unit is back;
/// and both sessions still compute right.
#[test]
fn requests_dropped_at_random_points_lose_nothing() {
    on_devices(usize::MAX, async |address, dev| {
        let idle = dev.dma_units_in_use();
        let k = key(16, 7);
        let sessions = [
            std::sync::Arc::new(dev.cipher_session(CipherAlgo::AesCbc, &k).await.unwrap()),
            std::sync::Arc::new(dev.cipher_session(CipherAlgo::AesCbc, &k).await.unwrap()),
        ];
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let s = sessions[t as usize % 2].clone();
                let k = k.clone();
                tokio::spawn(async move {
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    let mut ends = Ends::default();
                    for i in 0..64u64 {
                        let len = 16 * (1 + next(&mut rng) as usize % 512);
                        let plain: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ t) as u8).collect();
                        let iv = [(i ^ t) as u8; 16];
                        let mut want = plain.clone();
                        reference(CipherAlgo::AesCbc, true, &k, &iv, &mut want);
                        let how = next(&mut rng) % 4;
                        let deadline = std::time::Duration::from_micros(next(&mut rng) % 2000);
                        if how == 0 {
                            poll_once_and_drop(s.encrypt(&iv, plain));
                            ends.dropped += 1;
                            continue;
                        }
                        let got = if how == 1 {
                            // A burst of four copies of the request.
                            let mut burst = Vec::new();
                            for _ in 0..4 {
                                burst.push(s.prepare(true, &iv, &plain).await.unwrap());
                            }
                            let run = s.run_burst(burst);
                            match tokio::time::timeout(deadline, run).await {
                                Err(_) => None,
                                Ok(done) => {
                                    let done = done.unwrap();
                                    for r in &done {
                                        r.result().unwrap();
                                        let mut out = vec![0; len];
                                        r.output(&mut out).unwrap();
                                        assert!(out == want, "burst request {i} of task {t}");
                                    }
                                    Some(())
                                }
                            }
                        } else {
                            match tokio::time::timeout(deadline, s.encrypt(&iv, plain)).await {
                                Err(_) => None,
                                Ok(got) => {
                                    assert!(got.unwrap() == want, "request {i} of task {t}");
                                    Some(())
                                }
                            }
                        };
                        match got {
                            Some(()) => ends.completed += 1,
                            None => ends.dropped += 1,
                        }
                    }
                    ends
                })
            })
            .collect();
        let mut ends = Ends::default();
        for t in tasks {
            let e = t.await.unwrap();
            ends.completed += e.completed;
            ends.dropped += e.dropped;
        }
        eprintln!("{address}: {ends:?}");
        assert!(ends.dropped > 0 && ends.completed > 0, "{ends:?}");
        // The device completes what was dropped; then all is returned.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while dev.in_flight() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(dev.in_flight(), 0, "completions never came");
        assert_eq!(dev.dma_units_in_use(), idle, "DMA memory leaked");
        for s in &sessions {
            let mut want = vec![3u8; 4096];
            reference(CipherAlgo::AesCbc, true, &k, &[4; 16], &mut want);
            assert!(s.encrypt(&[4; 16], vec![3; 4096]).await.unwrap() == want);
        }
    });
}

#[test]
fn bad_input_is_a_typed_error_with_the_buffer_back() {
    on_devices(1, async |_address, dev| {
        for len in [0usize, 15, 17, 33, 65] {
            let e = dev
                .cipher_session(CipherAlgo::AesCbc, &vec![0; len])
                .await
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Invalid {
                        what: "key length",
                        ..
                    }
                ),
                "{len}: {e}"
            );
        }
        let s = dev
            .cipher_session(CipherAlgo::AesCbc, &[1; 16])
            .await
            .unwrap();
        let f = s.encrypt(&[0; 12], vec![3; 32]).await.unwrap_err();
        assert!(matches!(
            f.error,
            Error::Invalid {
                what: "IV length",
                ..
            }
        ));
        assert_eq!(f.buf, vec![3; 32]);
        let f = s.encrypt(&[0; 16], vec![3; 33]).await.unwrap_err();
        assert!(matches!(f.error, Error::Invalid { what: "length", .. }));
        assert_eq!(f.buf, vec![3; 33]);
        let x = dev
            .cipher_session(CipherAlgo::AesXts, &key(32, 9))
            .await
            .unwrap();
        let f = x.encrypt(&[0; 16], vec![3; 15]).await.unwrap_err();
        assert!(matches!(f.error, Error::Invalid { .. }));
        assert!(s.encrypt(&[0; 16], Vec::new()).await.unwrap().is_empty());
    });
}

#[test]
fn a_reset_fails_requests_in_flight_with_their_buffers_back() {
    on_devices(1, async |_address, dev| {
        let s = std::sync::Arc::new(
            dev.cipher_session(CipherAlgo::AesCbc, &[4; 16])
                .await
                .unwrap(),
        );
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.encrypt(&[0; 16], vec![6; 65536]).await })
            })
            .collect();
        tokio::task::yield_now().await;
        dev.reset().unwrap();
        let mut want = vec![6u8; 65536];
        reference(CipherAlgo::AesCbc, true, &[4; 16], &[0; 16], &mut want);
        let (mut done, mut failed) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(out) => {
                    assert!(out == want, "a completed request is correct");
                    done += 1;
                }
                Err(f) => {
                    assert!(matches!(f.error, Error::Gone), "{}", f.error);
                    assert!(f.buf == vec![6; 65536], "the buffer comes back unchanged");
                    failed += 1;
                }
            }
        }
        eprintln!("reset with 32 in flight: {done} completed, {failed} failed");
        assert!(dev.is_gone());
        assert_eq!(dev.in_flight(), 0);
    });
}

/// `power/runtime_status` and `power_state` of the device in sysfs.
fn pci_power(address: &str) -> (String, String) {
    let dev = std::path::Path::new("/sys/bus/pci/devices").join(address);
    let read = |f: &str| {
        std::fs::read_to_string(dev.join(f))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    (read("power/runtime_status"), read("power_state"))
}

/// Waits (up to 2 s) for the device to reach `want`.
async fn settles(address: &str, want: (&str, &str)) -> (String, String) {
    let start = std::time::Instant::now();
    loop {
        let now = pci_power(address);
        if (now.0.as_str(), now.1.as_str()) == want || start.elapsed().as_secs() >= 2 {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[test]
fn suspend_and_resume_cycle_the_pci_power_state() {
    on_devices(1, async |address, dev| {
        assert_eq!(pci_power(address), ("active".into(), "D0".into()));
        let s = dev
            .cipher_session(CipherAlgo::AesCbc, &[8; 16])
            .await
            .unwrap();
        let e = dev.suspend().await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Invalid {
                    what: "suspend",
                    ..
                }
            ),
            "{e}"
        );
        s.close().await.unwrap();
        dev.suspend().await.unwrap();
        assert_eq!(
            settles(address, ("suspended", "D3hot")).await,
            ("suspended".into(), "D3hot".into())
        );
        let e = dev
            .cipher_session(CipherAlgo::AesCbc, &[8; 16])
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Device(_)),
            "a suspended device takes nothing: {e}"
        );
        dev.resume().unwrap();
        assert_eq!(
            settles(address, ("active", "D0")).await,
            ("active".into(), "D0".into())
        );
        // Set up again from scratch: sessions and requests work.
        for round in 0..2 {
            let s = dev
                .cipher_session(CipherAlgo::AesCbc, &[8; 16])
                .await
                .unwrap();
            let mut want = vec![round; 4096];
            reference(CipherAlgo::AesCbc, true, &[8; 16], &[1; 16], &mut want);
            assert_eq!(s.encrypt(&[1; 16], vec![round; 4096]).await.unwrap(), want);
            s.close().await.unwrap();
            dev.suspend().await.unwrap();
            dev.resume().unwrap();
        }
    });
}

/// 32 random requests (every mode, both ends of its key sizes, any IV, up
/// to 70,000 bytes) on the first device, each against the RustCrypto
/// reference, and decrypted back. One device and one runtime for all of
/// them, a session each (the other tests open and close the device): with
/// a device opened for every case, as this test first was, this binary
/// took 76 s of the vfio run under TCG, 66 s after (one run each). A case
/// that fails or panics drops the device, and the next case opens it
/// anew: a device left wedged by one case must not fail the next ones
/// (and the shrinking) in its name.
#[test]
fn differential_against_the_fallback() {
    let devices = guest_devices();
    let Some(address) = devices.first() else {
        return;
    };
    let _turn = exclusive();
    let rt = rt();
    let device = SharedDevice::new(None);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let inputs = (
        prop::sample::select(CipherAlgo::ALL.to_vec()),
        any::<bool>(),
        any::<u8>(),
        any::<[u8; 16]>(),
        0usize..70_000,
    );
    runner
        .run(&inputs, |(algo, long_key, seed, iv, len)| {
            let key_len = if long_key {
                *algo.key_lens().last().unwrap()
            } else {
                algo.key_lens()[0]
            };
            let k = key(key_len, seed);
            let iv = &iv[..algo.iv_len()];
            let len = valid_len(algo, len);
            let plain: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
            let mut want = plain.clone();
            reference(algo, true, &k, iv, &mut want);
            let dev = device
                .borrow_mut()
                .get_or_insert_with(|| Arc::new(rt.block_on(CryptoDevice::open(address)).unwrap()))
                .clone();
            // Drops the device unless the case passes.
            let reset = ResetOnFailure(&device, false);
            let (got, back) = rt.block_on(async {
                let s = dev.cipher_session(algo, &k).await.unwrap();
                let got = s.encrypt(iv, plain.clone()).await.unwrap();
                let back = s.decrypt(iv, got.clone()).await.unwrap();
                s.close().await.unwrap();
                (got, back)
            });
            drop(dev);
            prop_assert!(
                got == want,
                "{:?} {}-byte key, {} bytes",
                algo,
                key_len,
                len
            );
            prop_assert!(back == plain);
            reset.passed();
            Ok(())
        })
        .unwrap();
}

/// The device the differential cases share, opened when a case needs it.
type SharedDevice = std::cell::RefCell<Option<Arc<CryptoDevice>>>;

/// Empties the cell of the shared device when dropped before
/// [`ResetOnFailure::passed`]: on a failed assertion or a panic.
struct ResetOnFailure<'a>(&'a SharedDevice, bool);

impl ResetOnFailure<'_> {
    fn passed(mut self) {
        self.1 = true;
    }
}

impl Drop for ResetOnFailure<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.borrow_mut().take();
        }
    }
}
