//! The `offload` binary end to end: every subcommand runs, and what it
//! prints parses and holds together.

use std::process::Command;

mod common;

use common::offload;

#[test]
fn probe_lists_the_cpu_and_the_simulated_engines() {
    let (ok, out, err) = offload(&["probe", "--sim", "qce", "--sim", "mcrc64"]);
    assert!(ok, "{err}");
    for name in ["cpu", "sim:qce", "sim:mcrc64", "AF_ALG", "VFIO"] {
        assert!(out.contains(name), "{name} missing from:\n{out}");
    }
    // The CPU and, per mode, the implementation chosen and the timings it
    // was chosen by (every candidate of this build).
    assert!(out.contains("CPU: "), "{out}");
    for mode in crypto_offload::cpu_choice::Mode::ALL {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", mode.name())))
            .unwrap_or_else(|| panic!("no {mode:?} choice in:\n{out}"));
        assert!(line.contains("measured in "), "{line}");
        for imp in mode.candidates() {
            assert!(
                line.contains(&format!("{} ", imp.name())),
                "{imp:?} not timed: {line}"
            );
        }
    }
    assert!(out.contains("CRC-64/NVME"));
    // The simulator is `BackendKind::Other` to crypto-offload; probe still
    // calls the engines it added simulated.
    let qce = out.lines().find(|l| l.starts_with("sim:qce")).unwrap();
    assert!(qce.contains(" simulated "), "{qce}");
    // AF_ALG is either there (engines or none) or unavailable with a reason.
    let af_alg = out.lines().find(|l| l.starts_with("AF_ALG:")).unwrap();
    assert!(
        af_alg.starts_with("AF_ALG: hardware engines")
            || af_alg.starts_with("AF_ALG: available; no hardware engine")
            || (af_alg.starts_with("AF_ALG: unavailable: ") && af_alg.len() > 22),
        "{af_alg}"
    );
}

#[test]
fn a_driver_that_cannot_be_bound_is_an_error_that_says_why() {
    let (ok, _, err) = offload(&["probe", "--af-alg-driver", "no-such-driver"]);
    assert!(!ok);
    assert!(err.contains("--af-alg-driver"), "{err}");
}

#[test]
fn bench_json_has_every_backend_auto_and_the_oracle_per_size() {
    let (ok, out, err) = offload(&[
        "bench",
        "--sim",
        "qce",
        "--alg",
        "aes-256-xts",
        "--sizes",
        "16,4k,64k",
        "--time-ms",
        "20",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let r = &v[0];
    assert_eq!(r["alg"], "aes-256-xts");
    assert_eq!(r["sizes"].as_array().map(Vec::len), Some(3));
    let names: Vec<&str> = r["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cpu", "sim:qce"]);
    for i in 0..3 {
        let auto = r["auto"]["points"][i]["throughput"].as_f64().unwrap();
        let ratio = r["auto_over_oracle"][i].as_f64().unwrap();
        assert!(auto > 0.0 && ratio > 0.0);
        assert!(r["oracle"][i][0].is_string());
    }
}

#[test]
fn a_control_measures_a_pinned_backend_against_itself() {
    let (ok, out, err) = offload(&[
        "bench",
        "--sim",
        "qce",
        "--alg",
        "aes-256-xts",
        "--sizes",
        "4k,64k",
        "--time-ms",
        "20",
        "--control",
        "sim:qce",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let r = &v[0];
    // Auto's place went to a second session on the engine: Auto's
    // selector served none of the requests.
    for i in 0..2 {
        let mix: u64 = r["auto_mix"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(mix, 0, "{out}");
        // Against its own pinned row (the second backend), within what
        // any noise allows; against the CPU (first) it is the engine's
        // speed, far from 1 on this machine whichever wins.
        let itself = r["auto_over_each"][i][1].as_f64().unwrap();
        assert!(itself > 0.2 && itself < 5.0, "{out}");
    }
    let (ok, _, err) = offload(&["bench", "--sizes", "64", "--control", "sim:nope"]);
    assert!(!ok && !err.contains("panicked"), "{err}");
}

#[test]
fn bench_tables_and_an_svg_plot() {
    let dir = std::env::temp_dir().join(format!("offload-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("plot.svg");
    let (ok, out, err) = offload(&[
        "bench",
        "--alg",
        "crc-32/iscsi",
        "--sizes",
        "64,1k",
        "--time-ms",
        "10",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("CRC-32/ISCSI") && out.contains("auto/oracle"),
        "{out}"
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("CRC-32/ISCSI"));
    let (ok, _, err) = offload(&[
        "bench",
        "--sizes",
        "64",
        "--time-ms",
        "5",
        "--plot",
        "x.bmp",
    ]);
    assert!(!ok && err.contains(".svg or .png"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibrate_writes_a_profile_that_bench_and_explain_load() {
    let dir = std::env::temp_dir().join(format!("offload-cli-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("profile.toml");
    let (ok, _, err) = offload(&[
        "calibrate",
        "--sim",
        "mcrc64",
        "--out",
        profile.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("[[entry]]") && text.contains("sim:mcrc64"));
    let (ok, out, err) = offload(&[
        "explain",
        "--sim",
        "mcrc64",
        "--profile",
        profile.to_str().unwrap(),
        "--policy",
        "cpu-saving=1000",
        "--alg",
        "crc-64/nvme",
        "--size",
        "8388608,4k",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("sim:mcrc64") && out.contains("cpu-saving"),
        "{out}"
    );
    // One explanation a size, in the order given; sizes take k/m suffixes.
    let sizes: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("CRC-64/NVME"))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(sizes, ["8388608", "4096"], "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    for args in [
        &["bench", "--sim", "nope"][..],
        &["bench", "--alg", "rot13"],
        &["bench", "--policy", "fastest"],
        &["bench", "--sizes", "12q"],
        &["explain", "--alg", "aes-128-gcm", "--size", "x"],
        &["scenario", "nope"],
    ] {
        let (ok, _, err) = offload(args);
        assert!(!ok, "{args:?} should fail");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `OFFLOAD_LOG` turns on the library's `tracing` events: with
/// `crypto_offload=trace` every completion the model learns from is
/// logged with what it predicted and saw; unset, nothing is; a spec that
/// does not parse is reported and ignored.
#[test]
fn offload_log_shows_what_the_model_learns_from() {
    let bench = |log: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_offload"));
        c.args([
            "bench",
            "--sim",
            "qce",
            "--alg",
            "aes-256-xts",
            "--sizes",
            "64k",
            "--time-ms",
            "20",
        ]);
        c.env_remove("OFFLOAD_LOG");
        if let Some(l) = log {
            c.env("OFFLOAD_LOG", l);
        }
        let out = c.output().expect("the binary runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = bench(Some("crypto_offload=trace"));
    let line = err
        .lines()
        .find(|l| l.contains("observed") && l.contains("backend=\"sim:qce\""))
        .unwrap_or_else(|| panic!("no observation of the engine in:\n{err}"));
    for field in ["len=65536", "expected_ns=", "observed_ns=", "correction="] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    assert!(!bench(None).contains("observed"));
    assert!(bench(Some("crypto_offload=nonsense")).contains("OFFLOAD_LOG"));
}

/// `--cpu-candidates`: the CPU forced onto each of its GCM
/// implementations, measured beside the CPU as chosen here, each its own
/// row; Auto's oracle is the fastest of them all.
#[test]
fn cpu_candidates_are_measured_side_by_side() {
    let (ok, out, err) = offload(&[
        "bench",
        "--alg",
        "aes-128-gcm,aes-256-xts",
        "--sizes",
        "512,16k",
        "--time-ms",
        "20",
        "--cpu-candidates",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    use crypto_offload::cpu_choice::Mode;
    for (i, mode) in [Mode::Gcm, Mode::Xts].into_iter().enumerate() {
        let rows: Vec<&str> = v[i]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["backend"].as_str().unwrap())
            .collect();
        let mut want = vec!["cpu".to_owned()];
        if mode.candidates().len() > 1 {
            want.extend(
                mode.candidates()
                    .iter()
                    .map(|i| format!("cpu/{}", i.name())),
            );
        }
        assert_eq!(rows, want, "{mode:?}: {out}");
        for b in v[i]["backends"].as_array().unwrap() {
            for p in b["points"].as_array().unwrap() {
                assert!(p["throughput"].as_f64().unwrap() > 0.0, "{b}");
            }
        }
    }
    let (ok, out, _) = offload(&["bench", "--help"]);
    assert!(ok && out.contains("--cpu-candidates"));
}
