//! `cargo xtask vm-test`: the steps in order.
//!
//! 1. find the host tools ([`crate::tools`]);
//! 2. build the guest's programs ([`crate::guest_binaries`]) and find their
//!    shared libraries ([`crate::shared_libs`]);
//! 3. plan the modules ([`crate::modules`]) and choose the kernel
//!    ([`crate::kernel`]);
//! 4. pack the initramfs ([`crate::initramfs`], [`crate::guest_init`]) in
//!    `target/vm-test/stage/`;
//! 5. boot each run ([`crate::qemu`]), judge its console
//!    ([`crate::guest_log`]) and print the table ([`crate::summary`]).

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use crate::guest_binaries::{self, BinSpec, GuestBinary, Workspace};
use crate::guest_init::{self, BIN_DIR, MODULES_PATH, STEPS_PATH, TEST_ARGS_PATH, TESTS_DIR};
use crate::initramfs::{Initramfs, Source};
use crate::modules::{self, Skipped};
use crate::qemu::{self, AccelChooser, AccelPolicy, Machine, RunKind};
use crate::{kernel, shared_libs, summary, tools};

/// gzip level of the initramfs: 0, stored. The test binaries carry ~100 MB
/// of mostly debug info, and under TCG the guest kernel's inflate is slow:
/// /init started after 3.2 s stored, 4.4 s at level 1 and 3.7 s at level 9
/// (which costs 13 s on the host). The archive never leaves target/.
const GZIP_LEVEL: u32 = 0;

/// Options of `cargo xtask vm-test`.
#[derive(Debug, Args)]
pub struct VmTestArgs {
    /// Kernel image to boot [default: the newest /boot/vmlinuz-* with a
    /// /lib/modules/RELEASE/modules.dep].
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Seconds each guest run may take before QEMU is killed.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub timeout: u64,
    /// Keep the staging folder (target/vm-test/stage: initramfs, manifest,
    /// generated guest files).
    #[arg(long)]
    pub keep: bool,
    /// Which guest runs to boot.
    #[arg(long, value_enum, default_value_t = RunSelection::All)]
    pub run: RunSelection,
    /// Package whose test binaries run in the guest (repeatable), as
    /// `PACKAGE[+FEATURE…][/TEST]` [default: crypto-offload-af-alg and
    /// crypto-offload+af-alg/af_alg if the workspace has them, else
    /// crypto-offload-fallback].
    #[arg(long = "package", short = 'p', value_name = "P")]
    pub packages: Vec<String>,
    /// Extra binary built --release into the guest's /bin (repeatable)
    /// [default: offload-cli:offload and
    /// crypto-offload-benches:af-alg-overhead].
    #[arg(long = "bin-package", value_name = "P:BIN", default_values = guest_binaries::DEFAULT_BINARIES)]
    pub bin_packages: Vec<BinSpec>,
    /// Skip tests whose names contain NAME (libtest's --skip; repeatable).
    #[arg(long, value_name = "NAME")]
    pub skip: Vec<String>,
    /// Accelerator: auto tries KVM and falls back to TCG.
    #[arg(long, value_enum, default_value_t = AccelPolicy::Auto)]
    pub accel: AccelPolicy,
}

/// `--run`: one run or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunSelection {
    /// No devices.
    Plain,
    /// With virtio-crypto.
    Virtio,
    /// Both, plain first.
    All,
}

impl RunSelection {
    fn runs(self) -> &'static [RunKind] {
        match self {
            Self::Plain => &[RunKind::Plain],
            Self::Virtio => &[RunKind::Virtio],
            Self::All => &[RunKind::Plain, RunKind::Virtio],
        }
    }
}

/// Whether every run passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every run passed.
    Pass,
    /// Some run failed (the summary says why).
    Fail,
}

/// Runs `vm-test`.
pub fn run(args: &VmTestArgs) -> Result<Verdict> {
    let started = Instant::now();
    let mut phases: Vec<(&str, Duration)> = Vec::new();
    let host = tools::find(args.kernel.as_deref())?;
    eprintln!(
        "vm-test: qemu {}, busybox {}, kernel {} (release {})",
        host.qemu.display(),
        host.busybox.display(),
        host.kernel.image.display(),
        host.kernel.version
    );

    let phase = Instant::now();
    let cargo = guest_binaries::cargo();
    let workspace = Workspace::load(&cargo)?;
    let packages = if args.packages.is_empty() {
        workspace.default_test_packages()
    } else {
        args.packages.clone()
    };
    let tests = guest_binaries::build_tests(&cargo, &workspace, &packages)?;
    let bins = args
        .bin_packages
        .iter()
        .map(|spec| guest_binaries::build_release_bin(&cargo, &workspace, spec))
        .collect::<Result<Vec<_>>>()?;
    phases.push(("build", phase.elapsed()));

    let phase = Instant::now();
    let vm_dir = workspace.target_directory.join("vm-test");
    fs::create_dir_all(&vm_dir).with_context(|| format!("creating {}", vm_dir.display()))?;
    let boot_image = kernel::boot_image(&host.kernel.image, &vm_dir)?;
    eprintln!("vm-test: booting {}", boot_image.note);
    let stage = vm_dir.join("stage");
    let initrd = pack_initramfs(&host, &tests, &bins, &args.skip, &stage)?;
    phases.push(("kernel and initramfs", phase.elapsed()));

    let machine = Machine {
        qemu: host.qemu.clone(),
        kernel: boot_image.path,
        initrd,
    };
    let mut chooser = AccelChooser::new(args.accel);
    if let Some(reason) = chooser.kvm_unusable() {
        eprintln!("vm-test: TCG, not KVM: {reason}");
    }
    let timeout = Duration::from_secs(args.timeout);
    let mut runs = Vec::new();
    for &run in args.run.runs() {
        let boot = qemu::boot(&machine, run, timeout, &vm_dir, &mut chooser)?;
        let verdict = if boot.report.passed() {
            "passed"
        } else {
            "FAILED"
        };
        eprintln!(
            "vm-test: {} run {verdict} under {} in {:.1} s (log {})",
            run.name(),
            boot.accel.name(),
            boot.wall.as_secs_f64(),
            boot.log.display()
        );
        runs.push((run, boot));
    }

    print!("{}", summary::render(&runs, &phases, started.elapsed()));
    if args.keep {
        println!("staging folder kept: {}", stage.display());
    } else {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let passed = runs.iter().all(|(_, boot)| boot.report.passed());
    if !passed {
        println!("vm-test: FAILED");
    }
    Ok(if passed { Verdict::Pass } else { Verdict::Fail })
}

/// Packs busybox, the programs and their libraries, the modules and the
/// guest's scripts into `stage/initramfs.cpio.gz` and returns its path. The
/// stage also gets a manifest and copies of the generated files.
fn pack_initramfs(
    host: &tools::HostTools,
    tests: &[GuestBinary],
    bins: &[GuestBinary],
    skip: &[String],
    stage: &std::path::Path,
) -> Result<PathBuf> {
    if stage.exists() {
        fs::remove_dir_all(stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    fs::create_dir_all(stage).with_context(|| format!("creating {}", stage.display()))?;
    let mut initramfs = Initramfs::new();
    initramfs.add_char_device("/dev/console", 5, 1)?;
    initramfs.add_file("/bin/busybox", Source::Host(host.busybox.clone()), 0o755)?;

    let mut libraries = BTreeSet::new();
    for (dir, binaries) in [(TESTS_DIR, tests), (BIN_DIR, bins)] {
        for binary in binaries {
            initramfs.add_file(
                &format!("{dir}/{}", binary.name),
                Source::Host(binary.host_path.clone()),
                0o755,
            )?;
            libraries.extend(shared_libs::libraries_of(&host.ldd, &binary.host_path)?);
        }
    }
    for library in &libraries {
        let guest = library.to_str().context("a library path is not UTF-8")?;
        initramfs.add_file(guest, Source::Host(library.clone()), 0o755)?;
    }

    let plan = modules::plan_for(&host.kernel.modules_dir)?;
    for skipped in &plan.skipped {
        match skipped {
            Skipped::BuiltIn(name) => {
                eprintln!("vm-test: module {name}: built in (modules.builtin), skipped")
            }
            Skipped::Unknown(name) => {
                eprintln!(
                    "vm-test: module {name}: not in modules.dep nor modules.builtin; assumed built in, skipped"
                );
            }
        }
    }
    let guest_modules_dir = format!("/lib/modules/{}", host.kernel.version);
    let mut order = Vec::new();
    for module in &plan.order {
        let (bytes, plain) = modules::module_file(&host.kernel.modules_dir, module)?;
        initramfs.add_file(
            &format!("{guest_modules_dir}/{plain}"),
            Source::Bytes(bytes),
            0o644,
        )?;
        order.push(plain);
    }

    let generated = [
        ("/init", guest_init::INIT_SCRIPT.to_owned(), 0o755),
        (
            MODULES_PATH,
            guest_init::modules_list(&guest_modules_dir, &order),
            0o644,
        ),
        (TEST_ARGS_PATH, guest_init::test_args(skip), 0o644),
        (STEPS_PATH, guest_init::STEPS.to_owned(), 0o644),
    ];
    for (path, text, mode) in generated {
        initramfs.add_file(path, Source::Bytes(text.clone().into_bytes()), mode)?;
        let copy = stage.join(path.trim_start_matches('/'));
        fs::create_dir_all(copy.parent().unwrap_or(stage))?;
        fs::write(&copy, text).with_context(|| format!("writing {}", copy.display()))?;
    }
    fs::write(stage.join("manifest.txt"), initramfs.manifest())?;

    let started = Instant::now();
    let path = stage.join("initramfs.cpio.gz");
    let written = initramfs.write_gz(&path, GZIP_LEVEL)?;
    let packed = fs::metadata(&path)?.len();
    eprintln!(
        "vm-test: initramfs {}: {} entries, {} test binaries, {} modules, {:.1} MiB -> {:.1} MiB gzip in {:.1} s",
        path.display(),
        written.entries,
        tests.len(),
        order.len(),
        written.content_bytes as f64 / f64::from(1 << 20),
        packed as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}
