//! What the guest runs: `/init` and the files it reads.
//!
//! `/init` is the busybox script in `xtask/guest/init.sh`; it reads
//!
//! * `/etc/vmtest/modules`: module paths in insmod order, one a line, which
//!   every run loads; then `/etc/vmtest/modules-<run>` if the run has one
//!   (the vfio run's VFIO modules);
//! * `/etc/vmtest/tests`: the test binaries (in `/tests`) and the runs that
//!   run them, `<runs> <name>` a line;
//! * `/etc/vmtest/test-args`: extra libtest arguments for every test binary
//!   (e.g. `--skip` and a name), one a line;
//! * `/etc/vmtest/steps`: commands run after the tests (by default
//!   `offload probe` and `offload bench` in the virtio run), from
//!   `xtask/guest/steps`, which can be edited without touching Rust.
//!
//! In both `tests` and `steps`, `<runs>` is `all` or a comma-separated list
//! of run names. The markers `/init` prints (`VMTEST-BEGIN` ...) are read
//! back by [`crate::guest_log`].

use crate::qemu::RunKind;

/// The guest's `/init`.
pub const INIT_SCRIPT: &str = include_str!("../guest/init.sh");
/// The commands run after the test binaries.
pub const STEPS: &str = include_str!("../guest/steps");
/// The example servers under their load generators (a step of the vfio
/// run), at [`EXAMPLES_PATH`].
pub const EXAMPLES_SCRIPT: &str = include_str!("../guest/example-servers");
/// Guest path of [`EXAMPLES_SCRIPT`].
pub const EXAMPLES_PATH: &str = "/bin/example-servers";
/// The weak run's check of its CPU (a step of the weak run), at
/// [`WEAK_CPU_PATH`].
pub const WEAK_CPU_SCRIPT: &str = include_str!("../guest/weak-cpu");
/// Guest path of [`WEAK_CPU_SCRIPT`].
pub const WEAK_CPU_PATH: &str = "/bin/weak-cpu";

/// Guest path of the insmod order.
pub const MODULES_PATH: &str = "/etc/vmtest/modules";
/// Guest path of the test binaries' list.
pub const TESTS_PATH: &str = "/etc/vmtest/tests";
/// Guest path of the extra libtest arguments.
pub const TEST_ARGS_PATH: &str = "/etc/vmtest/test-args";
/// Guest path of the steps.
pub const STEPS_PATH: &str = "/etc/vmtest/steps";
/// Guest folder of the test binaries.
pub const TESTS_DIR: &str = "/tests";
/// Guest folder of busybox and the extra binaries.
pub const BIN_DIR: &str = "/bin";

/// The insmod order file: absolute guest paths under `modules_dir`.
pub fn modules_list(modules_dir: &str, order: &[String]) -> String {
    order
        .iter()
        .map(|m| format!("{modules_dir}/{m}\n"))
        .collect()
}

/// Guest path of the modules `run` loads after [`MODULES_PATH`].
pub fn run_modules_path(run: RunKind) -> String {
    format!("{MODULES_PATH}-{}", run.name())
}

/// The tests file: `<runs> <name>` a line, runs comma-separated.
pub fn tests_list<'a>(tests: impl IntoIterator<Item = (&'a str, &'a [RunKind])>) -> String {
    tests
        .into_iter()
        .map(|(name, runs)| {
            let runs: Vec<&str> = runs.iter().map(|r| r.name()).collect();
            format!("{} {name}\n", runs.join(","))
        })
        .collect()
}

/// The test-args file: `--skip NAME` for each name to skip.
pub fn test_args(skip: &[String]) -> String {
    skip.iter()
        .map(|name| format!("--skip\n{name}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_script_starts_with_busybox_and_powers_off() {
        assert!(INIT_SCRIPT.starts_with("#!/bin/busybox sh\n"));
        for needed in [
            "VMTEST-BOOTED",
            "VMTEST-BEGIN",
            "VMTEST-END",
            "VMTEST-DONE",
            "VMTEST-VFIO",
            "VMTEST_VFIO_DEVICES",
            "VMTEST_VIRTIO_DEVICES",
            "poweroff -f",
        ] {
            assert!(INIT_SCRIPT.contains(needed), "{needed}");
        }
        for path in [MODULES_PATH, TESTS_PATH, TEST_ARGS_PATH, STEPS_PATH] {
            assert!(INIT_SCRIPT.contains(path), "init.sh reads {path}");
        }
        let run_modules = run_modules_path(RunKind::Vfio).replace("vfio", "$VMTEST_RUN");
        assert!(
            INIT_SCRIPT.contains(&run_modules),
            "init.sh reads {run_modules}"
        );
    }

    #[test]
    fn every_step_names_its_runs_and_an_absolute_program() {
        let steps: Vec<_> = STEPS
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .collect();
        assert!(!steps.is_empty());
        for step in steps {
            let words: Vec<_> = step.split_whitespace().collect();
            assert!(words.len() >= 3, "{step}");
            assert!(
                words[0]
                    .split(',')
                    .all(|r| r == "all" || RunKind::ALL.iter().any(|k| k.name() == r)),
                "{step}"
            );
            assert!(words[2].starts_with('/'), "{step}");
        }
    }

    #[test]
    fn generated_files_have_one_item_a_line() {
        let modules = modules_list(
            "/lib/modules/6.1.0-57-amd64",
            &["kernel/crypto/af_alg.ko".into()],
        );
        assert_eq!(
            modules,
            "/lib/modules/6.1.0-57-amd64/kernel/crypto/af_alg.ko\n"
        );
        assert_eq!(test_args(&["slow one".into()]), "--skip\nslow one\n");
        assert_eq!(
            tests_list([
                ("differential", &[RunKind::Plain, RunKind::Virtio][..]),
                ("vfio_device", &[RunKind::Vfio][..]),
            ]),
            "plain,virtio differential\nvfio vfio_device\n"
        );
        assert_eq!(run_modules_path(RunKind::Vfio), "/etc/vmtest/modules-vfio");
        assert_eq!(test_args(&[]), "");
    }
}
