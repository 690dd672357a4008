//! The table printed at the end of `vm-test`: per run, the boot times and
//! every binary's exit status and seconds, then why any run failed and
//! where the time went.

use std::fmt::Write as _;
use std::time::Duration;

use crate::qemu::{Boot, RunKind};

/// One row's timing in seconds, or `-`.
fn seconds(value: Option<Duration>) -> String {
    value.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64()))
}

/// The summary of finished runs, the phases before them and the total time.
pub fn render(runs: &[(RunKind, Boot)], phases: &[(&str, Duration)], total: Duration) -> String {
    let mut out = String::from("\nvm-test summary\n");
    let _ = writeln!(
        out,
        "{:<7} {:<5} {:<36} {:>5} {:>9}",
        "run", "accel", "binary", "rc", "seconds"
    );
    for (run, boot) in runs {
        let report = &boot.report;
        let row = |out: &mut String, what: &str, rc: &str, secs: String| {
            let _ = writeln!(
                out,
                "{:<7} {:<5} {:<36} {:>5} {:>9}",
                run.name(),
                boot.accel.name(),
                what,
                rc,
                secs
            );
        };
        row(
            &mut out,
            "(kernel boot, to /init)",
            "-",
            seconds(report.init_at),
        );
        let modules = report
            .booted_at
            .zip(report.init_at)
            .map(|(booted, init)| booted.saturating_sub(init));
        row(&mut out, "(module loading)", "-", seconds(modules));
        for binary in &report.binaries {
            let rc = binary.rc.map_or_else(|| "none".into(), |rc| rc.to_string());
            row(
                &mut out,
                &binary.name,
                &rc,
                format!("{:.2}", binary.seconds),
            );
        }
        let verdict = if report.passed() { "PASS" } else { "FAIL" };
        row(
            &mut out,
            &format!("(whole run: {verdict})"),
            "-",
            seconds(Some(boot.wall)),
        );
    }
    for (run, boot) in runs {
        for note in boot.kvm_note.iter().chain(&boot.crash_note) {
            let _ = writeln!(out, "note {}: {note}", run.name());
        }
        for failure in &boot.report.failures {
            let _ = writeln!(
                out,
                "FAIL {}: {failure} (log {})",
                run.name(),
                boot.log.display()
            );
        }
    }
    let timings: Vec<String> = phases
        .iter()
        .map(|(name, d)| format!("{name} {:.1} s", d.as_secs_f64()))
        .chain(
            runs.iter()
                .map(|(run, boot)| format!("{} run {:.1} s", run.name(), boot.wall.as_secs_f64())),
        )
        .chain(std::iter::once(format!(
            "total {:.1} s",
            total.as_secs_f64()
        )))
        .collect();
    let _ = writeln!(out, "time: {}", timings.join(", "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_log::{BinaryResult, RunReport};
    use crate::qemu::Accel;

    fn boot(binaries: Vec<BinaryResult>, failures: Vec<String>) -> Boot {
        Boot {
            accel: Accel::Tcg,
            report: RunReport {
                init_at: Some(Duration::from_millis(2400)),
                booted_at: Some(Duration::from_millis(3000)),
                done_at: Some(Duration::from_secs(9)),
                binaries,
                failures,
            },
            wall: Duration::from_secs(10),
            log: "/t/vm-test/plain.log".into(),
            kvm_note: Some("KVM did not reach /init".into()),
            crash_note: Some("QEMU crashed (signal 11)".into()),
        }
    }

    #[test]
    fn the_table_has_a_row_per_binary_and_names_failures() {
        let runs = [(
            RunKind::Plain,
            boot(
                vec![
                    BinaryResult {
                        name: "differential".into(),
                        rc: Some(0),
                        seconds: 4.5,
                    },
                    BinaryResult {
                        name: "no_alloc".into(),
                        rc: None,
                        seconds: 1.0,
                    },
                ],
                vec!["no_alloc: no VMTEST-END".into()],
            ),
        )];
        let text = render(
            &runs,
            &[("build", Duration::from_secs(12))],
            Duration::from_secs(25),
        );
        assert!(
            text.contains("plain   tcg   (kernel boot, to /init)"),
            "{text}"
        );
        assert!(
            text.contains("(module loading)                         -      0.60"),
            "{text}"
        );
        assert!(
            text.contains("differential                             0      4.50"),
            "{text}"
        );
        assert!(
            text.contains("no_alloc                              none      1.00"),
            "{text}"
        );
        assert!(text.contains("(whole run: FAIL)"), "{text}");
        assert!(
            text.contains("FAIL plain: no_alloc: no VMTEST-END (log /t/vm-test/plain.log)"),
            "{text}"
        );
        assert!(
            text.contains("note plain: KVM did not reach /init"),
            "{text}"
        );
        assert!(
            text.contains("note plain: QEMU crashed (signal 11)"),
            "{text}"
        );
        assert!(
            text.contains("time: build 12.0 s, plain run 10.0 s, total 25.0 s"),
            "{text}"
        );
    }
}
