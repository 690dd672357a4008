//! Booting the guest under QEMU and capturing its serial console.
//!
//! The console (QEMU's stdout with `-nographic`) is read line by line on a
//! thread, echoed with the run's name, written with host timestamps to
//! `target/vm-test/<run>.log` and fed to [`LogParser`]. QEMU is killed when
//! the per-run timeout passes, so a hung guest cannot hang the task, and at
//! once when the guest kernel says its timers stopped.
//!
//! A TCG run is repeated once if QEMU crashed in it or its guest's timers
//! stopped (the emulator broke, not a test); the first attempt's log is
//! kept as `<run>-crash.log` and the summary says why.
//!
//! KVM is tried first when `/dev/kvm` opens read-write; if the guest has not
//! reached `/init` within [`KVM_BOOT_WINDOW`], QEMU is killed and the run
//! starts again under TCG, and later runs go straight to TCG. (The vm-probe
//! found a KVM here that does not boot a stock kernel.)

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::ValueEnum;

use crate::guest_log::{Ending, LogParser, RunReport};
use crate::hog::{self, Hog};
use crate::qmp;

/// How long a KVM guest may take to reach `/init` before TCG takes over.
/// TCG itself gets there in 7.7–10.9 s with the ~316 MiB initramfs (the
/// CI runs' summaries, 2-vCPU hosts); a KVM guest not there in 15 s is
/// slower than TCG would be, and on hosts whose nested KVM never boots
/// (where CI has run) the wait is spent for nothing: it was 30 s.
pub const KVM_BOOT_WINDOW: Duration = Duration::from_secs(15);
/// The marker that shows the kernel booted and `/init` runs.
const SIGN_OF_LIFE: &str = "VMTEST-INIT";
/// How long to wait for QEMU's output to drain once it exited or was killed.
const DRAIN: Duration = Duration::from_secs(5);

/// The guest configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum RunKind {
    /// No devices: AF_ALG on the guest CPU.
    Plain,
    /// With a virtio-crypto PCI device (QEMU's builtin backend, no IOMMU).
    Virtio,
    /// q35 with an emulated Intel IOMMU and three virtio-crypto devices, each
    /// behind its own PCIe root port: two bound to vfio-pci in the guest for
    /// a userspace driver, and one without `iommu_platform` left to the
    /// kernel's virtio_crypto (AF_ALG, DPDK); QEMU has a QMP socket for
    /// hot-unplug requests.
    Vfio,
    /// The vfio run's machine and devices with a guest CPU crippled on
    /// purpose: no AES-NI, PCLMULQDQ, VAES or VPCLMULQDQ (the kernel then
    /// runs `aes-generic`, the crate's CPU path software AES). The CPU
    /// stands in for the seeds' SoCs without AES instructions; the devices
    /// still compute on the host, at the host's speed.
    Weak,
}

impl RunKind {
    /// Every run, in the order `--run all` boots them.
    pub const ALL: [Self; 4] = [Self::Plain, Self::Virtio, Self::Vfio, Self::Weak];

    /// The run's name in logs and on the kernel command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Virtio => "virtio",
            Self::Vfio => "vfio",
            Self::Weak => "weak",
        }
    }

    /// True if the run has the vfio run's machine: the emulated IOMMU, two
    /// virtio-crypto devices for VFIO and one for the kernel's driver.
    pub fn has_vfio_devices(self) -> bool {
        matches!(self, Self::Vfio | Self::Weak)
    }

    /// The CPU features the guest is denied (QEMU `-cpu` flags), if any.
    pub fn hidden_cpu_features(self) -> &'static [&'static str] {
        match self {
            Self::Weak => WEAK_HIDDEN_FEATURES,
            Self::Plain | Self::Virtio | Self::Vfio => &[],
        }
    }

    /// True if the run's QEMU gets a QMP socket (see [`crate::qmp`]).
    pub fn has_qmp(self) -> bool {
        self == Self::Vfio
    }

    /// The guest's memory in MiB: 2 GiB for every run. The initramfs lives
    /// in it unpacked (~180 MiB, and growing with the test binaries; at
    /// 1 GiB the plain and virtio runs' unpacking failed with "write error"
    /// once the stream tests were added, and a truncated test binary
    /// segfaulted), and the vfio run's DPDK step reserves hugepages.
    pub fn memory_mib(self) -> u32 {
        2048
    }
}

/// The QEMU ids of the vfio run's virtio-crypto devices for VFIO, in PCI
/// slot order (`crypto0` behind root port `rp1`, ...), with
/// `iommu_platform=on`. `VMTEST-QMP device_del` names them.
pub const VFIO_DEVICE_IDS: [&str; 2] = ["crypto0", "crypto1"];
/// The QEMU id of the vfio run's virtio-crypto device for the kernel's
/// driver, behind the next root port (`rp3`). It has `iommu_platform=off`,
/// so it does not offer VIRTIO_F_ACCESS_PLATFORM and DMAs to guest-physical
/// addresses: the guest leaves it to virtio_crypto (AF_ALG), and DPDK's
/// crypto_virtio (`--iova-mode=pa`) can drive it, our VFIO driver cannot.
pub const KERNEL_DEVICE_ID: &str = "crypto2";

/// The CPU features the weak run's guest does not get: AES and carry-less
/// multiply in every width (the AVX-512 forms share these flags).
pub const WEAK_HIDDEN_FEATURES: &[&str] = &["aes", "pclmulqdq", "vaes", "vpclmulqdq"];

/// The accelerator policy asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccelPolicy {
    /// KVM if /dev/kvm is usable and boots the guest, else TCG.
    Auto,
    /// KVM only (no fallback).
    Kvm,
    /// TCG only.
    Tcg,
}

/// One accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// `-accel kvm -cpu host`.
    Kvm,
    /// `-accel tcg -cpu max` (`max` gives the guest AES-NI and PCLMUL).
    Tcg,
}

impl Accel {
    /// Its name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// `-accel … -cpu …`, the CPU model without `hidden` features.
    fn args(self, hidden: &[&str]) -> [String; 4] {
        let (accel, model) = match self {
            Self::Kvm => ("kvm", "host"),
            Self::Tcg => ("tcg", "max"),
        };
        let cpu: String = std::iter::once(model.to_owned())
            .chain(hidden.iter().map(|f| format!("-{f}")))
            .collect::<Vec<_>>()
            .join(",");
        ["-accel".into(), accel.into(), "-cpu".into(), cpu]
    }
}

/// Remembers, across runs, whether KVM is worth trying.
#[derive(Debug)]
pub struct AccelChooser {
    policy: AccelPolicy,
    /// Why KVM is not used, once known.
    kvm_unusable: Option<String>,
}

impl AccelChooser {
    /// Starts from the policy; `auto` checks that /dev/kvm opens read-write.
    pub fn new(policy: AccelPolicy) -> Self {
        let kvm_unusable = match policy {
            AccelPolicy::Tcg => Some("TCG was asked for".into()),
            AccelPolicy::Kvm => None,
            AccelPolicy::Auto => OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .err()
                .map(|e| format!("/dev/kvm: {e}")),
        };
        Self {
            policy,
            kvm_unusable,
        }
    }

    /// Why KVM is not used, if it is not.
    pub fn kvm_unusable(&self) -> Option<&str> {
        self.kvm_unusable.as_deref()
    }
}

/// The files a guest boots from.
#[derive(Debug)]
pub struct Machine {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The kernel for `-kernel`.
    pub kernel: PathBuf,
    /// The initramfs for `-initrd`.
    pub initrd: PathBuf,
    /// Threads of the host CPU hog the guest may switch on
    /// (`--host-hog`; [`crate::hog`]); none when 0.
    pub host_hog: usize,
}

impl Machine {
    /// The QEMU command line of one run; `qmp` is the QMP socket to listen
    /// on (for runs that [have one](RunKind::has_qmp)).
    pub fn command(&self, run: RunKind, accel: Accel, qmp: Option<&Path>) -> Command {
        let mut command = Command::new(&self.qemu);
        command.args(accel.args(run.hidden_cpu_features()));
        if run.has_vfio_devices() {
            // The IOMMU first: QEMU wants it before the devices behind it.
            // Interrupt remapping needs the split irqchip (under KVM; TCG
            // accepts it), and caching mode lets a guest's VFIO map DMA.
            command.args([
                "-machine",
                "q35,kernel-irqchip=split",
                "-device",
                "intel-iommu,intremap=on,caching-mode=on",
            ]);
        }
        // tsc=reliable: under TCG the kernel otherwise clocks itself with
        // the HPET, and every clock read (tokio, `Instant::now`) becomes an
        // emulated MMIO read that waits for QEMU's main lock — measured in
        // the vfio run: hpet without it; with it the driver's bursts ran
        // ~20% faster (vfio-vs-dpdk, 64 B).
        let mut append = format!(
            "console=ttyS0 quiet panic=-1 tsc=reliable VMTEST_RUN={} CRYPTO_OFFLOAD_GUEST=1",
            run.name()
        );
        if run.has_vfio_devices() {
            append.push_str(" intel_iommu=on");
        }
        command
            .arg("-m")
            .arg(run.memory_mib().to_string())
            .args(["-smp", "2", "-nographic", "-no-reboot"])
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&self.initrd)
            .arg("-append")
            .arg(append);
        match run {
            RunKind::Plain => {}
            RunKind::Virtio => {
                command.args([
                    "-object",
                    "cryptodev-backend-builtin,id=cryptodev0",
                    "-device",
                    "virtio-crypto-pci,cryptodev=cryptodev0",
                ]);
            }
            RunKind::Vfio | RunKind::Weak => {
                // Each device behind its own root port: its own IOMMU group,
                // a PCI PM capability (VFIO_DEVICE_RESET, runtime PM) and
                // hot-unplug (`device_del` over QMP). The VFIO devices go
                // through the IOMMU (ACCESS_PLATFORM); the kernel's does not.
                let devices = VFIO_DEVICE_IDS
                    .iter()
                    .map(|id| (id, "on"))
                    .chain([(&KERNEL_DEVICE_ID, "off")]);
                for (n, (id, iommu_platform)) in devices.enumerate() {
                    let port = n + 1;
                    command.args([
                        "-object".into(),
                        format!("cryptodev-backend-builtin,id=cryptodev{n}"),
                        "-device".into(),
                        format!("pcie-root-port,id=rp{port},bus=pcie.0,chassis={port},slot={port}"),
                        "-device".into(),
                        format!(
                            "virtio-crypto-pci,id={id},bus=rp{port},cryptodev=cryptodev{n},iommu_platform={iommu_platform},disable-legacy=on"
                        ),
                    ]);
                }
            }
        }
        if let Some(socket) = qmp {
            // QEMU's option syntax doubles a comma inside a value.
            let socket = socket.to_string_lossy().replace(',', ",,");
            command
                .arg("-qmp")
                .arg(format!("unix:{socket},server=on,wait=off"));
        }
        command
    }
}

/// One finished run.
#[derive(Debug)]
pub struct Boot {
    /// The accelerator the judged attempt ran under.
    pub accel: Accel,
    /// The verdict from the console.
    pub report: RunReport,
    /// Wall time of the judged attempt.
    pub wall: Duration,
    /// The console log.
    pub log: PathBuf,
    /// What happened to a KVM attempt that was given up.
    pub kvm_note: Option<String>,
    /// Why the judged attempt is a repeat: QEMU itself died in the first
    /// ([`emulator_crash`]), or its guest's timers stopped.
    pub crash_note: Option<String>,
}

/// The signal QEMU died of, when it died of one that means the emulator
/// itself crashed (not the guest, not our timeout: a killed attempt has no
/// status), after the guest had printed its sign of life. Such a TCG
/// attempt is repeated once: QEMU 7.2 (Debian bookworm's) crashes now and
/// then under multi-threaded TCG while a guest remaps PCI BARs on one vCPU
/// as the other does MMIO (upstream 0d58c660, "softmmu: Use
/// async_run_on_cpu in tcg_commit", first in 8.1.1); a CI run lost a whole
/// vfio run to one SIGSEGV that seven local runs of the same commit did not
/// repeat. A crash the guest's own requests cause every time crashes the
/// repeat too and fails the run; one they cause now and then would pass on
/// the repeat, which is why the crash stays in the summary and what failed
/// before it still fails the run.
fn emulator_crash(status: Option<ExitStatus>, started: bool) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    const CRASHES: [i32; 5] = [
        libc::SIGILL,
        libc::SIGABRT,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGSEGV,
    ];
    let signal = status?.signal()?;
    (started && CRASHES.contains(&signal)).then_some(signal)
}

/// Boots one run: KVM first if the chooser allows, else (or then) TCG.
pub fn boot(
    machine: &Machine,
    run: RunKind,
    timeout: Duration,
    log_dir: &Path,
    chooser: &mut AccelChooser,
) -> Result<Boot> {
    let log = log_dir.join(format!("{}.log", run.name()));
    // A crash log of an earlier invocation would be read as this one's.
    let _ = fs::remove_file(crash_log_of(&log, run));
    let mut kvm_note = None;
    if chooser.kvm_unusable.is_none() {
        let fallback = chooser.policy == AccelPolicy::Auto;
        let window = fallback.then_some(KVM_BOOT_WINDOW);
        let attempt = attempt(machine, run, Accel::Kvm, timeout, window, &log)?;
        if !fallback || attempt.alive {
            return Ok(attempt.into_boot(Accel::Kvm, log, None, None));
        }
        // The judged (TCG) run gets <run>.log; the KVM attempt's log stays aside.
        let kvm_log = log_dir.join(format!("{}-kvm.log", run.name()));
        fs::rename(&log, &kvm_log).with_context(|| format!("renaming {}", log.display()))?;
        let what = match attempt.status {
            None if attempt.timers_stopped => {
                "the guest's timers stopped before it reached /init".to_owned()
            }
            Some(status) => format!("QEMU exited ({status}) before the guest reached /init"),
            None => format!(
                "the guest did not reach /init within {} s",
                KVM_BOOT_WINDOW.as_secs()
            ),
        };
        let reason = format!("KVM: {what} (log {}); using TCG", kvm_log.display());
        eprintln!("vm-test: {reason}");
        chooser.kvm_unusable = Some(reason.clone());
        kvm_note = Some(reason);
    }
    let attempt = attempt(machine, run, Accel::Tcg, timeout, None, &log)?;
    let (attempt, crash_note) =
        repeat_after_a_crash(attempt, machine, run, Accel::Tcg, timeout, &log)?;
    Ok(attempt.into_boot(Accel::Tcg, log, kvm_note, crash_note))
}

/// Where a crashed attempt's log is kept (also one whose guest's timers
/// stopped).
fn crash_log_of(log: &Path, run: RunKind) -> PathBuf {
    log.with_file_name(format!("{}-crash.log", run.name()))
}

/// Runs the run once more under TCG if QEMU crashed in `first`
/// ([`emulator_crash`]) or the guest kernel said its timers stopped
/// ([`LogParser::timers_stopped`]: the emulated machine broke, not a
/// test), keeping the first attempt's log as `<run>-crash.log`; returns
/// the attempt to judge and, if there was a repeat, why. A test binary
/// that failed before the crash fails the judged attempt too, and the
/// reason stays in the summary.
fn repeat_after_a_crash(
    first: Attempt,
    machine: &Machine,
    run: RunKind,
    accel: Accel,
    timeout: Duration,
    log: &Path,
) -> Result<(Attempt, Option<String>)> {
    let what = match emulator_crash(first.status, first.started) {
        Some(signal) => format!("QEMU crashed (signal {signal})"),
        None if first.timers_stopped && first.started => "the guest's timers stopped".to_owned(),
        None => return Ok((first, None)),
    };
    let crash_log = crash_log_of(log, run);
    fs::rename(log, &crash_log).with_context(|| format!("renaming {}", log.display()))?;
    // The binary that had begun and not ended: the one QEMU died under.
    let during = first
        .report
        .binaries
        .iter()
        .rev()
        .find(|b| b.rc.is_none())
        .map_or_else(String::new, |b| format!(" during {}", b.name));
    let note = format!(
        "{what} {:.0} s into the run{during} (log {}); the run was repeated once",
        first.ended.as_secs_f64(),
        crash_log.display()
    );
    eprintln!("vm-test: {note}");
    let mut second = attempt(machine, run, accel, timeout, None, log)?;
    for failed in first
        .report
        .binaries
        .iter()
        .filter(|b| b.rc.is_some_and(|rc| rc != 0))
    {
        second.report.failures.push(format!(
            "{}: exit status {} in the attempt repeated ({what}; log {})",
            failed.name,
            failed.rc.unwrap_or_default(),
            crash_log.display()
        ));
    }
    Ok((second, Some(note)))
}

/// The result of one QEMU process.
struct Attempt {
    report: RunReport,
    status: Option<ExitStatus>,
    wall: Duration,
    /// The guest printed its sign of life, or no life window was set.
    alive: bool,
    /// The guest printed its sign of life.
    started: bool,
    /// Killed once the guest said its timers stopped
    /// ([`LogParser::timers_stopped`]).
    timers_stopped: bool,
    /// When QEMU was killed or exited (before its output drained).
    ended: Duration,
}

impl Attempt {
    fn into_boot(
        self,
        accel: Accel,
        log: PathBuf,
        kvm_note: Option<String>,
        crash_note: Option<String>,
    ) -> Boot {
        Boot {
            accel,
            report: self.report,
            wall: self.wall,
            log,
            kvm_note,
            crash_note,
        }
    }
}

/// What the reader threads send: a console line, the end of a console
/// stream, or a message from QEMU's QMP socket.
enum Event {
    Line(String),
    Closed,
    Qmp(serde_json::Value),
}

/// A running QEMU. Dropping it kills QEMU if it still runs, so no path out
/// of [`attempt`] (an error included) leaves a guest behind.
struct Qemu(Child);

impl Qemu {
    /// Waits for QEMU after its output closed; kills it if it lingers.
    fn wait_briefly(&mut self) -> Result<ExitStatus> {
        let deadline = Instant::now() + DRAIN;
        loop {
            if let Some(status) = self.0.try_wait().context("waiting for QEMU")? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.0.kill();
                return self.0.wait().context("waiting for QEMU");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The run's QMP connection, made at the guest's first request.
enum QmpLink {
    /// The run has no QMP socket.
    Absent,
    /// QEMU listens here; not connected yet.
    Listening(PathBuf),
    /// Connected, past the handshake.
    Connected(qmp::Client),
    /// Connecting failed (later requests fail without retrying).
    Failed(String),
}

/// Where console lines go: the terminal (tagged with the run), the log
/// (with host timestamps) and the parser. `VMTEST-QMP` requests among them
/// go to QEMU's QMP socket.
struct Console {
    tag: String,
    log: BufWriter<File>,
    parser: LogParser,
    started: Instant,
    /// True once the guest printed [`SIGN_OF_LIFE`] (from the start when
    /// the attempt has no life window).
    alive: bool,
    /// True once the guest printed [`SIGN_OF_LIFE`].
    started_guest: bool,
    qmp: QmpLink,
    /// Where the QMP reader thread sends QEMU's messages.
    events: Sender<Event>,
    /// The host CPU hog (`--host-hog`), if the run has one.
    hog: Option<Hog>,
}

impl Console {
    fn line(&mut self, line: &str) -> Result<()> {
        let at = self.started.elapsed();
        self.started_guest |= line.contains(SIGN_OF_LIFE);
        self.alive |= self.started_guest;
        println!("[{}] {line}", self.tag);
        writeln!(self.log, "[{:8.3}] {line}", at.as_secs_f64())?;
        self.parser.line(at, line);
        if let Some(request) = qmp::parse_request(line) {
            self.qmp_request(request)?;
        }
        if let Some(request) = hog::parse_request(line) {
            self.hog_request(request)?;
        }
        Ok(())
    }

    /// Switches the host CPU hog as the guest asks; without `--host-hog`
    /// the request is noted and the guest measures a quiet host.
    fn hog_request(&mut self, request: Result<hog::Request, String>) -> Result<()> {
        let request = match request {
            Ok(request) => request,
            Err(why) => return self.fail(format!("malformed hog request: {why}")),
        };
        let message = match (&mut self.hog, request) {
            (None, _) => "host hog: not switched (no --host-hog): the host stays quiet".to_owned(),
            (Some(hog), hog::Request::On) if hog.is_on() => "host hog: already on".to_owned(),
            (Some(hog), hog::Request::On) => {
                hog.on();
                format!(
                    "host hog on: {} spinning thread(s), at most {} s",
                    hog.threads(),
                    hog::MAX_ON.as_secs()
                )
            }
            (Some(hog), hog::Request::Off) => {
                hog.off();
                "host hog off".to_owned()
            }
        };
        self.note(&message)
    }

    /// A harness message, on stderr and in the log.
    fn note(&mut self, message: &str) -> Result<()> {
        eprintln!("vm-test: [{}] {message}", self.tag);
        writeln!(self.log, "# {message}")?;
        Ok(())
    }

    /// A harness message that also fails the run.
    fn fail(&mut self, message: String) -> Result<()> {
        self.note(&message)?;
        self.parser.fail(message);
        Ok(())
    }

    /// Sends a guest's request to QMP, connecting first if need be. The
    /// reply is logged when it arrives ([`Self::qmp_message`]).
    fn qmp_request(&mut self, request: Result<qmp::Request, String>) -> Result<()> {
        let request = match request {
            Ok(request) => request,
            Err(why) => return self.fail(format!("QMP: malformed {} request: {why}", qmp::MARKER)),
        };
        if let QmpLink::Listening(path) = &self.qmp {
            let events = self.events.clone();
            self.qmp = match qmp::Client::connect(path, qmp::IO_TIMEOUT, move |message| {
                events.send(Event::Qmp(message)).is_ok()
            }) {
                Ok(client) => QmpLink::Connected(client),
                Err(error) => QmpLink::Failed(format!("{error:#}")),
            };
        }
        let outcome = match &mut self.qmp {
            QmpLink::Absent => Err(format!("the {} run has no QMP socket", self.tag)),
            QmpLink::Listening(_) => unreachable!("connected above"),
            QmpLink::Connected(client) => client.send(&request).map_err(|e| format!("{e:#}")),
            QmpLink::Failed(why) => Err(why.clone()),
        };
        match outcome {
            Ok(()) => Ok(()),
            Err(why) => self.fail(format!("QMP {}: not sent: {why}", request.command)),
        }
    }

    /// Logs a message from QEMU's QMP socket; an error reply fails the run.
    fn qmp_message(&mut self, message: serde_json::Value) -> Result<()> {
        let QmpLink::Connected(client) = &mut self.qmp else {
            return Ok(());
        };
        match client.classify(message) {
            qmp::Incoming::Reply {
                command,
                reply,
                error: None,
            } => self.note(&format!("QMP {command}: {reply}")),
            qmp::Incoming::Reply {
                command,
                reply,
                error: Some(error),
            } => {
                self.note(&format!("QMP {command}: {reply}"))?;
                self.parser.fail(format!("QMP {command} failed: {error}"));
                Ok(())
            }
            qmp::Incoming::Event { name, data } => {
                // When, on the clock of the console lines' timestamps.
                let at = self.started.elapsed().as_secs_f64();
                self.note(&format!("QMP event {name} at {at:.3} s: {data}"))
            }
            qmp::Incoming::Other(message) => self.note(&format!("QMP: {message}")),
        }
    }

    /// Once QEMU is gone: logs what QMP still sent and the requests that
    /// got no reply (the guest powered off first; not a failure by itself).
    fn qmp_finish(&mut self, events: &mpsc::Receiver<Event>) -> Result<()> {
        let QmpLink::Connected(client) = std::mem::replace(&mut self.qmp, QmpLink::Absent) else {
            return Ok(());
        };
        let unanswered = client.finish();
        while let Ok(event) = events.try_recv() {
            if let Event::Qmp(message) = event {
                self.qmp_message(message)?;
            }
        }
        for command in unanswered {
            self.note(&format!("QMP {command}: no reply before QEMU ended"))?;
        }
        Ok(())
    }
}

/// Runs one QEMU, killing it at `timeout`, or at `life_window` if the guest
/// has not printed [`SIGN_OF_LIFE`] by then.
fn attempt(
    machine: &Machine,
    run: RunKind,
    accel: Accel,
    timeout: Duration,
    life_window: Option<Duration>,
    log_path: &Path,
) -> Result<Attempt> {
    let qmp_socket = run
        .has_qmp()
        .then(|| qmp::socket_path(log_path.parent().unwrap_or(Path::new(".")), run.name()));
    if let Some(socket) = &qmp_socket {
        // A socket left by an earlier run: QEMU would fail to listen.
        let _ = fs::remove_file(socket);
    }
    let mut command = machine.command(run, accel, qmp_socket.as_deref());
    let shown: Vec<String> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let (sender, events) = mpsc::channel();
    let mut console = Console {
        tag: match accel {
            Accel::Tcg => run.name().to_owned(),
            Accel::Kvm => format!("{} kvm", run.name()),
        },
        log: BufWriter::new(log),
        parser: LogParser::new(run),
        started: Instant::now(),
        alive: life_window.is_none(),
        started_guest: false,
        qmp: qmp_socket
            .clone()
            .map_or(QmpLink::Absent, QmpLink::Listening),
        events: sender.clone(),
        hog: (machine.host_hog > 0).then(|| Hog::new(machine.host_hog)),
    };
    console.note(&shown.join(" "))?;
    let mut qemu = Qemu(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", machine.qemu.display()))?,
    );
    let readers = [
        spawn_reader(qemu.0.stdout.take(), "", sender.clone()),
        spawn_reader(qemu.0.stderr.take(), "qemu: ", sender),
    ];
    let mut open_streams = readers.len();

    let mut killed_after = None;
    let mut timers_stopped = false;
    while open_streams > 0 {
        let limit = match life_window {
            Some(window) if !console.alive => window.min(timeout),
            _ => timeout,
        };
        let elapsed = console.started.elapsed();
        if elapsed >= limit {
            killed_after = Some(elapsed);
            break;
        }
        match events.recv_timeout(limit - elapsed) {
            Ok(Event::Line(line)) => {
                console.line(&line)?;
                // A guest whose clock stopped only waits for the timeout.
                if console.parser.timers_stopped().is_some() {
                    timers_stopped = true;
                    killed_after = Some(console.started.elapsed());
                    break;
                }
            }
            Ok(Event::Closed) => open_streams -= 1,
            Ok(Event::Qmp(message)) => console.qmp_message(message)?,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let ended = killed_after.unwrap_or_else(|| console.started.elapsed());
    let status = match killed_after {
        Some(after) => {
            let seconds = after.as_secs_f64();
            console.note(&if timers_stopped {
                format!("the guest's timers stopped: killing QEMU after {seconds:.0} s")
            } else if console.alive {
                format!("timeout: killing QEMU after {seconds:.0} s")
            } else {
                format!("no sign of life after {seconds:.0} s: killing QEMU")
            })?;
            drop(qemu);
            None
        }
        None => Some(qemu.wait_briefly()?),
    };
    // The streams close once QEMU is gone; keep what it printed last.
    let drain_until = Instant::now() + DRAIN;
    while open_streams > 0 {
        match events.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
            Ok(Event::Line(line)) => console.line(&line)?,
            Ok(Event::Closed) => open_streams -= 1,
            Ok(Event::Qmp(message)) => console.qmp_message(message)?,
            Err(_) => break,
        }
    }
    if open_streams == 0 {
        for reader in readers {
            let _ = reader.join();
        }
    }
    let wall = console.started.elapsed();
    if let Some(status) = status {
        console.note(&format!(
            "QEMU exited: {status} after {:.3} s",
            wall.as_secs_f64()
        ))?;
    }
    console.qmp_finish(&events)?;
    if let Some(socket) = &qmp_socket {
        let _ = fs::remove_file(socket);
    }
    console.log.flush()?;
    let ending = match killed_after {
        None => Ending::Exited,
        Some(after) if timers_stopped => Ending::TimersStopped(after),
        Some(after) => Ending::TimedOut(after),
    };
    let mut report = console.parser.finish(ending, wall);
    if let Some(status) = status.filter(|s| !s.success()) {
        report
            .failures
            .insert(0, format!("QEMU exited with {status}"));
    }
    Ok(Attempt {
        report,
        status,
        wall,
        alive: console.alive,
        started: console.started_guest,
        timers_stopped,
        ended,
    })
}

/// Reads `stream` line by line into `events`, each line cleaned and prefixed.
fn spawn_reader(
    stream: Option<impl std::io::Read + Send + 'static>,
    prefix: &'static str,
    events: Sender<Event>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        if let Some(stream) = stream {
            let mut reader = BufReader::new(stream);
            let mut raw = Vec::new();
            while reader.read_until(b'\n', &mut raw).is_ok_and(|n| n > 0) {
                let line = format!("{prefix}{}", clean_line(&raw));
                raw.clear();
                if events.send(Event::Line(line)).is_err() {
                    return;
                }
            }
        }
        let _ = events.send(Event::Closed);
    })
}

/// A console line as text: lossy UTF-8, without the line ending, terminal
/// escape sequences or other control characters (SeaBIOS clears the screen).
pub fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut clean = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters... final byte in @..~; other escapes: one more char.
                if chars.next_if_eq(&'[').is_some() {
                    while chars.next().is_some_and(|c| !('@'..='~').contains(&c)) {}
                } else {
                    chars.next();
                }
            }
            '\t' => clean.push(c),
            c if c.is_control() => {}
            c => clean.push(c),
        }
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_lose_escapes_and_line_endings() {
        assert_eq!(
            clean_line(b"\x1b[2J\x1b[01;01HSeaBIOS (version 1.16)\r\n"),
            "SeaBIOS (version 1.16)"
        );
        assert_eq!(clean_line(b"VMTEST-END x rc=0\r\r\n"), "VMTEST-END x rc=0");
        assert_eq!(clean_line(b"bad \xff byte\tok\n"), "bad \u{fffd} byte\tok");
        assert_eq!(clean_line(b"\x1bcreset"), "reset");
    }

    #[test]
    fn the_virtio_run_adds_the_device_and_both_name_the_run() {
        let machine = Machine {
            qemu: "qemu".into(),
            kernel: "/k".into(),
            initrd: "/i".into(),
            host_hog: 0,
        };
        let args = |run, accel| -> Vec<String> {
            machine
                .command(run, accel, None)
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let plain = args(RunKind::Plain, Accel::Tcg);
        assert_eq!(plain[..4], ["-accel", "tcg", "-cpu", "max"]);
        assert!(plain.contains(
            &"console=ttyS0 quiet panic=-1 tsc=reliable VMTEST_RUN=plain CRYPTO_OFFLOAD_GUEST=1".into()
        ));
        assert!(!plain.iter().any(|a| a.contains("virtio-crypto")));
        assert!(plain.windows(2).any(|w| w == ["-m", "2048"]), "{plain:?}");
        let virtio = args(RunKind::Virtio, Accel::Kvm);
        assert_eq!(virtio[..4], ["-accel", "kvm", "-cpu", "host"]);
        assert!(virtio.windows(2).any(|w| w == ["-m", "2048"]), "{virtio:?}");
        assert!(virtio.contains(&"virtio-crypto-pci,cryptodev=cryptodev0".into()));
        assert!(
            virtio
                .iter()
                .any(|a| a.ends_with("VMTEST_RUN=virtio CRYPTO_OFFLOAD_GUEST=1"))
        );
    }

    #[test]
    fn the_vfio_run_has_an_iommu_three_devices_on_root_ports_and_qmp() {
        let machine = Machine {
            qemu: "qemu".into(),
            kernel: "/k".into(),
            initrd: "/i".into(),
            host_hog: 0,
        };
        let command = machine.command(
            RunKind::Vfio,
            Accel::Tcg,
            Some(Path::new("/t/vm-test,x/vfio.qmp")),
        );
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(
            line.starts_with(
                "-accel tcg -cpu max -machine q35,kernel-irqchip=split \
                 -device intel-iommu,intremap=on,caching-mode=on -m 2048 -smp 2 "
            ),
            "{line}"
        );
        assert!(
            line.contains(" VMTEST_RUN=vfio CRYPTO_OFFLOAD_GUEST=1 intel_iommu=on "),
            "{line}"
        );
        // crypto0 and crypto1 for VFIO (in slot order), crypto2 for the
        // kernel, without ACCESS_PLATFORM.
        for (n, iommu_platform) in [(0, "on"), (1, "on"), (2, "off")] {
            let port = n + 1;
            assert!(
                line.contains(&format!(
                    "-object cryptodev-backend-builtin,id=cryptodev{n} \
                     -device pcie-root-port,id=rp{port},bus=pcie.0,chassis={port},slot={port} \
                     -device virtio-crypto-pci,id=crypto{n},bus=rp{port},cryptodev=cryptodev{n},iommu_platform={iommu_platform},disable-legacy=on"
                )),
                "{line}"
            );
        }
        assert_eq!(line.matches("virtio-crypto-pci").count(), 3, "{line}");
        assert_eq!(VFIO_DEVICE_IDS, ["crypto0", "crypto1"]);
        assert_eq!(KERNEL_DEVICE_ID, "crypto2");
        // The socket path's comma is doubled for QEMU's option parser.
        assert!(
            line.ends_with("-qmp unix:/t/vm-test,,x/vfio.qmp,server=on,wait=off"),
            "{line}"
        );
        assert!(RunKind::Vfio.has_qmp() && !RunKind::Virtio.has_qmp());
        let virtio = machine.command(RunKind::Virtio, Accel::Tcg, None);
        assert!(
            !virtio
                .get_args()
                .any(|a| a.to_string_lossy().contains("iommu") || a == "-qmp")
        );
    }

    #[test]
    fn the_weak_run_is_the_vfio_machine_with_a_cpu_without_aes() {
        let machine = Machine {
            qemu: "qemu".into(),
            kernel: "/k".into(),
            initrd: "/i".into(),
            host_hog: 0,
        };
        let args = |run, accel| -> String {
            machine
                .command(run, accel, None)
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let weak = args(RunKind::Weak, Accel::Tcg);
        assert!(
            weak.starts_with(
                "-accel tcg -cpu max,-aes,-pclmulqdq,-vaes,-vpclmulqdq -machine q35,kernel-irqchip=split \
                 -device intel-iommu,intremap=on,caching-mode=on -m 2048 -smp 2 "
            ),
            "{weak}"
        );
        assert!(weak.contains(" VMTEST_RUN=weak CRYPTO_OFFLOAD_GUEST=1 intel_iommu=on "));
        assert_eq!(weak.matches("virtio-crypto-pci").count(), 3, "{weak}");
        assert!(!weak.contains("-qmp"));
        assert!(
            args(RunKind::Weak, Accel::Kvm)
                .starts_with("-accel kvm -cpu host,-aes,-pclmulqdq,-vaes,-vpclmulqdq ")
        );
        // The vfio run's devices, the vfio run's CPU.
        let vfio = args(RunKind::Vfio, Accel::Tcg);
        assert_eq!(
            vfio.split(" -append")
                .next()
                .map(|s| s.replace("-cpu max", "")),
            weak.split(" -append")
                .next()
                .map(|s| s.replace("-cpu max,-aes,-pclmulqdq,-vaes,-vpclmulqdq", ""))
        );
    }

    /// A folder of its own and a machine whose QEMU is `script` (a shell
    /// script, `$DIR` standing for the folder).
    fn fake_machine(name: &str, script: &str) -> (std::path::PathBuf, Machine) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let qemu = dir.join("qemu");
        let script = script.replace("$DIR", &dir.display().to_string());
        std::fs::write(&qemu, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o755)).unwrap();
        let machine = Machine {
            qemu,
            kernel: "/k".into(),
            initrd: "/i".into(),
            host_hog: 0,
        };
        (dir, machine)
    }

    /// Runs a fake QEMU (a shell script) under [`attempt`].
    fn fake_qemu(
        name: &str,
        script: &str,
        timeout: Duration,
        life_window: Option<Duration>,
    ) -> (Attempt, Duration, String) {
        let (dir, machine) = fake_machine(&format!("qemu-{name}"), script);
        let started = Instant::now();
        let result = attempt(
            &machine,
            RunKind::Plain,
            Accel::Tcg,
            timeout,
            life_window,
            &dir.join("t.log"),
        );
        let log = std::fs::read_to_string(dir.join("t.log")).unwrap_or_default();
        std::fs::remove_dir_all(&dir).unwrap();
        (result.unwrap(), started.elapsed(), log)
    }

    #[test]
    fn a_hung_guest_is_killed_at_the_timeout() {
        let (attempt, took, log) = fake_qemu(
            "hung",
            "echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; exec sleep 60",
            Duration::from_millis(700),
            None,
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(attempt.status.is_none(), "killed, not exited");
        assert!(
            attempt.report.failures[0].starts_with("timed out"),
            "{:?}",
            attempt.report.failures
        );
        assert!(
            log.contains("VMTEST-BEGIN t") && log.contains("timeout: killing QEMU"),
            "{log}"
        );
    }

    /// Boots the plain run under TCG on a fake QEMU; returns the boot and
    /// the crashed attempt's log, if one was kept.
    fn fake_boot(name: &str, script: &str) -> (Boot, Option<String>) {
        let (dir, machine) = fake_machine(&format!("boot-{name}"), script);
        let mut chooser = AccelChooser::new(AccelPolicy::Tcg);
        let boot = boot(
            &machine,
            RunKind::Plain,
            Duration::from_secs(30),
            &dir,
            &mut chooser,
        )
        .unwrap();
        let crash_log = std::fs::read_to_string(dir.join("plain-crash.log")).ok();
        std::fs::remove_dir_all(&dir).unwrap();
        (boot, crash_log)
    }

    const PASSING_GUEST: &str = "echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; echo 'VMTEST-END t rc=0'; echo VMTEST-DONE";

    #[test]
    fn a_qemu_that_crashes_once_is_run_again_and_says_so() {
        // The first QEMU segfaults mid-run; the second passes.
        let (boot, crash_log) = fake_boot(
            "crash-once",
            &format!(
                "if [ ! -e $DIR/crashed ]; then touch $DIR/crashed; \
                 echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; kill -SEGV $$; fi; \
                 {PASSING_GUEST}"
            ),
        );
        assert!(boot.report.passed(), "{:?}", boot.report.failures);
        let note = boot.crash_note.expect("the crash is reported");
        assert!(
            note.contains("signal 11") && note.contains("plain-crash.log"),
            "{note}"
        );
        assert!(crash_log.unwrap().contains("VMTEST-BEGIN t"));
    }

    #[test]
    fn a_qemu_that_crashes_twice_fails_the_run() {
        let (boot, _) = fake_boot(
            "crash-twice",
            "echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; kill -SEGV $$",
        );
        assert!(boot.crash_note.is_some());
        assert!(
            boot.report.failures[0].contains("signal: 11"),
            "{:?}",
            boot.report.failures
        );
    }

    #[test]
    fn a_failure_before_the_crash_fails_the_repeated_run() {
        // The first QEMU runs a failing test, then segfaults; the repeat
        // passes (the failure came and went, the crash hid it).
        let (boot, _) = fake_boot(
            "fail-then-crash",
            &format!(
                "if [ ! -e $DIR/crashed ]; then touch $DIR/crashed; \
                 echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; echo 'VMTEST-END t rc=1'; \
                 echo VMTEST-BEGIN u; kill -SEGV $$; fi; \
                 {PASSING_GUEST}"
            ),
        );
        assert!(!boot.report.passed());
        assert!(
            boot.report
                .failures
                .iter()
                .any(|f| f.starts_with("t: exit status 1 in the attempt repeated (QEMU crashed")),
            "{:?}",
            boot.report.failures
        );
        let note = boot.crash_note.unwrap();
        assert!(note.contains("during u"), "{note}");
    }

    /// The kernel's line from the CI run whose vCPU 1 stopped taking
    /// timer interrupts.
    const TIMERS_STOPPED: &str =
        "echo '[   57.267820] rcu: 	Possible timer handling issue on cpu=1 timer-softirq=488'";

    #[test]
    fn a_guest_whose_timers_stop_is_stopped_at_once_and_run_again() {
        // The first guest's timers stop mid-test and it hangs; the second passes.
        let started = Instant::now();
        let (boot, first_log) = fake_boot(
            "timers-once",
            &format!(
                "if [ ! -e $DIR/stopped ]; then touch $DIR/stopped; \
                 echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; {TIMERS_STOPPED}; exec sleep 60; fi; \
                 {PASSING_GUEST}"
            ),
        );
        // Not held to the 30 s timeout.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(boot.report.passed(), "{:?}", boot.report.failures);
        let note = boot.crash_note.expect("the repeat is reported");
        assert!(
            note.starts_with("the guest's timers stopped") && note.contains("during t"),
            "{note}"
        );
        let first_log = first_log.unwrap();
        assert!(
            first_log.contains("Possible timer handling issue")
                && first_log.contains("the guest's timers stopped: killing QEMU"),
            "{first_log}"
        );
    }

    #[test]
    fn a_guest_whose_timers_stop_twice_fails_the_run() {
        // Each attempt counts itself in $DIR/attempts.
        let (dir, machine) = fake_machine(
            "timers-twice",
            &format!(
                "echo x >> $DIR/attempts; \
                 echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; {TIMERS_STOPPED}; exec sleep 60"
            ),
        );
        let started = Instant::now();
        let boot = boot(
            &machine,
            RunKind::Plain,
            Duration::from_secs(30),
            &dir,
            &mut AccelChooser::new(AccelPolicy::Tcg),
        )
        .unwrap();
        let attempts = std::fs::read_to_string(dir.join("attempts")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(attempts.lines().count(), 2, "repeated once, not more");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(boot.crash_note.is_some());
        assert!(
            boot.report.failures[0].starts_with("the guest's timers stopped: QEMU killed after"),
            "{:?}",
            boot.report.failures
        );
    }

    #[test]
    fn a_qemu_that_crashes_before_the_guest_starts_is_not_run_again() {
        let (boot, crash_log) = fake_boot("crash-at-start", "kill -SEGV $$");
        assert!(!boot.report.passed());
        assert!(boot.crash_note.is_none() && crash_log.is_none());
    }

    #[test]
    fn a_failing_guest_or_a_qemu_error_is_not_run_again() {
        // A test that fails, and QEMU exiting with an error of its own.
        for (name, script) in [
            (
                "guest-fails",
                "echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; echo 'VMTEST-END t rc=1'; echo VMTEST-DONE",
            ),
            ("qemu-error", "echo VMTEST-INIT; exit 1"),
        ] {
            let (boot, crash_log) = fake_boot(name, script);
            assert!(!boot.report.passed(), "{name}");
            assert!(boot.crash_note.is_none() && crash_log.is_none(), "{name}");
        }
    }

    #[test]
    fn a_silent_guest_is_given_up_after_the_life_window() {
        let (attempt, took, _) = fake_qemu(
            "silent",
            "exec sleep 60",
            Duration::from_secs(60),
            Some(Duration::from_millis(500)),
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(!attempt.alive);
    }

    #[test]
    fn a_guest_that_finishes_is_judged_from_its_output() {
        let (attempt, _, _) = fake_qemu(
            "finishes",
            "echo VMTEST-INIT; echo VMTEST-BOOTED; echo VMTEST-BEGIN t; echo 'VMTEST-END t rc=0'; echo qemu-warning >&2; echo VMTEST-DONE",
            Duration::from_secs(30),
            Some(Duration::from_secs(30)),
        );
        assert!(attempt.alive);
        assert!(attempt.status.unwrap().success());
        assert!(attempt.report.passed(), "{:?}", attempt.report.failures);
        assert_eq!(attempt.report.binaries.len(), 1);
    }
}
