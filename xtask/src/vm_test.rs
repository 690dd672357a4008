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

use crate::guest_binaries::{self, BinSpec, GuestBinary, TestBinary, Workspace};
use crate::guest_init::{
    self, BIN_DIR, MODULES_PATH, STEPS_PATH, TEST_ARGS_PATH, TESTS_DIR, TESTS_PATH,
};
use crate::initramfs::{Initramfs, Source};
use crate::modules::{self, Skipped};
use crate::qemu::{self, AccelChooser, AccelPolicy, Machine, RunKind};
use crate::{Verdict, dpdk, kernel, shared_libs, summary, tools};

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
    /// Package whose test binaries run in every guest run (repeatable), as
    /// `PACKAGE[+FEATURE…][/TEST]` [default: crypto-offload-af-alg and
    /// crypto-offload+af-alg/af_alg if the workspace has them, else
    /// crypto-offload-fallback; in the vfio run crypto-offload-vfio and
    /// crypto-offload+vfio+af-alg/vfio if the workspace has them].
    #[arg(long = "package", short = 'p', value_name = "P")]
    pub packages: Vec<String>,
    /// Extra binary built --release into the guest's /bin (repeatable)
    /// [default: offload-cli:offload, crypto-offload-benches:af-alg-overhead,
    /// af-alg-vs-kcapi, vfio-spread and vfio-vs-dpdk, and crypto-offload-examples:block-server,
    /// block-load, record-server and record-load].
    #[arg(long = "bin-package", value_name = "P:BIN", default_values = guest_binaries::DEFAULT_BINARIES)]
    pub bin_packages: Vec<BinSpec>,
    /// A prebuilt executable for the guest's /bin, as `NAME=PATH`
    /// (repeatable): built outside the workspace, as the fuzz targets are
    /// (`fuzz/build-guest`); its libraries come along as the others'.
    #[arg(long = "bin-file", value_name = "NAME=PATH", value_parser = parse_bin_file)]
    pub bin_files: Vec<GuestBinary>,
    /// Skip tests whose names contain NAME (libtest's --skip; repeatable).
    #[arg(long, value_name = "NAME")]
    pub skip: Vec<String>,
    /// Accelerator: auto tries KVM and falls back to TCG.
    #[arg(long, value_enum, default_value_t = AccelPolicy::Auto)]
    pub accel: AccelPolicy,
    /// Give the runs a host CPU hog of N spinning threads, which a guest
    /// step switches on and off (`VMTEST-HOG on|off` on its console): the
    /// selector measured on a loaded host, beside the quiet figures of the
    /// same boot. Each `on` spins at most 600 s. Without it those steps
    /// measure a quiet host (the log says so).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub host_hog: usize,
}

/// `--bin-file NAME=PATH`: the file must exist (a missing one would only
/// show up as a skipped step in the guest).
fn parse_bin_file(spec: &str) -> Result<GuestBinary, String> {
    let (name, path) = spec
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PATH, got {spec:?}"))?;
    if name.is_empty() || name.contains('/') {
        return Err(format!("{name:?} is not a file name"));
    }
    let host_path = PathBuf::from(path);
    if !host_path.is_file() {
        return Err(format!("{path}: no such file"));
    }
    Ok(GuestBinary {
        name: name.to_owned(),
        host_path,
    })
}

/// `--run`: one run or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunSelection {
    /// No devices.
    Plain,
    /// With virtio-crypto.
    Virtio,
    /// With an emulated IOMMU and two virtio-crypto devices bound to vfio-pci.
    Vfio,
    /// The vfio run's devices with a guest CPU without AES-NI or PCLMULQDQ.
    Weak,
    /// All four: plain, virtio, vfio, weak.
    All,
}

impl RunSelection {
    fn runs(self) -> &'static [RunKind] {
        match self {
            Self::Plain => &[RunKind::Plain],
            Self::Virtio => &[RunKind::Virtio],
            Self::Vfio => &[RunKind::Vfio],
            Self::Weak => &[RunKind::Weak],
            Self::All => &RunKind::ALL,
        }
    }
}

/// The test specs to build and the runs that run each: every given
/// `--package` in every run, or else each run's defaults
/// ([`Workspace::default_test_packages_for`]), each spec once.
fn test_plan(
    workspace: &Workspace,
    given: &[String],
    runs: &[RunKind],
) -> Vec<(String, Vec<RunKind>)> {
    let mut plan: Vec<(String, Vec<RunKind>)> = Vec::new();
    for &run in runs {
        let specs = if given.is_empty() {
            workspace.default_test_packages_for(run)
        } else {
            given.to_vec()
        };
        for spec in specs {
            match plan.iter_mut().find(|(s, _)| *s == spec) {
                Some((_, spec_runs)) if !spec_runs.contains(&run) => spec_runs.push(run),
                Some(_) => {}
                None => plan.push((spec, vec![run])),
            }
        }
    }
    plan
}

/// The runs that run each test binary: those of the specs that built it.
fn runs_of_tests(plan: &[(String, Vec<RunKind>)], tests: &[TestBinary]) -> Vec<Vec<RunKind>> {
    tests
        .iter()
        .map(|test| {
            let runs: BTreeSet<RunKind> = test
                .specs
                .iter()
                .flat_map(|&index| plan[index].1.iter().copied())
                .collect();
            runs.into_iter().collect()
        })
        .collect()
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

    // DPDK only for the vfio run's dpdk-crypto-perf step, and only if the
    // host has it: without it the step is skipped and the run still passes.
    let dpdk = if args.run.runs().contains(&RunKind::Vfio) {
        let found = dpdk::find(&host.ldd)?;
        if found.is_none() {
            eprintln!(
                "vm-test: no {} on the host (Debian package dpdk-dev): the vfio run's dpdk-crypto-perf step is skipped",
                dpdk::HOST_BINARY
            );
        }
        found
    } else {
        None
    };

    let phase = Instant::now();
    let cargo = guest_binaries::cargo();
    let workspace = Workspace::load(&cargo)?;
    let plan = test_plan(&workspace, &args.packages, args.run.runs());
    let specs: Vec<String> = plan.iter().map(|(spec, _)| spec.clone()).collect();
    // With no --package, one build of the workspace's tests (the README's
    // test build, reused as it is) serves the default specs.
    let tests = guest_binaries::build_tests(&cargo, &workspace, &specs, args.packages.is_empty())?;
    let test_runs = runs_of_tests(&plan, &tests);
    for (test, runs) in tests.iter().zip(&test_runs) {
        if runs.len() < args.run.runs().len() {
            let names: Vec<&str> = runs.iter().map(|r| r.name()).collect();
            eprintln!(
                "vm-test: test {} runs in the {} run(s) only",
                test.binary.name,
                names.join(", ")
            );
        }
    }
    let mut bins = guest_binaries::build_release_bins(&cargo, &workspace, &args.bin_packages)?;
    bins.extend(args.bin_files.iter().cloned());
    phases.push(("build", phase.elapsed()));

    let phase = Instant::now();
    let vm_dir = workspace.target_directory.join("vm-test");
    fs::create_dir_all(&vm_dir).with_context(|| format!("creating {}", vm_dir.display()))?;
    let boot_image = kernel::boot_image(&host.kernel.image, &vm_dir)?;
    eprintln!("vm-test: booting {}", boot_image.note);
    let stage = vm_dir.join("stage");
    let initrd = pack_initramfs(
        &host,
        &tests,
        &test_runs,
        &bins,
        dpdk.as_ref(),
        &args.skip,
        &stage,
    )?;
    phases.push(("kernel and initramfs", phase.elapsed()));

    let machine = Machine {
        qemu: host.qemu.clone(),
        kernel: boot_image.path,
        initrd,
        host_hog: args.host_hog,
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
/// stage also gets a manifest and copies of the generated files. One
/// initramfs serves every run: `test_runs` (one entry per test) says which
/// runs run each test, and each run's own modules are listed apart. With
/// `dpdk`, DPDK's test application, its plugins and libraries and the
/// script that runs it go in too.
fn pack_initramfs(
    host: &tools::HostTools,
    tests: &[TestBinary],
    test_runs: &[Vec<RunKind>],
    bins: &[GuestBinary],
    dpdk: Option<&dpdk::Dpdk>,
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
    let test_binaries: Vec<GuestBinary> = tests.iter().map(|t| t.binary.clone()).collect();
    for (dir, binaries) in [(TESTS_DIR, test_binaries.as_slice()), (BIN_DIR, bins)] {
        for binary in binaries {
            initramfs.add_file(
                &format!("{dir}/{}", binary.name),
                Source::Host(binary.host_path.clone()),
                0o755,
            )?;
            libraries.extend(shared_libs::libraries_of(&host.ldd, &binary.host_path)?);
        }
    }
    if let Some(dpdk) = dpdk {
        initramfs.add_file(dpdk::GUEST_BINARY, Source::Host(dpdk.binary.clone()), 0o755)?;
        // The plugins are libraries too: at their host paths.
        libraries.extend(dpdk.libraries.iter().chain(&dpdk.plugins).cloned());
    }
    for library in &libraries {
        let guest = library.to_str().context("a library path is not UTF-8")?;
        initramfs.add_file(guest, Source::Host(library.clone()), 0o755)?;
    }

    let plan = modules::plan_for(&host.kernel.modules_dir)?;
    for skipped in plan.skipped() {
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
    let mut module_count = 0;
    let mut add_modules = |initramfs: &mut Initramfs, plan: &modules::LoadPlan| {
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
        module_count += order.len();
        anyhow::Ok(guest_init::modules_list(&guest_modules_dir, &order))
    };
    let mut generated = vec![
        (
            "/init".to_owned(),
            guest_init::INIT_SCRIPT.to_owned(),
            0o755,
        ),
        (
            MODULES_PATH.to_owned(),
            add_modules(&mut initramfs, &plan.common)?,
            0o644,
        ),
    ];
    for (run, run_plan) in &plan.runs {
        generated.push((
            guest_init::run_modules_path(*run),
            add_modules(&mut initramfs, run_plan)?,
            0o644,
        ));
    }
    let tests_list = guest_init::tests_list(
        tests
            .iter()
            .zip(test_runs)
            .map(|(test, runs)| (test.binary.name.as_str(), runs.as_slice())),
    );
    generated.extend([
        (TESTS_PATH.to_owned(), tests_list, 0o644),
        (
            TEST_ARGS_PATH.to_owned(),
            guest_init::test_args(skip),
            0o644,
        ),
        (STEPS_PATH.to_owned(), guest_init::STEPS.to_owned(), 0o644),
        (
            guest_init::EXAMPLES_PATH.to_owned(),
            guest_init::EXAMPLES_SCRIPT.to_owned(),
            0o755,
        ),
        (
            guest_init::WEAK_CPU_PATH.to_owned(),
            guest_init::WEAK_CPU_SCRIPT.to_owned(),
            0o755,
        ),
    ]);
    if let Some(dpdk) = dpdk {
        generated.extend([
            (
                dpdk::GUEST_SCRIPT.to_owned(),
                dpdk::SCRIPT.to_owned(),
                0o755,
            ),
            (dpdk::PLUGINS_PATH.to_owned(), dpdk.plugins_list(), 0o644),
        ]);
    }
    for (path, text, mode) in generated {
        let path = path.as_str();
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
        module_count,
        written.content_bytes as f64 / f64::from(1 << 20),
        packed as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_binaries::{AF_ALG_PACKAGE, FALLBACK_PACKAGE, Package, VFIO_PACKAGE};

    #[test]
    fn bin_files_need_a_name_and_an_existing_file() {
        let exe = std::env::current_exe().unwrap();
        let spec = format!("fuzz-cipher={}", exe.display());
        let bin = parse_bin_file(&spec).unwrap();
        assert_eq!((bin.name.as_str(), bin.host_path), ("fuzz-cipher", exe));
        assert!(parse_bin_file("no-equals-sign").is_err());
        assert!(parse_bin_file("a/b=/bin/sh").is_err());
        assert!(parse_bin_file("=/bin/sh").is_err());
        assert!(parse_bin_file("x=/no/such/file").is_err());
    }

    fn workspace(packages: &[&str]) -> Workspace {
        Workspace {
            workspace_root: "/r".into(),
            target_directory: "/r/target".into(),
            packages: packages
                .iter()
                .map(|name| Package {
                    name: (*name).into(),
                    manifest_path: format!("/r/{name}/Cargo.toml").into(),
                    targets: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn all_runs_in_order() {
        assert_eq!(
            RunSelection::All.runs(),
            [
                RunKind::Plain,
                RunKind::Virtio,
                RunKind::Vfio,
                RunKind::Weak
            ]
        );
        assert_eq!(RunSelection::Weak.runs(), [RunKind::Weak]);
        assert_eq!(RunSelection::Vfio.runs(), [RunKind::Vfio]);
    }

    #[test]
    fn the_vfio_run_gets_the_vfio_package_by_default_and_given_ones_go_everywhere() {
        let all = RunSelection::All.runs();
        let with_vfio = workspace(&[FALLBACK_PACKAGE, AF_ALG_PACKAGE, VFIO_PACKAGE]);
        assert_eq!(
            test_plan(&with_vfio, &[], all),
            [
                (
                    AF_ALG_PACKAGE.to_owned(),
                    vec![RunKind::Plain, RunKind::Virtio]
                ),
                (VFIO_PACKAGE.to_owned(), vec![RunKind::Vfio]),
            ]
        );
        // Only what the selected runs need is built.
        assert_eq!(
            test_plan(&with_vfio, &[], &[RunKind::Plain]),
            [(AF_ALG_PACKAGE.to_owned(), vec![RunKind::Plain])]
        );
        // Without the VFIO package the vfio run runs the others' defaults;
        // the weak run none (its steps are its checks).
        let without = workspace(&[FALLBACK_PACKAGE]);
        assert_eq!(
            test_plan(&without, &[], all),
            [(
                FALLBACK_PACKAGE.to_owned(),
                vec![RunKind::Plain, RunKind::Virtio, RunKind::Vfio]
            )]
        );
        let given = [FALLBACK_PACKAGE.to_owned()];
        assert_eq!(
            test_plan(&with_vfio, &given, &[RunKind::Vfio]),
            [(FALLBACK_PACKAGE.to_owned(), vec![RunKind::Vfio])]
        );
    }

    #[test]
    fn a_test_runs_in_the_runs_of_every_spec_that_built_it() {
        let plan = vec![
            ("a".to_owned(), vec![RunKind::Virtio, RunKind::Plain]),
            ("b".to_owned(), vec![RunKind::Vfio]),
        ];
        let test = |specs: &[usize]| TestBinary {
            binary: GuestBinary {
                name: "t".into(),
                host_path: "/t".into(),
            },
            specs: specs.iter().copied().collect(),
        };
        assert_eq!(
            runs_of_tests(&plan, &[test(&[0]), test(&[1]), test(&[1, 0])]),
            [
                vec![RunKind::Plain, RunKind::Virtio],
                vec![RunKind::Vfio],
                vec![RunKind::Plain, RunKind::Virtio, RunKind::Vfio],
            ]
        );
    }
}
