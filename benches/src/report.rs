//! Reads criterion's saved estimates and prints the ratio table: for each
//! algorithm and size, the fallback's throughput over the best peer's.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// One measurement: group, function, size → median ns per iteration.
#[derive(Debug, Clone)]
pub struct Row {
    /// The criterion group, e.g. `ctr-128`.
    pub group: String,
    /// The implementation, e.g. `fallback` or `aws-lc-rs`.
    pub function: String,
    /// Bytes per iteration.
    pub size: u64,
    /// Median nanoseconds per iteration.
    pub ns: f64,
}

impl Row {
    /// Throughput in GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.size as f64 / self.ns
    }
}

/// Loads every `<group>/<function>/<size>/new` estimate under `dir`
/// (criterion's `target/criterion`); with `best_of_two`, also the run
/// before (`base`), keeping the faster of the two for each benchmark.
///
/// Best of two runs is for shared machines, where a neighbour slows one
/// benchmark of a sequential run by 10–30% and not the next: interference
/// only ever slows, so the faster run is the closer to the code's speed.
pub fn load(dir: &Path, best_of_two: bool) -> std::io::Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    for bench in walk(dir, best_of_two)? {
        let Ok(meta) = fs::read_to_string(bench.join("benchmark.json")) else {
            continue;
        };
        let Ok(est) = fs::read_to_string(bench.join("estimates.json")) else {
            continue;
        };
        let (Ok(meta), Ok(est)) = (
            serde_json::from_str::<serde_json::Value>(&meta),
            serde_json::from_str::<serde_json::Value>(&est),
        ) else {
            continue;
        };
        let (Some(group), Some(function), Some(size), Some(ns)) = (
            meta["group_id"].as_str(),
            meta["function_id"].as_str(),
            meta["value_str"].as_str().and_then(|v| v.parse().ok()),
            est["median"]["point_estimate"].as_f64(),
        ) else {
            continue;
        };
        match rows
            .iter_mut()
            .find(|r| r.group == group && r.function == function && r.size == size)
        {
            Some(r) => r.ns = r.ns.min(ns),
            None => rows.push(Row {
                group: group.to_owned(),
                function: function.to_owned(),
                size,
                ns,
            }),
        }
    }
    Ok(rows)
}

fn walk(dir: &Path, base_too: bool) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                if p.file_name()
                    .is_some_and(|n| n == "new" || (base_too && n == "base"))
                {
                    out.push(p);
                } else {
                    stack.push(p);
                }
            }
        }
    }
    Ok(out)
}

fn human(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s.is_multiple_of(1 << 20) => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s.is_multiple_of(1 << 10) => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Rows that are measured for context but are not peers (they do not
/// compute the same function): the `aes` crate's plain ECB, the ceiling of
/// an XTS built on it.
pub const NOT_PEERS: &[&str] = &["aes-crate-ecb"];

/// The Markdown table: per group and size, the fallback's GB/s, the best
/// peer (name and GB/s), the ratio, and the ratio to each other peer.
pub fn table(rows: &[Row], ours: &str) -> String {
    let mut by: BTreeMap<(&str, u64), Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.group.starts_with("session-")) {
        by.entry((&r.group, r.size)).or_default().push(r);
    }
    let mut out = String::from(
        "| algorithm | size | ours GB/s | fastest peer | peer GB/s | ours / fastest | pure RustCrypto / fastest | other peers (ours / peer) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for ((group, size), rs) in by {
        let Some(me) = rs.iter().find(|r| r.function == ours) else {
            continue;
        };
        let not_peer = |r: &Row| NOT_PEERS.contains(&r.function.as_str());
        let mut peers: Vec<&&Row> = rs
            .iter()
            .filter(|r| !r.function.starts_with(ours) && !not_peer(r))
            .collect();
        peers.sort_by(|a, b| b.gbps().total_cmp(&a.gbps()));
        let Some(best) = peers.first() else { continue };
        let others: Vec<String> = peers[1..]
            .iter()
            .copied()
            .chain(rs.iter().filter(|r| not_peer(r)))
            .map(|p| format!("{} {:.2}", p.function, me.gbps() / p.gbps()))
            .collect();
        // The build without the aws-lc feature runs the forced-RustCrypto
        // code. CRC has no second implementation (the same code runs in both
        // builds); nor has XTS, except for lone units under 32 bytes, which
        // the pure build runs on the `aes` crate: not measured here, "n/a".
        let pure = match rs
            .iter()
            .find(|r| r.function == format!("{ours}-rustcrypto"))
        {
            Some(p) => format!("{:.2}", p.gbps() / best.gbps()),
            None if group.starts_with("xts") && size < 32 => "n/a".to_owned(),
            None => format!("{:.2}", me.gbps() / best.gbps()),
        };
        // (The ratio to three places: `benches/targets` judges medians of
        // it against 0.90 and 0.95, and at two a 0.895 would read 0.90.)
        out.push_str(&format!(
            "| {group} | {} | {:.2} | {} | {:.2} | **{:.3}** | {} | {} |\n",
            human(size),
            me.gbps(),
            best.function,
            best.gbps(),
            me.gbps() / best.gbps(),
            pure,
            others.join(", ")
        ));
    }
    out
}

/// The session-overhead table: per `session-*` group and size, the direct
/// fallback call and the session request, in ns, their difference, and the
/// session's throughput relative to the direct call.
pub fn session_table(rows: &[Row]) -> String {
    /// Direct and session ns per (group, size).
    type Pair = (Option<f64>, Option<f64>);
    let mut by: BTreeMap<(&str, u64), Pair> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.group.starts_with("session-")) {
        let e = by.entry((&r.group, r.size)).or_default();
        match r.function.as_str() {
            "direct" => e.0 = Some(r.ns),
            "session" => e.1 = Some(r.ns),
            _ => {}
        }
    }
    let mut out = String::from(
        "| request | size | direct ns | session ns | overhead ns | session / direct throughput |\n|---|---|---|---|---|---|\n",
    );
    for ((group, size), (d, s)) in by {
        let (Some(d), Some(s)) = (d, s) else { continue };
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:+.1} | **{:.3}** |\n",
            group.trim_start_matches("session-"),
            human(size),
            d,
            s,
            s - d,
            d / s
        ));
    }
    out
}
