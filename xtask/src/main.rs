//! `cargo xtask`: developer tasks for the crypto-offload workspace.
//!
//! ```text
//! cargo xtask vm-test                    # all four guest runs, default packages
//! cargo xtask vm-test --run virtio -p crypto-offload-af-alg --keep
//! cargo xtask vm-test --run vfio -p crypto-offload-fallback
//! cargo xtask module-graph --check          # crypto-offload/src has no module cycle
//! ```
//!
//! `vm-test` builds the test binaries of some workspace packages, packs them
//! with busybox and the kernel's AF_ALG, crypto, virtio and VFIO modules into
//! an initramfs, boots Debian's kernel under QEMU without devices (`plain`),
//! with a virtio-crypto device (`virtio`) and with two virtio-crypto devices
//! behind an emulated IOMMU bound to vfio-pci and a third left to the kernel
//! (`vfio`), and with those devices and a CPU without AES-NI or PCLMULQDQ
//! (`weak`), runs the test binaries in the guest and judges each run from the
//! guest's serial console. The host needs `qemu-system-x86`, `busybox-static`
//! and `linux-image-amd64` (and, for the vfio run's DPDK step, `dpdk-dev`);
//! nothing is installed by the task itself.
//!
//! `module-graph` lists which top-level modules of a crate (default
//! `crypto-offload/src`) refer to which, leaves first; with `--check` it
//! fails naming the modules of each cycle.

#![forbid(unsafe_code)]

mod dpdk;
mod elf;
mod guest_binaries;
mod guest_init;
mod guest_log;
mod hog;
mod initramfs;
mod kernel;
mod module_graph;
mod modules;
mod qemu;
mod qmp;
mod shared_libs;
mod summary;
mod tools;
mod vm_test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line of `cargo xtask`.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "crypto-offload developer tasks"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

/// One developer task.
#[derive(Subcommand)]
enum Task {
    /// Run the workspace's test binaries in QEMU guests (Debian's kernel,
    /// AF_ALG modules; a `plain` run, a `virtio` run with virtio-crypto and
    /// a `vfio` run with two virtio-crypto devices bound to vfio-pci).
    VmTest(vm_test::VmTestArgs),
    /// List which top-level modules of a crate refer to which, leaves
    /// first; with `--check`, fail on a cycle among them.
    ModuleGraph(module_graph::ModuleGraphArgs),
}

/// How a task ended, when it did not fail to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Everything passed (every vm-test run; no module cycle).
    Pass,
    /// Something failed (vm-test's summary or module-graph's stderr says
    /// what).
    Fail,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::VmTest(args) => vm_test::run(&args),
        Task::ModuleGraph(args) => module_graph::run(&args),
    };
    match result {
        Ok(Verdict::Pass) => ExitCode::SUCCESS,
        Ok(Verdict::Fail) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
