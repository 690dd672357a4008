//! Our userspace virtio-crypto driver against the peer, DPDK's
//! `crypto_virtio` PMD, on the same kind of device in one run: AES-128-CBC
//! encrypt, ops/s per request size, side by side with the ratio.
//!
//! * **ours, burst**: [`CipherSession::run_burst`] with requests prepared in
//!   the driver's DMA memory (the zero-copy path, as DPDK's mbufs), bursts of
//!   `--burst`, `--bursts` of them in flight, on a single-threaded runtime
//!   (DPDK polls on one core too);
//! * **ours, per request**: `--clients` tasks each awaiting
//!   [`CipherSession::encrypt`] on its own `Vec` (copied in and out: the
//!   everyday API);
//! * **through `Offload`**: the same `--clients` tasks each awaiting
//!   `crypto_offload::CipherSession::encrypt` on its own `Vec` — the path
//!   users call, with its selection, engine adapter and copies — pinned to
//!   the device, and under Auto (the CPU a backend too, calibrated first);
//!   with the process's CPU time per request;
//! * **the floor**: the same `--clients` tasks each awaiting a request that
//!   an engine of no cost answers at once, in batches, from one poller
//!   task ([`Floor`]) — what the task-per-request shape alone costs on this
//!   runtime and machine, the bound on any everyday-API row;
//! * **DPDK**: `dpdk-test-crypto-perf --ptest throughput` (burst 32,
//!   polling), run by the guest's `/bin/dpdk-crypto-perf` script on a device
//!   the kernel driver held; its table is printed as it came and parsed.
//!
//! DPDK cannot negotiate VIRTIO_F_ACCESS_PLATFORM, so it runs on a device
//! without the IOMMU (`iommu_platform=off`: guest-physical addresses, from
//! huge pages). Ours runs on that same device (`--pa-device`, taken from
//! the kernel driver and given back; our pool then sits in a huge page at
//! its physical address) — the like-for-like comparison — and on a device
//! behind the emulated IOMMU (`--device`, `iommu_platform=on`), where QEMU
//! translates every buffer address, which costs the device several times
//! more per request. Each output of ours is first checked against the CPU.
//!
//! In the QEMU guest (`cargo xtask vm-test --run vfio`, step
//! `vfio-vs-dpdk`), or on a machine with devices bound to vfio-pci:
//! `vfio-vs-dpdk [--device BDF] [--dpdk-device BDF|none] [--sizes 64,256,1024,2048] [--ops N]`

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use clap::Parser;
use cpu_time::ProcessTime;
use crypto_offload::backend::Backend;
use crypto_offload::vfio::VfioBackend;
use crypto_offload::{CipherAlg, DeviceBuf, Offload};
use crypto_offload_vfio::{CipherAlgo, CipherSession, CryptoDevice, DmaBuffer};

#[derive(Parser, Debug)]
#[command(about = "Our VFIO virtio-crypto driver vs DPDK's crypto_virtio PMD, AES-128-CBC ops/s")]
struct Args {
    /// Our device (bound to vfio-pci) [default: the first of
    /// $VMTEST_VFIO_DEVICES].
    #[arg(long)]
    device: Option<String>,
    /// DPDK's device (handed to vfio-pci by the script, then given back)
    /// [default: the first of $VMTEST_VIRTIO_DEVICES]; `none` skips DPDK.
    #[arg(long)]
    dpdk_device: Option<String>,
    /// A device without ACCESS_PLATFORM for ours too (taken from its
    /// driver for vfio-pci, then given back) [default: DPDK's]; `none`
    /// skips it.
    #[arg(long)]
    pa_device: Option<String>,
    /// Request sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,2048")]
    sizes: Vec<usize>,
    /// Operations per size (ours in bursts, and DPDK's).
    #[arg(long, default_value_t = 200_000)]
    ops: u64,
    /// Operations per size through the per-request API [default: a tenth
    /// of --ops].
    #[arg(long)]
    single_ops: Option<u64>,
    /// Requests per burst (ours; DPDK's is 32).
    #[arg(long, default_value_t = 32)]
    burst: usize,
    /// Bursts in flight at once (ours), at most what the DMA pool and the
    /// ring hold ([`bursts_for`]). DPDK keeps its queue full (its
    /// enqueues fail on a full ring hundreds of thousands of times a run);
    /// 24 x 32 = 768 in flight is the like-for-like depth (measured: 4
    /// bursts gave 13-25% less at 64 B-2 KiB than 24).
    #[arg(long, default_value_t = 24)]
    bursts: usize,
    /// Concurrent clients of the per-request API.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Also time the primitives the driver's per-request path is made of
    /// (what they cost in this machine, e.g. under TCG) and the floor's
    /// row at each size; with no device given or listed, only these.
    #[arg(long)]
    primitives: bool,
    /// Only these rows of ours (e.g. `pinned-buf`, to profile one path):
    /// `burst`, `floor`, `drv-vec`, `drv-buf`, `pinned-vec`, `pinned-buf`,
    /// `auto-vec`, `auto-buf`; the others read 0 [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The script that runs dpdk-test-crypto-perf.
    #[arg(long, default_value = "/bin/dpdk-crypto-perf")]
    dpdk_script: String,
}

const KEY: [u8; 16] = [0x2b; 16];
const IV: [u8; 16] = [0x0f; 16];

fn first_of(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.split_whitespace().next().map(str::to_owned))
}

fn cpu_cbc(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    crypto_offload_fallback::Cbc::new(&KEY)
        .and_then(|c| c.encrypt(&IV, &mut out))
        .expect("whole blocks");
    out
}

/// The bursts of `burst` requests that fit in flight at once, up to
/// `wanted`: within three quarters of the device's DMA pool (its rings
/// live there too; the pool of a device without the IOMMU is one 2 MiB
/// huge page), each request taking `request_bytes`, and within the
/// 1,024-entry ring. Preparing more would wait for pool room that never
/// comes.
fn bursts_for(wanted: usize, burst: usize, request_bytes: usize, pool_bytes: usize) -> usize {
    let by_memory = pool_bytes * 3 / 4 / (request_bytes * burst).max(1);
    let by_ring = 1024 / burst.max(1);
    wanted.min(by_memory).min(by_ring).max(1)
}

/// Ops/s of up to `--bursts` tasks each running bursts of `burst` prepared
/// requests until `ops` have completed; every output checked once first.
async fn ours_burst(
    session: Rc<CipherSession>,
    pool_bytes: usize,
    size: usize,
    args: &Args,
) -> f64 {
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let expected = cpu_cbc(&data);
    let bursts = bursts_for(
        args.bursts,
        args.burst,
        session.request_bytes(size),
        pool_bytes,
    );
    eprintln!(
        "ours, {size} B: {bursts} bursts of {} in flight",
        args.burst
    );
    let mut sets = Vec::new();
    for _ in 0..bursts {
        let mut set = Vec::with_capacity(args.burst);
        for _ in 0..args.burst {
            set.push(session.prepare(true, &IV, &data).await.expect("prepare"));
        }
        let set = session.run_burst(set).await.expect("a burst");
        for r in &set {
            let mut out = vec![0; size];
            r.output(&mut out).expect("a result");
            assert_eq!(out, expected, "device output differs from the CPU's");
        }
        sets.push(set);
    }
    let per_task = args.ops.div_ceil(bursts as u64);
    let start = Instant::now();
    let tasks: Vec<_> = sets
        .into_iter()
        .map(|mut set| {
            let session = session.clone();
            tokio::task::spawn_local(async move {
                let mut done = 0;
                while done < per_task {
                    set = session.run_burst(set).await.expect("a burst");
                    done += set.len() as u64;
                }
                for r in &set {
                    r.result().expect("the device refused a request");
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("a burst task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// Ops/s and process CPU time per request (µs) of `clients` tasks each
/// awaiting one request at a time (`request` on its own buffer, made by
/// `make` from the data and read by `view`) until `ops` have completed;
/// the first output checked against the CPU's.
async fn clients<S, B, M, V, F, Fut>(
    session: S,
    size: usize,
    (clients, ops): (usize, u64),
    make: M,
    view: V,
    request: F,
) -> Rate
where
    S: Clone + 'static,
    B: 'static,
    M: Fn(&[u8]) -> B,
    V: Fn(&B) -> Vec<u8>,
    F: Fn(S, B) -> Fut + Copy + 'static,
    Fut: Future<Output = B>,
{
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let expected = cpu_cbc(&data);
    let out = request(session.clone(), make(&data)).await;
    assert!(view(&out) == expected, "output differs from the CPU's");
    let per_task = ops.div_ceil(clients as u64);
    let bufs: Vec<B> = (0..clients).map(|_| make(&data)).collect();
    let (start, cpu) = (Instant::now(), ProcessTime::now());
    let tasks: Vec<_> = bufs
        .into_iter()
        .map(|mut buf| {
            let session = session.clone();
            tokio::task::spawn_local(async move {
                for _ in 0..per_task {
                    buf = request(session.clone(), buf).await;
                }
                per_task
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("a client");
    }
    Rate {
        ops: total as f64 / start.elapsed().as_secs_f64(),
        cpu_us: cpu.elapsed().as_secs_f64() * 1e6 / total as f64,
    }
}

/// A throughput and its CPU cost.
#[derive(Debug, Clone, Copy, Default)]
struct Rate {
    /// Requests per second.
    ops: f64,
    /// Process CPU time per request, µs.
    cpu_us: f64,
}

/// The driver's everyday API: `clients` tasks each awaiting
/// [`CipherSession::encrypt`] on a `Vec`.
async fn ours_per_request(session: Rc<CipherSession>, size: usize, args: &Args) -> Rate {
    let load = (args.clients, args.single_ops.unwrap_or(args.ops / 10));
    clients(
        session,
        size,
        load,
        <[u8]>::to_vec,
        Vec::clone,
        |s, buf| async move { s.encrypt(&IV, buf).await.expect("a request") },
    )
    .await
}

/// The same on the device's own memory ([`CipherSession::encrypt_buffer`]
/// on a `DmaBuffer`: nothing copied).
async fn ours_on_buffers(
    session: Rc<CipherSession>,
    dev: &CryptoDevice,
    size: usize,
    args: &Args,
) -> Rate {
    let load = (args.clients, args.single_ops.unwrap_or(args.ops / 10));
    // Device buffers may take half the pool: more clients than fit skip
    // the row (a panic here would exit with requests in flight).
    let held: Vec<DmaBuffer> = (0..=args.clients)
        .map_while(|_| dev.try_buffer(size).ok().flatten())
        .collect();
    let fit = held.len();
    drop(held);
    if fit <= args.clients {
        eprintln!(
            "drv-buf, {size} B: room for {fit} device buffers, not {} clients + 1: row skipped",
            args.clients
        );
        return Rate::default();
    }
    let make = |data: &[u8]| {
        let mut b = dev
            .try_buffer(data.len())
            .expect("a request's size")
            .expect("room for a buffer (counted above)");
        b.as_mut_slice().copy_from_slice(data);
        b
    };
    let view = |b: &DmaBuffer| b.as_slice().to_vec();
    clients(session, size, load, make, view, |s, buf| async move {
        s.encrypt_buffer(&IV, buf).await.expect("a request")
    })
    .await
}

/// The same through `Offload`: `clients` tasks each awaiting `encrypt`
/// on one session of `offload`, on `Vec`s, or on `Offload::buffer`s if
/// `device_ready`.
async fn offload_per_request(
    offload: &Offload,
    size: usize,
    device_ready: bool,
    args: &Args,
) -> Rate {
    let session = Rc::new(
        offload
            .cipher(CipherAlg::Aes128Cbc, &KEY)
            .await
            .expect("an Offload session"),
    );
    let load = (args.clients, args.single_ops.unwrap_or(args.ops / 10));
    let make = |data: &[u8]| {
        let mut b = if device_ready {
            offload.buffer(data.len())
        } else {
            DeviceBuf::from(vec![0; data.len()])
        };
        b.copy_from_slice(data);
        b
    };
    let view = |b: &DeviceBuf| b.to_vec();
    clients(session, size, load, make, view, |s, buf| async move {
        s.encrypt(IV, buf).await.expect("a request")
    })
    .await
}

/// An engine of no cost: requests are answered as soon as its one poller
/// task runs, all those waiting at once — the natural batching of the
/// VFIO queue (a request that finds the poller idle wakes it; those that
/// come while it is scheduled join its next pass), with none of the
/// device, the ring, the DMA memory or `Offload`. What `clients` measures
/// on it is the task-per-request shape alone: a wake and a poll of the
/// caller's task a request, the poller's pass shared by the batch.
#[derive(Default)]
struct Floor {
    /// Requests waiting for the poller's next pass.
    waiting: RefCell<Vec<Rc<FloorRequest>>>,
    /// The poller's waker while it is idle.
    poller: RefCell<Option<Waker>>,
    /// Set when the measurement is over: the poller returns.
    done: Cell<bool>,
    /// Passes that answered at least one request, and requests answered.
    passes: Cell<u64>,
    answered: Cell<u64>,
}

/// One caller's request slot, reused request after request (the VFIO
/// queue's tickets are reused too: no allocation a request).
#[derive(Default)]
struct FloorRequest {
    answered: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Floor {
    /// Sends `slot`'s request and waits for its answer.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped request is still answered, into a slot
    /// its caller no longer watches (harmless here; the bench never drops
    /// one).
    async fn request(&self, slot: &Rc<FloorRequest>) {
        slot.answered.set(false);
        self.waiting.borrow_mut().push(slot.clone());
        if let Some(poller) = self.poller.borrow_mut().take() {
            poller.wake();
        }
        std::future::poll_fn(|cx| {
            if slot.answered.get() {
                return Poll::Ready(());
            }
            *slot.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }

    /// The poller: answers everything waiting, then sleeps until a
    /// request wakes it; returns once `done` is set and it is woken.
    async fn poll(self: Rc<Self>) {
        let mut batch = Vec::new();
        std::future::poll_fn(|cx| {
            std::mem::swap(&mut batch, &mut *self.waiting.borrow_mut());
            if !batch.is_empty() {
                self.passes.set(self.passes.get() + 1);
                self.answered.set(self.answered.get() + batch.len() as u64);
            }
            for slot in batch.drain(..) {
                slot.answered.set(true);
                if let Some(w) = slot.waker.borrow_mut().take() {
                    w.wake();
                }
            }
            if self.done.get() {
                return Poll::Ready(());
            }
            *self.poller.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

/// The floor's row: `clients` tasks each awaiting [`Floor::request`].
async fn floor_per_request(size: usize, args: &Args) -> Rate {
    let floor = Rc::new(Floor::default());
    let poller = tokio::task::spawn_local(floor.clone().poll());
    let load = (args.clients, args.single_ops.unwrap_or(args.ops / 10));
    // The "engine" answers with the CPU's output, so the harness's check
    // holds; each caller's buffer carries its reused slot.
    let make = |data: &[u8]| (cpu_cbc(data), Rc::new(FloorRequest::default()));
    let view = |b: &(Vec<u8>, Rc<FloorRequest>)| b.0.clone();
    let rate = clients(floor.clone(), size, load, make, view, |f, buf| async move {
        f.request(&buf.1).await;
        buf
    })
    .await;
    floor.done.set(true);
    if let Some(p) = floor.poller.borrow_mut().take() {
        p.wake();
    }
    poller.await.expect("the floor's poller");
    eprintln!(
        "floor, {size} B: {:.1} requests a pass",
        floor.answered.get() as f64 / floor.passes.get().max(1) as f64
    );
    rate
}

/// DPDK's ops/s per buffer size from dpdk-test-crypto-perf's throughput
/// table: rows of numbers `lcore size burst enqueued dequeued failed-enq
/// failed-deq MOps Gbps cycles/buf`.
fn parse_dpdk(output: &str) -> Vec<(usize, f64)> {
    output
        .lines()
        .filter_map(|line| {
            let fields: Vec<f64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (fields.len() >= 10).then(|| (fields[1] as usize, fields[7] * 1e6))
        })
        .collect()
}

fn run_dpdk(args: &Args, device: &str) -> Result<Vec<(usize, f64)>, String> {
    let sizes: Vec<String> = args.sizes.iter().map(ToString::to_string).collect();
    let started = Instant::now();
    let out = std::process::Command::new(&args.dpdk_script)
        .args([device, &sizes.join(","), &args.ops.to_string()])
        .output()
        .map_err(|e| format!("{}: {e}", args.dpdk_script))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("--- {} (took {:.1?}):", args.dpdk_script, started.elapsed());
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    println!("---");
    if !out.status.success() {
        return Err(format!("{} exited with {}", args.dpdk_script, out.status));
    }
    let rows = parse_dpdk(&stdout);
    if rows.is_empty() {
        return Err("no throughput rows in DPDK's output".into());
    }
    Ok(rows)
}

/// What was measured of ours on one device at one size.
#[derive(Debug, Clone, Default)]
struct Row {
    size: usize,
    /// The driver's burst path (ops/s).
    burst: f64,
    /// The task-per-request shape alone ([`Floor`]).
    floor: Rate,
    /// The driver's per-request API, on `Vec`s and on its own buffers.
    single: Rate,
    single_buf: Rate,
    /// Through `Offload`, pinned to the device, on `Vec`s and on
    /// `Offload::buffer`s.
    pinned: Rate,
    pinned_buf: Rate,
    /// Through `Offload` under Auto, on `Vec`s and on `Offload::buffer`s.
    auto: Rate,
    auto_buf: Rate,
    /// Auto's share of requests on the device.
    auto_on_device: f64,
}

/// Ours on `device`, per size: the driver's burst and per-request paths,
/// then `Offload` pinned to the device and under Auto.
fn measure(device: &str, args: &Args) -> Vec<Row> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        // Opened once, as the backend (a VFIO group opens once); the
        // driver's rows use its device, brought up by hand.
        let backend = Arc::new(VfioBackend::open(device).await.expect("open the device"));
        let dev = backend.driver_device().clone();
        dev.resume().expect("device up");
        let session = Rc::new(
            dev.cipher_session(CipherAlgo::AesCbc, &KEY)
                .await
                .expect("a session"),
        );
        let pinned = Offload::builder()
            .backend(backend.clone())
            .pin(backend.name())
            .build()
            .expect("an Offload pinned to the device");
        let auto = Offload::builder()
            .backend(backend.clone())
            .build()
            .expect("an Offload");
        let run = |row: &str| args.only.is_empty() || args.only.iter().any(|o| o == row);
        if run("auto-vec") || run("auto-buf") {
            auto.calibrate().await.expect("calibration");
        }
        let on_device = || {
            auto.backends()
                .iter()
                .find(|b| b.name == backend.name())
                .map_or(0, |b| b.stats.requests)
        };
        let all = || {
            auto.backends()
                .iter()
                .map(|b| b.stats.requests)
                .sum::<u64>()
        };
        let mut rows = Vec::new();
        for &size in &args.sizes {
            let irqs = dev.interrupts();
            let mut burst = 0.0;
            if run("burst") {
                burst = ours_burst(session.clone(), dev.pool_bytes(), size, args).await;
            }
            let between = dev.interrupts();
            let mut floor = Rate::default();
            if run("floor") {
                floor = floor_per_request(size, args).await;
            }
            let mut single = Rate::default();
            if run("drv-vec") {
                single = ours_per_request(session.clone(), size, args).await;
            }
            let after = dev.interrupts();
            let mut single_buf = Rate::default();
            if run("drv-buf") {
                single_buf = ours_on_buffers(session.clone(), &dev, size, args).await;
            }
            let mut p = Rate::default();
            if run("pinned-vec") {
                p = offload_per_request(&pinned, size, false, args).await;
            }
            let mut pinned_buf = Rate::default();
            if run("pinned-buf") {
                pinned_buf = offload_per_request(&pinned, size, true, args).await;
            }
            let (d0, a0) = (on_device(), all());
            let mut a = Rate::default();
            if run("auto-vec") {
                a = offload_per_request(&auto, size, false, args).await;
            }
            let mut auto_buf = Rate::default();
            if run("auto-buf") {
                auto_buf = offload_per_request(&auto, size, true, args).await;
            }
            let share = (on_device() - d0) as f64 / (all() - a0).max(1) as f64;
            eprintln!(
                "ours on {device}, {size} B: burst {burst:.0} ops/s ({} interrupts), \
                 1-by-1 {:.0} ops/s {:.1} µs CPU ({} interrupts), Offload pinned {:.0} ops/s \
                 {:.1} µs CPU, Auto {:.0} ops/s {:.1} µs CPU ({:.0}% on the device)",
                between - irqs,
                single.ops,
                single.cpu_us,
                after - between,
                p.ops,
                p.cpu_us,
                a.ops,
                a.cpu_us,
                share * 100.0
            );
            eprintln!(
                "  on device-ready buffers: driver {:.0} ops/s {:.1} µs CPU, Offload pinned \
                 {:.0} ops/s {:.1} µs CPU, Auto {:.0} ops/s {:.1} µs CPU",
                single_buf.ops,
                single_buf.cpu_us,
                pinned_buf.ops,
                pinned_buf.cpu_us,
                auto_buf.ops,
                auto_buf.cpu_us
            );
            rows.push(Row {
                size,
                burst,
                floor,
                single,
                single_buf,
                pinned: p,
                pinned_buf,
                auto: a,
                auto_buf,
                auto_on_device: share,
            });
        }
        rows
    })
}

/// A device taken from its kernel driver for vfio-pci, with a huge page
/// reserved for our pool; given back (and the page released) on drop.
struct Taken {
    bdf: String,
    driver: Option<String>,
    hugepages: Option<String>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl Taken {
    fn new(bdf: &str) -> std::io::Result<Taken> {
        let dev = std::path::Path::new("/sys/bus/pci/devices").join(bdf);
        let driver = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
        let hugepages = std::fs::read_to_string(NR_HUGEPAGES).ok();
        let taken = Taken {
            bdf: bdf.to_owned(),
            driver: driver.clone(),
            hugepages: hugepages.clone(),
        };
        let now: u64 = hugepages
            .as_deref()
            .map_or(0, |h| h.trim().parse().unwrap_or(0));
        std::fs::write(NR_HUGEPAGES, (now + 2).to_string())?;
        if driver.is_some() {
            std::fs::write(dev.join("driver/unbind"), bdf)?;
        }
        std::fs::write(dev.join("driver_override"), "vfio-pci")?;
        let _ = std::fs::write("/sys/bus/pci/drivers_probe", bdf);
        let group = std::fs::read_link(dev.join("iommu_group"))?;
        let node = std::path::Path::new("/dev/vfio").join(group.file_name().unwrap_or_default());
        for _ in 0..100 {
            if node.exists() {
                return Ok(taken);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::other(format!(
            "{} never appeared",
            node.display()
        )))
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let dev = std::path::Path::new("/sys/bus/pci/devices").join(&self.bdf);
        let _ = std::fs::write(dev.join("driver/unbind"), &self.bdf);
        let _ = std::fs::write(dev.join("driver_override"), "\n");
        if self.driver.is_some() {
            let _ = std::fs::write("/sys/bus/pci/drivers_probe", &self.bdf);
        }
        if let Some(h) = &self.hugepages {
            let _ = std::fs::write(NR_HUGEPAGES, h.trim());
        }
    }
}

/// Nanoseconds per call of each primitive of the per-request path.
fn primitives(args: &Args) {
    const N: u32 = 200_000;
    let time = |name: &str, f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..N {
            f();
        }
        println!(
            "  {name:<34} {:>8.1} ns",
            start.elapsed().as_nanos() as f64 / f64::from(N)
        );
    };
    println!("primitives, ns per call:");
    time("Instant::now", &mut || {
        std::hint::black_box(Instant::now());
    });
    let m = std::sync::Mutex::new(0u64);
    time("Mutex lock+unlock", &mut || {
        *m.lock().expect("lock") += 1;
    });
    let a = std::sync::atomic::AtomicU64::new(0);
    time("AtomicU64 fetch_add", &mut || {
        a.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    });
    time("fence(SeqCst)", &mut || {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    });
    time("oneshot channel+send+try_recv", &mut || {
        let (tx, mut rx) = tokio::sync::oneshot::channel::<u64>();
        let _ = tx.send(1);
        std::hint::black_box(rx.try_recv().ok());
    });
    time("Box<[u8; 64]> alloc+free", &mut || {
        std::hint::black_box(Box::new([0u8; 64]));
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let start = Instant::now();
    rt.block_on(async {
        for _ in 0..N {
            tokio::task::yield_now().await;
        }
    });
    println!(
        "  {:<34} {:>8.1} ns",
        "tokio yield_now",
        start.elapsed().as_nanos() as f64 / f64::from(N)
    );
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        for &size in &args.sizes {
            let r = floor_per_request(size, args).await;
            println!(
                "  floor, {} tasks, {size} B {:>14.0} ops/s {:.2} µs CPU a request",
                args.clients, r.ops, r.cpu_us
            );
        }
    });
}

fn main() {
    let args = Args::parse();
    if args.primitives {
        primitives(&args);
    }
    let device = args
        .device
        .clone()
        .or_else(|| first_of("VMTEST_VFIO_DEVICES"));
    let device = match device {
        Some(d) => d,
        None if args.primitives => return,
        None => panic!("no device: --device BDF or VMTEST_VFIO_DEVICES"),
    };
    let dpdk_device = args
        .dpdk_device
        .clone()
        .or_else(|| first_of("VMTEST_VIRTIO_DEVICES"))
        .filter(|d| d != "none");

    let pa_device = args
        .pa_device
        .clone()
        .or_else(|| dpdk_device.clone())
        .filter(|d| d != "none");

    let ours = measure(&device, &args);
    let ours_pa = pa_device.as_deref().map(|d| {
        let _taken = Taken::new(d).expect("take the device for vfio-pci");
        measure(d, &args)
    });
    let dpdk = match &dpdk_device {
        Some(d) => run_dpdk(&args, d).unwrap_or_else(|e| {
            println!("DPDK: {e}");
            Vec::new()
        }),
        None => {
            println!("DPDK: no device (--dpdk-device or VMTEST_VIRTIO_DEVICES)");
            Vec::new()
        }
    };

    println!(
        "AES-128-CBC encrypt, ops/s, {} ops per size; burst: {} x up to {} in flight \
         (fewer where the DMA pool is short), 1-by-1: {} clients, {} ops",
        args.ops,
        args.burst,
        args.bursts,
        args.clients,
        args.single_ops.unwrap_or(args.ops / 10)
    );
    println!(
        "  IOMMU: ours on {device} (iommu_platform=on); PA: ours on {}, DPDK on {} \
         (iommu_platform=off, DPDK burst 32)",
        pa_device.as_deref().unwrap_or("-"),
        dpdk_device.as_deref().unwrap_or("-"),
    );
    println!(
        "{:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "bytes", "IOMMU burst", "IOMMU 1by1", "PA burst", "PA 1by1", "DPDK", "PA/DPDK", "1by1/DPDK"
    );
    let peer_at = |size: usize| dpdk.iter().find(|(s, _)| *s == size).map(|(_, r)| *r);
    let num = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.0}"));
    let ratio = |x: Option<f64>, peer: Option<f64>| match (x, peer) {
        (Some(x), Some(p)) => format!("{:.2}x", x / p),
        _ => "-".into(),
    };
    let mut worst: Option<f64> = None;
    for (i, row) in ours.iter().enumerate() {
        let pa = ours_pa.as_ref().and_then(|p| p.get(i));
        let peer = peer_at(row.size);
        if let (Some(pa), Some(p)) = (pa, peer) {
            worst = Some(worst.map_or(pa.burst / p, |w: f64| w.min(pa.burst / p)));
        }
        println!(
            "{:>6} {:>11.0} {:>11.0} {:>11} {:>11} {:>11} {:>9} {:>9}",
            row.size,
            row.burst,
            row.single.ops,
            num(pa.map(|p| p.burst)),
            num(pa.map(|p| p.single.ops)),
            num(peer),
            ratio(pa.map(|p| p.burst), peer),
            ratio(pa.map(|p| p.single.ops), peer),
        );
    }
    match worst {
        Some(w) => println!("ours (PA, burst) / DPDK, lowest over the sizes: {w:.2}x"),
        None => println!("ours / DPDK: no figures for both"),
    }
    println!(
        "Per request, {} tasks each awaiting one (ops/s, process CPU µs a request): the \
         floor (an engine of no cost answering in batches: the task-per-request shape \
         alone), the driver's encrypt on a Vec and encrypt_buffer on its own memory, then \
         through Offload, pinned to the device and under Auto, on Vecs and on Offload::buffer",
        args.clients
    );
    let cell = |r: Rate| format!("{:.0} {:.1}", r.ops, r.cpu_us);
    let mut tables: Vec<(&str, &Vec<Row>)> = vec![("IOMMU", &ours)];
    if let Some(pa) = &ours_pa {
        tables.push(("PA", pa));
    }
    for (name, rows) in tables {
        println!(
            "{name:>6} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>9} {:>9}",
            "floor",
            "drv Vec",
            "drv buffer",
            "pinned Vec",
            "pinned buf",
            "Auto Vec",
            "Auto buf",
            "DPDK",
            "Auto dev%"
        );
        for row in rows {
            println!(
                "{:>6} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>9} {:>9.0}",
                row.size,
                cell(row.floor),
                cell(row.single),
                cell(row.single_buf),
                cell(row.pinned),
                cell(row.pinned_buf),
                cell(row.auto),
                cell(row.auto_buf),
                num(peer_at(row.size)),
                row.auto_on_device * 100.0
            );
        }
    }
    if let Some(pa) = &ours_pa {
        println!("PA device against DPDK on it (ops/s ratios):");
        println!(
            "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "bytes", "floor", "drv Vec", "drv buf", "pin Vec", "pin buf", "Auto Vec", "Auto buf"
        );
        for row in pa {
            let peer = peer_at(row.size);
            println!(
                "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                row.size,
                ratio(Some(row.floor.ops), peer),
                ratio(Some(row.single.ops), peer),
                ratio(Some(row.single_buf.ops), peer),
                ratio(Some(row.pinned.ops), peer),
                ratio(Some(row.pinned_buf.ops), peer),
                ratio(Some(row.auto.ops), peer),
                ratio(Some(row.auto_buf.ops), peer),
            );
        }
    }
    // A pause so the last lines reach the console before the next step.
    std::thread::sleep(Duration::from_millis(10));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpdk_throughput_rows_are_parsed() {
        let out = "\
    lcore id    Buf Size  Burst Size    Enqueued    Dequeued  Failed Enq  Failed Deq        MOps        Gbps  Cycles/Buf

           1          64          32     1000000     1000000           0           0      1.2400      0.6349     1612.90
           1        2048          32     1000000     1000000           0           0      0.3230      5.2920     6191.95
";
        assert_eq!(parse_dpdk(out), vec![(64, 1_240_000.0), (2048, 323_000.0)]);
    }
}
