//! Judging a guest run from its serial console.
//!
//! `/init` frames everything with `VMTEST-` markers (see
//! `xtask/guest/init.sh`). A run passes only if the guest printed
//! `VMTEST-BOOTED` and `VMTEST-DONE`, every `VMTEST-BEGIN` has its
//! `VMTEST-END`, every exit status is 0, the kernel did not panic, QEMU was
//! not killed for taking too long, in the virtio run a virtio-crypto device
//! was bound to `virtio_crypto`, and in the vfio run at least one was bound
//! to `vfio-pci` and none failed to, and the one without
//! VIRTIO_F_ACCESS_PLATFORM (QEMU's `crypto2`) was bound to `virtio_crypto`
//! and none such failed to. Markers are looked for anywhere in a
//! line, since kernel messages can share a console line with the script's
//! output. The harness adds its own failures (e.g. a failed QMP request)
//! with [`LogParser::fail`].

use std::time::Duration;

use crate::qemu::RunKind;

/// The text the kernel prints when it panics.
const PANIC: &str = "Kernel panic - not syncing";

/// What the kernel's RCU stall detector prints when a CPU's timers stopped
/// firing ("rcu_preempt kthread timer wakeup didn't happen for 5251
/// jiffies! … Possible timer handling issue on cpu=1"). Seen once, under
/// TCG with the host hog on (a CI vfio run on e06fd48): vCPU 1 idled and
/// no timer interrupt reached it again for the ~480 s the run had left,
/// so a test waiting on a wake-up there hung to the run's timeout; none of
/// the eight other vfio-run logs on that machine printed it. A guest whose
/// clock stopped tests nothing more: [`crate::qemu`] stops it at once and
/// repeats the run once.
const TIMERS_STOPPED: [&str; 2] = [
    "timer wakeup didn't happen",
    "Possible timer handling issue",
];

/// Whether `text` holds the kernel's own [`TIMERS_STOPPED`] message: after
/// a printk timestamp and `rcu: ` (`[   57.267820] rcu: …`), so that a test
/// or QEMU (whose lines come as `qemu: …`) quoting the words does not stop
/// a run. The kernel's line may follow a test's output on the same line.
fn says_timers_stopped(text: &str) -> bool {
    text.match_indices("] rcu: ").any(|(at, tag)| {
        let rest = &text[at + tag.len()..];
        let stamp = text[..at].rsplit_once('[').map(|(_, s)| s.trim_start());
        let printk = stamp.is_some_and(|s| {
            s.split_once('.').is_some_and(|(secs, frac)| {
                !secs.is_empty()
                    && !frac.is_empty()
                    && secs.bytes().all(|b| b.is_ascii_digit())
                    && frac.bytes().all(|b| b.is_ascii_digit())
            })
        });
        printk && TIMERS_STOPPED.iter().any(|t| rest.contains(t))
    })
}

/// One test binary or step, as the log tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryResult {
    /// Its name in the guest.
    pub name: String,
    /// Its exit status, or `None` if no `VMTEST-END` (or no readable one) came.
    pub rc: Option<i32>,
    /// Host seconds between its BEGIN and END (or the end of the log).
    pub seconds: f64,
}

/// How the QEMU process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// QEMU exited by itself (guest poweroff, or a panic with `-no-reboot`).
    Exited,
    /// QEMU was killed after this long.
    TimedOut(Duration),
    /// QEMU was killed this long after it started, once the guest kernel
    /// said its timers had stopped ([`LogParser::timers_stopped`]).
    TimersStopped(Duration),
}

/// The verdict on one run.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// Host time from QEMU's start to `VMTEST-INIT` (the kernel booted).
    pub init_at: Option<Duration>,
    /// ... to `VMTEST-BOOTED` (modules loaded).
    pub booted_at: Option<Duration>,
    /// ... to `VMTEST-DONE`.
    pub done_at: Option<Duration>,
    /// Every framed binary and step, in order.
    pub binaries: Vec<BinaryResult>,
    /// Why the run failed; empty if it passed.
    pub failures: Vec<String>,
}

impl RunReport {
    /// True if nothing failed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Reads a console log line by line, as it arrives.
#[derive(Debug)]
pub struct LogParser {
    run: RunKind,
    report: RunReport,
    open: Option<(String, Duration)>,
    /// `VMTEST-VIRTIO-CRYPTO <virtioN> [<bdf>]`: devices bound to virtio_crypto.
    virtio_bound: Vec<String>,
    /// `VMTEST-VIRTIO-CRYPTO none <bdf> <why>`: devices that are not.
    virtio_failed: Vec<String>,
    /// `VMTEST-VFIO <bdf> group=<n>`: devices bound to vfio-pci.
    vfio_bound: Vec<String>,
    /// `VMTEST-VFIO <bdf> failed ...`: devices that could not be bound.
    vfio_failed: Vec<String>,
    panic: Option<String>,
    /// The first line that said the guest's timers stopped.
    timers_stopped: Option<String>,
    last_at: Duration,
}

impl LogParser {
    /// A parser for one run, which says what devices it must have bound.
    pub fn new(run: RunKind) -> Self {
        Self {
            run,
            report: RunReport::default(),
            open: None,
            virtio_bound: Vec::new(),
            virtio_failed: Vec::new(),
            vfio_bound: Vec::new(),
            vfio_failed: Vec::new(),
            panic: None,
            timers_stopped: None,
            last_at: Duration::ZERO,
        }
    }

    /// Records a failure the harness found outside the guest's markers.
    pub fn fail(&mut self, failure: String) {
        self.report.failures.push(failure);
    }

    /// Takes one console line, seen `at` after QEMU started.
    pub fn line(&mut self, at: Duration, text: &str) {
        self.last_at = at;
        if self.panic.is_none() && text.contains(PANIC) {
            self.panic = Some(text.trim().to_owned());
        }
        if self.timers_stopped.is_none() && says_timers_stopped(text) {
            self.timers_stopped = Some(text.trim().to_owned());
        }
        let Some(start) = text.find("VMTEST-") else {
            return;
        };
        let mut words = text[start..].split_whitespace();
        let marker = words.next().unwrap_or_default();
        match marker {
            "VMTEST-INIT" => {
                self.report.init_at.get_or_insert(at);
            }
            "VMTEST-BOOTED" => {
                self.report.booted_at.get_or_insert(at);
            }
            "VMTEST-DONE" => {
                self.report.done_at.get_or_insert(at);
            }
            // The virtio run: `<virtioN>` or `none`; the vfio run:
            // `<virtioN> <bdf>` or `none <bdf> <why>`.
            "VMTEST-VIRTIO-CRYPTO" => match (words.next(), words.next()) {
                (None, _) | (Some("none"), None) => {}
                (Some("none"), Some(bdf)) => {
                    let why: Vec<&str> = words.collect();
                    self.virtio_failed.push(if why.is_empty() {
                        bdf.to_owned()
                    } else {
                        format!("{bdf} ({})", why.join(" "))
                    });
                }
                (Some(device), bdf) => self.virtio_bound.push(bdf.unwrap_or(device).to_owned()),
            },
            // `<bdf> group=<n>`, `<bdf> failed <why>`, or `none`.
            "VMTEST-VFIO" => match (words.next(), words.next()) {
                (Some("none") | None, _) => {}
                (Some(bdf), Some(group)) if group.starts_with("group=") => {
                    self.vfio_bound.push(bdf.to_owned());
                }
                (Some(bdf), why) => {
                    let why: Vec<&str> = why
                        .filter(|&w| w != "failed")
                        .into_iter()
                        .chain(words)
                        .collect();
                    self.vfio_failed.push(if why.is_empty() {
                        bdf.to_owned()
                    } else {
                        format!("{bdf} ({})", why.join(" "))
                    });
                }
            },
            "VMTEST-BEGIN" => {
                self.close_unended(at);
                self.open = Some((words.next().unwrap_or_default().to_owned(), at));
            }
            "VMTEST-END" => {
                let name = words.next().unwrap_or_default();
                let rc = words
                    .next()
                    .and_then(|w| w.strip_prefix("rc="))
                    .and_then(|rc| rc.parse().ok());
                match self.open.take() {
                    Some((open, started)) if open == name => {
                        self.report.binaries.push(BinaryResult {
                            name: open,
                            rc,
                            seconds: at.saturating_sub(started).as_secs_f64(),
                        })
                    }
                    other => {
                        self.open = other;
                        self.report
                            .failures
                            .push(format!("VMTEST-END {name} without its VMTEST-BEGIN"));
                    }
                }
            }
            _ => {}
        }
    }

    /// The kernel's line saying the guest's timers stopped, if one came:
    /// the guest will not finish what waits on them.
    pub fn timers_stopped(&self) -> Option<&str> {
        self.timers_stopped.as_deref()
    }

    /// A BEGIN whose END never came is recorded without an exit status.
    fn close_unended(&mut self, at: Duration) {
        if let Some((name, started)) = self.open.take() {
            self.report.binaries.push(BinaryResult {
                name,
                rc: None,
                seconds: at.saturating_sub(started).as_secs_f64(),
            });
        }
    }

    /// The verdict, once QEMU has ended `end` after it started.
    pub fn finish(mut self, ending: Ending, end: Duration) -> RunReport {
        self.close_unended(end.max(self.last_at));
        let mut failures = Vec::new();
        match ending {
            Ending::Exited => {}
            Ending::TimedOut(after) => failures.push(format!(
                "timed out: QEMU killed after {} s",
                after.as_secs()
            )),
            Ending::TimersStopped(after) => failures.push(format!(
                "the guest's timers stopped: QEMU killed after {} s ({})",
                after.as_secs(),
                self.timers_stopped.as_deref().unwrap_or_default()
            )),
        }
        if let Some(panic) = &self.panic {
            failures.push(format!("kernel panic: {panic}"));
        }
        if self.report.booted_at.is_none() {
            failures.push("the guest never printed VMTEST-BOOTED".into());
        }
        if self.run == RunKind::Virtio
            && self.report.booted_at.is_some()
            && self.virtio_bound.is_empty()
        {
            failures.push("no virtio-crypto device was bound to virtio_crypto".into());
        }
        if self.run.has_vfio_devices() && self.report.booted_at.is_some() {
            if self.vfio_bound.is_empty() {
                failures.push("no virtio-crypto device was bound to vfio-pci".into());
            }
            for device in &self.vfio_failed {
                failures.push(format!(
                    "virtio-crypto device {device} was not bound to vfio-pci"
                ));
            }
            if self.virtio_bound.is_empty() {
                failures.push(
                    "no virtio-crypto device without ACCESS_PLATFORM was bound to virtio_crypto"
                        .into(),
                );
            }
            for device in &self.virtio_failed {
                failures.push(format!(
                    "virtio-crypto device {device} was not bound to virtio_crypto"
                ));
            }
        }
        for binary in &self.report.binaries {
            match binary.rc {
                Some(0) => {}
                Some(rc) => failures.push(format!("{}: exit status {rc}", binary.name)),
                None => failures.push(format!(
                    "{}: no VMTEST-END with an exit status (it crashed or hung the guest)",
                    binary.name
                )),
            }
        }
        failures.append(&mut self.report.failures);
        if self.report.done_at.is_none() {
            failures.push("the guest never printed VMTEST-DONE".into());
        }
        self.report.failures = failures;
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `lines` one second apart and finishes with `ending`.
    fn judge(run: RunKind, lines: &[&str], ending: Ending) -> RunReport {
        let mut parser = LogParser::new(run);
        for (second, line) in (1u64..).zip(lines) {
            parser.line(Duration::from_secs(second), line);
        }
        parser.finish(ending, Duration::from_secs(lines.len() as u64 + 1))
    }

    const PASSING: &[&str] = &[
        "SeaBIOS (version 1.16.2-debian-1.16.2-1)",
        "VMTEST-INIT run=plain kernel=6.1.0-57-amd64 uptime=1.90",
        "VMTEST-BOOTED run=plain modules=27 uptime=2.40",
        "VMTEST-BEGIN differential",
        "running 17 tests",
        "test result: ok. 17 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        "VMTEST-END differential rc=0",
        "VMTEST-BEGIN no_alloc",
        "VMTEST-END no_alloc rc=0",
        "VMTEST-DONE run=plain uptime=9.10",
    ];

    #[test]
    fn a_complete_run_passes_with_timings() {
        let report = judge(RunKind::Plain, PASSING, Ending::Exited);
        assert!(report.passed(), "{:?}", report.failures);
        assert_eq!(report.init_at, Some(Duration::from_secs(2)));
        assert_eq!(report.booted_at, Some(Duration::from_secs(3)));
        assert_eq!(report.done_at, Some(Duration::from_secs(10)));
        assert_eq!(
            report.binaries,
            [
                BinaryResult {
                    name: "differential".into(),
                    rc: Some(0),
                    seconds: 3.0
                },
                BinaryResult {
                    name: "no_alloc".into(),
                    rc: Some(0),
                    seconds: 1.0
                },
            ]
        );
    }

    #[test]
    fn a_failing_exit_status_fails_the_run() {
        let mut lines = PASSING.to_vec();
        lines[6] = "VMTEST-END differential rc=101";
        let report = judge(RunKind::Plain, &lines, Ending::Exited);
        assert_eq!(report.failures, ["differential: exit status 101"]);
        assert_eq!(report.binaries[0].rc, Some(101));
    }

    #[test]
    fn a_missing_end_fails_the_run() {
        let mut lines = PASSING.to_vec();
        lines.remove(6);
        let report = judge(RunKind::Plain, &lines, Ending::Exited);
        // It ran from its BEGIN until the next BEGIN.
        assert_eq!(
            report.binaries[0],
            BinaryResult {
                name: "differential".into(),
                rc: None,
                seconds: 3.0
            }
        );
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(report.failures[0].starts_with("differential: no VMTEST-END"));
    }

    #[test]
    fn a_missing_done_fails_the_run() {
        let report = judge(
            RunKind::Plain,
            &PASSING[..PASSING.len() - 1],
            Ending::Exited,
        );
        assert_eq!(report.failures, ["the guest never printed VMTEST-DONE"]);
    }

    #[test]
    fn a_kernel_panic_fails_the_run() {
        let lines = [
            "VMTEST-INIT run=plain",
            "VMTEST-BOOTED run=plain",
            "VMTEST-BEGIN differential",
            "[    9.1] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b",
        ];
        let report = judge(RunKind::Plain, &lines, Ending::Exited);
        // It ran from its BEGIN until QEMU ended.
        assert_eq!(report.binaries[0].seconds, 2.0);
        assert_eq!(
            report.failures,
            [
                "kernel panic: [    9.1] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b",
                "differential: no VMTEST-END with an exit status (it crashed or hung the guest)",
                "the guest never printed VMTEST-DONE",
            ]
        );
    }

    #[test]
    fn a_guest_whose_timers_stopped_fails_and_says_why() {
        let line = "[   57.267820] rcu: \tPossible timer handling issue on cpu=1 timer-softirq=488";
        let mut parser = LogParser::new(RunKind::Plain);
        for (i, text) in PASSING[..4].iter().chain([&line]).enumerate() {
            assert!(parser.timers_stopped().is_none(), "{i}");
            parser.line(Duration::from_secs(i as u64), text);
        }
        assert_eq!(parser.timers_stopped(), Some(line.trim()));
        let report = parser.finish(
            Ending::TimersStopped(Duration::from_secs(60)),
            Duration::from_secs(60),
        );
        assert_eq!(
            report.failures[0],
            format!(
                "the guest's timers stopped: QEMU killed after 60 s ({})",
                line.trim()
            )
        );
    }

    #[test]
    fn only_the_kernels_own_line_says_the_timers_stopped() {
        for (text, kernel) in [
            (
                "[   57.267820] rcu: \tPossible timer handling issue on cpu=1 timer-softirq=488",
                true,
            ),
            (
                "[    5.1] rcu: rcu_preempt kthread timer wakeup didn't happen for 5251 jiffies!",
                true,
            ),
            // After a test's output on the same console line.
            (
                "test t ... [  120.258602] rcu: \tPossible timer handling issue on cpu=1",
                true,
            ),
            // Other RCU lines.
            (
                "[   57.235874] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
                false,
            ),
            // Quoted by QEMU, by a test, or without a printk timestamp.
            ("qemu: Possible timer handling issue", false),
            (
                "assertion failed: log has Possible timer handling issue",
                false,
            ),
            ("rcu: \tPossible timer handling issue on cpu=1", false),
            ("[x.1] rcu: Possible timer handling issue", false),
            ("[57.] rcu: Possible timer handling issue", false),
            ("] rcu: Possible timer handling issue", false),
        ] {
            assert_eq!(says_timers_stopped(text), kernel, "{text}");
        }
    }

    #[test]
    fn a_timeout_fails_the_run_even_after_done() {
        let report = judge(
            RunKind::Plain,
            PASSING,
            Ending::TimedOut(Duration::from_secs(300)),
        );
        assert_eq!(report.failures, ["timed out: QEMU killed after 300 s"]);
    }

    #[test]
    fn a_guest_that_never_boots_fails() {
        let report = judge(
            RunKind::Plain,
            &["SeaBIOS", "Booting from ROM.."],
            Ending::Exited,
        );
        assert_eq!(
            report.failures,
            [
                "the guest never printed VMTEST-BOOTED",
                "the guest never printed VMTEST-DONE"
            ]
        );
    }

    #[test]
    fn markers_are_found_after_kernel_text_on_the_same_line() {
        let mut lines = PASSING.to_vec();
        lines[6] = "[    5.2] virtio_crypto: some warningVMTEST-END differential rc=0";
        assert!(judge(RunKind::Plain, &lines, Ending::Exited).passed());
    }

    #[test]
    fn the_virtio_run_needs_a_bound_device() {
        let mut lines = PASSING.to_vec();
        lines.insert(3, "VMTEST-VIRTIO-CRYPTO none");
        let report = judge(RunKind::Virtio, &lines, Ending::Exited);
        assert_eq!(
            report.failures,
            ["no virtio-crypto device was bound to virtio_crypto"]
        );
        lines[3] = "VMTEST-VIRTIO-CRYPTO virtio0";
        assert!(judge(RunKind::Virtio, &lines, Ending::Exited).passed());
    }

    #[test]
    fn the_vfio_run_needs_a_device_bound_to_vfio_pci() {
        let with = |vfio_lines: &[&'static str]| {
            let mut lines = PASSING.to_vec();
            for (n, line) in vfio_lines.iter().enumerate() {
                lines.insert(3 + n, line);
            }
            judge(RunKind::Vfio, &lines, Ending::Exited).failures
        };
        const KERNEL: &str = "VMTEST-VIRTIO-CRYPTO virtio2 0000:03:00.0";
        let bound = [
            "VMTEST-VFIO 0000:01:00.0 group=2",
            "VMTEST-VFIO 0000:02:00.0 group=3",
            KERNEL,
        ];
        assert_eq!(with(&bound), Vec::<String>::new());
        assert_eq!(
            with(&["VMTEST-VFIO none", KERNEL]),
            ["no virtio-crypto device was bound to vfio-pci"]
        );
        // No marker at all (e.g. an /init without the vfio section) fails too.
        assert_eq!(
            with(&[]),
            [
                "no virtio-crypto device was bound to vfio-pci",
                "no virtio-crypto device without ACCESS_PLATFORM was bound to virtio_crypto"
            ]
        );
        // One bound and one not: the run fails, naming the one.
        assert_eq!(
            with(&[
                bound[0],
                "VMTEST-VFIO 0000:02:00.0 failed driver=virtio-pci group=3",
                KERNEL,
            ]),
            [
                "virtio-crypto device 0000:02:00.0 (driver=virtio-pci group=3) was not bound to vfio-pci"
            ]
        );
        // The device for the kernel must be bound to virtio_crypto.
        assert_eq!(
            with(&[
                bound[0],
                bound[1],
                "VMTEST-VIRTIO-CRYPTO none 0000:03:00.0 driver=none"
            ]),
            [
                "no virtio-crypto device without ACCESS_PLATFORM was bound to virtio_crypto",
                "virtio-crypto device 0000:03:00.0 (driver=none) was not bound to virtio_crypto"
            ]
        );
        assert_eq!(
            with(&[
                "VMTEST-VFIO 0000:01:00.0 failed",
                "VMTEST-VFIO 0000:02:00.0",
                KERNEL,
            ]),
            [
                "no virtio-crypto device was bound to vfio-pci",
                "virtio-crypto device 0000:01:00.0 was not bound to vfio-pci",
                "virtio-crypto device 0000:02:00.0 was not bound to vfio-pci",
            ]
        );
        // After kernel text on the same line.
        assert_eq!(
            with(&[
                "[    3.1] vfio-pci 0000:01:00.0: enablingVMTEST-VFIO 0000:01:00.0 group=2",
                KERNEL
            ]),
            Vec::<String>::new()
        );
        // Other runs do not look for vfio-pci, nor the vfio run for virtio_crypto.
        assert!(judge(RunKind::Plain, PASSING, Ending::Exited).passed());
        assert!(
            judge(RunKind::Virtio, PASSING, Ending::Exited).failures
                == ["no virtio-crypto device was bound to virtio_crypto"]
        );
        // A guest that never booted is not also blamed for the device.
        let report = judge(RunKind::Vfio, &["SeaBIOS"], Ending::Exited);
        assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
    }

    #[test]
    fn harness_failures_are_kept() {
        let mut parser = LogParser::new(RunKind::Plain);
        for (second, line) in (1u64..).zip(PASSING) {
            parser.line(Duration::from_secs(second), line);
        }
        parser.fail("QMP device_del failed: Device 'x' not found".into());
        let report = parser.finish(Ending::Exited, Duration::from_secs(20));
        assert_eq!(
            report.failures,
            ["QMP device_del failed: Device 'x' not found"]
        );
    }

    #[test]
    fn an_end_without_begin_fails() {
        let mut lines = PASSING.to_vec();
        lines.insert(9, "VMTEST-END ghost rc=0");
        let report = judge(RunKind::Plain, &lines, Ending::Exited);
        assert_eq!(
            report.failures,
            ["VMTEST-END ghost without its VMTEST-BEGIN"]
        );
    }
}
