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
/// (criterion's `target/criterion`).
pub fn load(dir: &Path) -> std::io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for bench in walk(dir)? {
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
        rows.push(Row {
            group: group.to_owned(),
            function: function.to_owned(),
            size,
            ns,
        });
    }
    Ok(rows)
}

fn walk(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "new") {
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
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// The Markdown table: per group and size, the fallback's GB/s, the best
/// peer (name and GB/s), the ratio, and the ratio to each other peer.
pub fn table(rows: &[Row], ours: &str) -> String {
    let mut by: BTreeMap<(&str, u64), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by.entry((&r.group, r.size)).or_default().push(r);
    }
    let mut out = String::from(
        "| algorithm | size | ours GB/s | fastest peer | peer GB/s | ours / fastest | other peers (ours / peer) |\n|---|---|---|---|---|---|---|\n",
    );
    for ((group, size), rs) in by {
        let Some(me) = rs.iter().find(|r| r.function == ours) else {
            continue;
        };
        let mut peers: Vec<&&Row> = rs
            .iter()
            .filter(|r| !r.function.starts_with(ours))
            .collect();
        peers.sort_by(|a, b| b.gbps().total_cmp(&a.gbps()));
        let Some(best) = peers.first() else { continue };
        let others: Vec<String> = peers[1..]
            .iter()
            .map(|p| format!("{} {:.2}", p.function, me.gbps() / p.gbps()))
            .collect();
        out.push_str(&format!(
            "| {group} | {} | {:.2} | {} | {:.2} | **{:.2}** | {} |\n",
            human(size),
            me.gbps(),
            best.function,
            best.gbps(),
            me.gbps() / best.gbps(),
            others.join(", ")
        ));
    }
    out
}
