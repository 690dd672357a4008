//! The programs that run in the guest, built by cargo on the host.
//!
//! Test binaries come from `cargo test --no-run --message-format=json`:
//! every `compiler-artifact` whose profile is a test profile and which has an
//! executable. By default from one build of the whole workspace — the build
//! the README's `cargo test --workspace` makes, with the same features, so
//! that after it (as in CI) nothing is compiled again — and for a spec that
//! build cannot serve (features it lacks, a `--package` given), from
//! `cargo test --no-run -p P`. Extra binaries (by default the release
//! `offload`) come from one `cargo build --release` of all of them (one set
//! of features, one build of what they share). The workspace's layout comes
//! from `cargo metadata --no-deps`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fmt};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::qemu::RunKind;

/// The package whose tests are run when it exists: the AF_ALG backend.
pub const AF_ALG_PACKAGE: &str = "crypto-offload-af-alg";
/// With the AF_ALG backend, this package's AF_ALG integration test runs
/// too (built with its `af-alg` feature).
pub const OFFLOAD_PACKAGE: &str = "crypto-offload";
/// The package whose tests are run otherwise.
pub const FALLBACK_PACKAGE: &str = "crypto-offload-fallback";
/// The package whose tests the vfio run runs when it exists: the userspace
/// VFIO virtio-crypto driver.
pub const VFIO_PACKAGE: &str = "crypto-offload-vfio";
/// The extra binary included by default: `offload` from `offload-cli`.
pub const DEFAULT_BINARY: &str = "offload-cli:offload";
/// The extra binaries included by default: `offload`, the AF_ALG
/// mechanism's overhead measurement, the VFIO measurements, and the
/// example servers with their load generators.
pub const DEFAULT_BINARIES: [&str; 9] = [
    DEFAULT_BINARY,
    "crypto-offload-benches:af-alg-overhead",
    "crypto-offload-benches:af-alg-vs-kcapi",
    "crypto-offload-benches:vfio-spread",
    "crypto-offload-benches:vfio-vs-dpdk",
    "crypto-offload-examples:block-server",
    "crypto-offload-examples:block-load",
    "crypto-offload-examples:record-server",
    "crypto-offload-examples:record-load",
];

/// What `cargo metadata --no-deps` says about the workspace.
#[derive(Debug, Deserialize)]
pub struct Workspace {
    /// The folder holding the workspace's Cargo.toml.
    pub workspace_root: PathBuf,
    /// Cargo's target folder.
    pub target_directory: PathBuf,
    /// The workspace's packages.
    pub packages: Vec<Package>,
}

/// One workspace package.
#[derive(Debug, Deserialize)]
pub struct Package {
    /// The package name.
    pub name: String,
    /// Its Cargo.toml.
    pub manifest_path: PathBuf,
    /// Its targets (lib, bins, tests, ...).
    pub targets: Vec<Target>,
}

/// One target of a package, as cargo describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    /// The target name (a crate name for libs, a file stem for tests).
    pub name: String,
    /// `lib`, `bin`, `test`, `bench`, `example`, ...
    pub kind: Vec<String>,
}

impl Workspace {
    /// Runs `cargo metadata --format-version 1 --no-deps` on the workspace
    /// this task belongs to, wherever it is run from.
    pub fn load(cargo: &Path) -> Result<Self> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let output = cargo_command(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--manifest-path",
            ])
            .arg(&manifest)
            .stderr(Stdio::inherit())
            .output()
            .context("running cargo metadata")?;
        if !output.status.success() {
            bail!("cargo metadata failed ({})", output.status);
        }
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata's output")
    }

    /// The package called `name`, if the workspace has it.
    pub fn package(&self, name: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.name == name)
    }

    /// The name of the workspace package whose Cargo.toml is `manifest`.
    fn package_at(&self, manifest: &Path) -> Option<&str> {
        self.packages
            .iter()
            .find(|p| p.manifest_path == manifest)
            .map(|p| p.name.as_str())
    }

    /// The packages whose tests run when none is given: the AF_ALG backend
    /// if the workspace has it, else the CPU fallback.
    pub fn default_test_packages(&self) -> Vec<String> {
        if self.package(AF_ALG_PACKAGE).is_none() {
            return vec![FALLBACK_PACKAGE.to_owned()];
        }
        let mut out = vec![AF_ALG_PACKAGE.to_owned()];
        if self.package(OFFLOAD_PACKAGE).is_some() {
            out.push(format!("{OFFLOAD_PACKAGE}+af-alg/af_alg"));
        }
        out
    }

    /// The packages whose tests `run` runs when none is given: in the vfio
    /// run the VFIO driver's (and `Offload`'s VFIO backend test, built with
    /// both the `vfio` and `af-alg` features: it may use the VFIO devices,
    /// AF_ALG on the device left to virtio_crypto and the CPU together) if
    /// the workspace has it; otherwise, and in the plain and virtio runs,
    /// [`Self::default_test_packages`]. The weak run runs no test binary of
    /// its own: the vfio run's tests cover the same devices, and the weak
    /// run's steps check what its CPU changes (differential fuzzing on
    /// every engine, the block store's reads, the break-even).
    pub fn default_test_packages_for(&self, run: RunKind) -> Vec<String> {
        match run {
            RunKind::Weak => Vec::new(),
            RunKind::Vfio if self.package(VFIO_PACKAGE).is_some() => {
                let mut out = vec![VFIO_PACKAGE.to_owned()];
                if self.package(OFFLOAD_PACKAGE).is_some() {
                    out.push(format!("{OFFLOAD_PACKAGE}+vfio+af-alg/vfio"));
                }
                out
            }
            RunKind::Plain | RunKind::Virtio | RunKind::Vfio => self.default_test_packages(),
        }
    }
}

/// `PACKAGE:BIN`, a binary built `--release` into the guest's /bin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinSpec {
    /// The package that has the binary.
    pub package: String,
    /// The binary target's name.
    pub bin: String,
}

impl std::str::FromStr for BinSpec {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        match spec.split_once(':') {
            Some((package, bin))
                if !package.is_empty() && !bin.is_empty() && !bin.contains('/') =>
            {
                Ok(Self {
                    package: package.to_owned(),
                    bin: bin.to_owned(),
                })
            }
            _ => Err(format!("expected PACKAGE:BIN, got {spec:?}")),
        }
    }
}

impl fmt::Display for BinSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.package, self.bin)
    }
}

/// A program for the guest: its name there and the host file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestBinary {
    /// The file name in the guest (`/tests/<name>` or `/bin/<name>`).
    pub name: String,
    /// The executable cargo built.
    pub host_path: PathBuf,
}

/// One executable cargo reported building.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The package it belongs to (empty if not a workspace package).
    pub package: String,
    /// The package's features it was built with.
    pub features: Vec<String>,
    /// Its target name.
    pub target: String,
    /// Its target kind (`lib`, `bin`, `test`, ...).
    pub kind: String,
    /// The executable's path.
    pub executable: PathBuf,
    /// True for a test harness build (`profile.test`).
    pub test: bool,
}

/// One line of cargo's `--message-format=json` output (the fields used).
#[derive(Deserialize)]
struct Message {
    reason: String,
    manifest_path: Option<PathBuf>,
    target: Option<Target>,
    profile: Option<Profile>,
    features: Option<Vec<String>>,
    executable: Option<PathBuf>,
    message: Option<Diagnostic>,
}

#[derive(Deserialize)]
struct Profile {
    test: bool,
}

#[derive(Deserialize)]
struct Diagnostic {
    rendered: Option<String>,
}

/// The executables among cargo's JSON messages, each with the name
/// `package_of` gives its manifest. Compiler diagnostics are passed to
/// `diagnostics` as cargo would have printed them.
pub fn parse_artifacts(
    package_of: impl Fn(&Path) -> Option<String>,
    json_lines: &str,
    mut diagnostics: impl FnMut(&str),
) -> Vec<Artifact> {
    let mut artifacts = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let Ok(message) = serde_json::from_str::<Message>(line) else {
            continue;
        };
        match message.reason.as_str() {
            "compiler-message" => {
                if let Some(rendered) = message.message.and_then(|m| m.rendered) {
                    diagnostics(&rendered);
                }
            }
            "compiler-artifact" => {
                let (Some(target), Some(profile), Some(executable)) =
                    (message.target, message.profile, message.executable)
                else {
                    continue;
                };
                let package = message
                    .manifest_path
                    .as_deref()
                    .and_then(&package_of)
                    .unwrap_or_default();
                artifacts.push(Artifact {
                    package,
                    features: message.features.unwrap_or_default(),
                    kind: target.kind.first().cloned().unwrap_or_default(),
                    target: target.name,
                    executable,
                    test: profile.test,
                });
            }
            _ => {}
        }
    }
    artifacts
}

/// Guest names for test artifacts: the target name, with `-<kind>` and then
/// `-<package>` added only where names would collide. Sorted first, so the
/// names do not depend on the order cargo finished the builds in.
pub fn name_tests(mut artifacts: Vec<Artifact>) -> Vec<GuestBinary> {
    artifacts
        .sort_by(|a, b| (&a.package, &a.kind, &a.target).cmp(&(&b.package, &b.kind, &b.target)));
    artifacts.dedup_by(|a, b| a.executable == b.executable);
    let mut taken = BTreeSet::new();
    let mut named = Vec::new();
    for artifact in artifacts {
        let candidates = [
            artifact.target.clone(),
            format!("{}-{}", artifact.target, artifact.kind),
            format!("{}-{}-{}", artifact.target, artifact.kind, artifact.package),
        ];
        let name = candidates
            .into_iter()
            .chain((2..).map(|n| format!("{}-{n}", artifact.target)))
            .find(|candidate| !taken.contains(candidate))
            .unwrap_or_default();
        taken.insert(name.clone());
        named.push(GuestBinary {
            name,
            host_path: artifact.executable,
        });
    }
    named
}

/// The cargo that runs this task (`CARGO`), else `cargo` from PATH.
pub fn cargo() -> PathBuf {
    env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// Variables `cargo run` sets for the program it runs (here, this task)
/// that describe that program, not the build it asks for: removed from the
/// cargo this task runs. Build scripts that read one (ring's reads
/// `CARGO_MANIFEST_DIR` through its `rerun-if-env-changed` wrapper) have
/// the ambient value in their fingerprint, so with `xtask`'s values left in,
/// the README's `cargo test --workspace` build was not reused: CI rebuilt
/// ring and every workspace crate's tests (8 min 44 s) for the guests.
const RUN_VARIABLES: [&str; 8] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
    "CARGO_BIN_NAME",
];

/// Prefixes of further variables `cargo run` sets for this task
/// (`CARGO_PKG_NAME`, `CARGO_BIN_EXE_…`): removed as [`RUN_VARIABLES`] are.
const RUN_PREFIXES: [&str; 2] = ["CARGO_PKG_", "CARGO_BIN_EXE_"];

/// `cargo`, without the variables that describe this task ([`RUN_VARIABLES`],
/// [`RUN_PREFIXES`]), so that it sees the environment the developer's own
/// `cargo test` saw and reuses what that built.
fn cargo_command(cargo: &Path) -> Command {
    let mut command = Command::new(cargo);
    for (name, _) in env::vars_os() {
        if name.to_str().is_some_and(is_run_variable) {
            command.env_remove(&name);
        }
    }
    command
}

/// Whether `name` is one of [`RUN_VARIABLES`] or starts with one of
/// [`RUN_PREFIXES`].
fn is_run_variable(name: &str) -> bool {
    RUN_VARIABLES.contains(&name) || RUN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Runs cargo with `args` and JSON messages in the workspace and returns
/// the artifacts it built, showing compiler diagnostics as they come.
fn cargo_json(cargo: &Path, workspace: &Workspace, args: &[&str]) -> Result<Vec<Artifact>> {
    let mut command = cargo_command(cargo);
    command
        .current_dir(&workspace.workspace_root)
        .args(args)
        .arg("--message-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let shown: Vec<OsString> = command.get_args().map(ToOwned::to_owned).collect();
    eprintln!(
        "vm-test: cargo {}",
        shown.join(" ".as_ref()).to_string_lossy()
    );
    let mut child = command.spawn().context("running cargo")?;
    let mut artifacts = Vec::new();
    let package_of = |manifest: &Path| workspace.package_at(manifest).map(str::to_owned);
    for line in BufReader::new(child.stdout.take().context("cargo's stdout")?).lines() {
        let line = line.context("reading cargo's output")?;
        artifacts.extend(parse_artifacts(package_of, &line, |rendered| {
            eprint!("{rendered}");
        }));
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(artifacts)
}

/// A test binary for the guest and the requested specs that built it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// The binary.
    pub binary: GuestBinary,
    /// Indices into the `packages` given to [`build_tests`] (two specs can
    /// build the same executable).
    pub specs: BTreeSet<usize>,
}

/// The test artifacts among `built` that serve `spec`
/// (`PACKAGE[+FEATURE…][/TEST]`): the package's test binaries (or only its
/// integration test `TEST`), if all were built with the spec's features.
pub fn pick_tests(built: &[Artifact], spec: &str) -> Option<Vec<Artifact>> {
    let (package, features, test) = parse_test_spec(spec);
    let picked: Vec<Artifact> = built
        .iter()
        .filter(|a| a.test && a.package == package)
        .filter(|a| test.is_none_or(|t| a.kind == "test" && a.target == t))
        .cloned()
        .collect();
    let served = !picked.is_empty()
        && picked
            .iter()
            .all(|a| features.iter().all(|f| a.features.iter().any(|g| g == f)));
    served.then_some(picked)
}

/// Builds the test binaries of `packages` (each as `cargo test -p P` would):
/// with `workspace_build`, from one `cargo test --no-run --workspace`
/// (the README's test build, reused as it is), building on its own only a
/// spec that build does not serve ([`pick_tests`]).
pub fn build_tests(
    cargo: &Path,
    workspace: &Workspace,
    packages: &[String],
    workspace_build: bool,
) -> Result<Vec<TestBinary>> {
    // Nothing to build (the weak run alone runs only steps).
    if packages.is_empty() {
        return Ok(Vec::new());
    }
    let mut artifacts = Vec::new();
    let mut specs_of: BTreeMap<PathBuf, BTreeSet<usize>> = BTreeMap::new();
    let all = if workspace_build {
        cargo_json(cargo, workspace, &["test", "--no-run", "--workspace"])?
    } else {
        Vec::new()
    };
    for (index, spec) in packages.iter().enumerate() {
        let (package, features, test) = parse_test_spec(spec);
        if workspace.package(package).is_none() {
            bail!(
                "package {package} is not in the workspace at {}",
                workspace.workspace_root.display()
            );
        }
        let built = match pick_tests(&all, spec) {
            Some(picked) => picked,
            None => {
                let mut args = vec!["test", "--no-run", "-p", package];
                let features = features.join(",");
                if !features.is_empty() {
                    args.extend(["--features", &features]);
                }
                if let Some(test) = test {
                    args.extend(["--test", test]);
                }
                cargo_json(cargo, workspace, &args)?
            }
        };
        for artifact in built.into_iter().filter(|a| a.test) {
            specs_of
                .entry(artifact.executable.clone())
                .or_default()
                .insert(index);
            artifacts.push(artifact);
        }
    }
    if artifacts.is_empty() {
        bail!("cargo built no test binaries for {}", packages.join(", "));
    }
    Ok(name_tests(artifacts)
        .into_iter()
        .map(|binary| TestBinary {
            specs: specs_of.remove(&binary.host_path).unwrap_or_default(),
            binary,
        })
        .collect())
}

/// `PACKAGE[+FEATURE…][/TEST]`: a package's test binaries, built with
/// those features, or only its integration test `TEST`
/// (e.g. `crypto-offload+af-alg/af_alg`).
pub fn parse_test_spec(spec: &str) -> (&str, Vec<&str>, Option<&str>) {
    let (rest, test) = match spec.split_once('/') {
        Some((rest, test)) if !test.is_empty() => (rest, Some(test)),
        _ => (spec, None),
    };
    let mut parts = rest.split('+');
    let package = parts.next().unwrap_or_default();
    (package, parts.filter(|f| !f.is_empty()).collect(), test)
}

/// Builds the release binaries for the guest's /bin, all in one cargo
/// invocation (one set of features for what they share, built once).
pub fn build_release_bins(
    cargo: &Path,
    workspace: &Workspace,
    specs: &[BinSpec],
) -> Result<Vec<GuestBinary>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let mut args = vec!["build", "--release"];
    let mut packages = BTreeSet::new();
    for spec in specs {
        let package = workspace
            .package(&spec.package)
            .with_context(|| format!("package {} is not in the workspace", spec.package))?;
        if !package
            .targets
            .iter()
            .any(|t| t.name == spec.bin && t.kind.iter().any(|k| k == "bin"))
        {
            bail!("package {} has no binary called {}", spec.package, spec.bin);
        }
        packages.insert(spec.package.as_str());
    }
    for package in &packages {
        args.extend(["-p", package]);
    }
    for spec in specs {
        args.extend(["--bin", &spec.bin]);
    }
    let built = cargo_json(cargo, workspace, &args)?;
    specs
        .iter()
        .map(|spec| {
            let artifact = built
                .iter()
                .find(|a| {
                    !a.test && a.kind == "bin" && a.target == spec.bin && a.package == spec.package
                })
                .with_context(|| format!("cargo reported no executable for {spec}"))?;
            Ok(GuestBinary {
                name: spec.bin.clone(),
                host_path: artifact.executable.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"x","target":{"kind":["lib"],"crate_types":["lib"],"name":"aes","src_path":"/r/aes/src/lib.rs","edition":"2021","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":[],"filenames":["/t/libaes.rlib"],"executable":null,"fresh":true}
{"reason":"compiler-message","package_id":"x","manifest_path":"/r/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"f","src_path":"/r/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"message":{"rendered":"warning: unused variable\n","level":"warning"}}
{"reason":"compiler-artifact","package_id":"x","target":{"kind":["lib"],"crate_types":["lib"],"name":"crypto_offload_fallback","src_path":"/r/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"3","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/t/deps/crypto_offload_fallback-5d9d"],"executable":"/t/deps/crypto_offload_fallback-5d9d","fresh":true}
{"reason":"compiler-artifact","package_id":"x","target":{"kind":["test"],"crate_types":["bin"],"name":"differential","src_path":"/r/tests/differential.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/t/deps/differential-59cf"],"executable":"/t/deps/differential-59cf","fresh":false}
{"reason":"compiler-artifact","package_id":"x","target":{"kind":["bin"],"crate_types":["bin"],"name":"offload","src_path":"/r/cli/src/main.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":[],"filenames":["/t/release/offload"],"executable":"/t/release/offload","fresh":true}
{"reason":"build-finished","success":true}
"#;

    /// `cargo test` runs this test with the variables `cargo run` gives
    /// the task (the package's name, its manifest folder): the cargo the
    /// task runs must not see them, or ring's build script is dirty and the
    /// README's test build is redone.
    #[test]
    fn cargo_runs_without_the_variables_that_describe_this_task() {
        assert!(
            env::var_os("CARGO_MANIFEST_DIR").is_some() && env::var_os("CARGO_PKG_NAME").is_some(),
            "cargo sets these for the tests it runs"
        );
        let command = cargo_command(Path::new("cargo"));
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        for name in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_PKG_VERSION"] {
            assert!(removed.iter().any(|r| r == name), "{name} reaches cargo");
        }
        // What configures the build stays: only removals, none of them
        // cargo's own settings (by name, whether set here or not).
        assert!(command.get_envs().all(|(_, value)| value.is_none()));
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_PROFILE_DEV_DEBUG",
            "CARGO_BUILD_JOBS",
            "CARGO_TERM_COLOR",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!is_run_variable(kept), "{kept} would be removed");
        }
        for gone in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_BIN_EXE_offload",
            "OUT_DIR",
        ] {
            assert!(is_run_variable(gone), "{gone} would reach cargo");
        }
    }

    fn artifact(package: &str, kind: &str, target: &str, path: &str) -> Artifact {
        Artifact {
            package: package.into(),
            features: Vec::new(),
            target: target.into(),
            kind: kind.into(),
            executable: path.into(),
            test: true,
        }
    }

    #[test]
    fn executables_and_diagnostics_are_picked_from_cargo_messages() {
        let mut diagnostics = Vec::new();
        let artifacts = parse_artifacts(
            |_| Some("p".to_owned()),
            MESSAGES,
            |d| diagnostics.push(d.to_owned()),
        );
        let tests: Vec<_> = artifacts
            .iter()
            .filter(|a| a.test)
            .map(|a| a.target.as_str())
            .collect();
        assert_eq!(tests, ["crypto_offload_fallback", "differential"]);
        let bins: Vec<_> = artifacts
            .iter()
            .filter(|a| !a.test)
            .map(|a| a.target.as_str())
            .collect();
        assert_eq!(
            bins,
            ["offload"],
            "artifacts without an executable are dropped"
        );
        assert_eq!(diagnostics, ["warning: unused variable\n"]);
    }

    #[test]
    fn names_are_target_names_unless_they_collide() {
        let named = name_tests(vec![
            artifact("b", "test", "differential", "/t/differential-2"),
            artifact("a", "test", "differential", "/t/differential-1"),
            artifact("a", "lib", "crypto_offload", "/t/crypto_offload-1"),
            artifact("c", "bin", "differential", "/t/differential-3"),
            artifact("a", "test", "vectors", "/t/vectors-1"),
        ]);
        let names: Vec<_> = named
            .iter()
            .map(|b| (b.name.as_str(), b.host_path.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("crypto_offload", "/t/crypto_offload-1"),
                ("differential", "/t/differential-1"),
                ("vectors", "/t/vectors-1"),
                ("differential-test", "/t/differential-2"),
                ("differential-bin", "/t/differential-3"),
            ]
        );
    }

    /// A workspace build serves a spec only with the spec's features: the
    /// package's test binaries, or the one test named.
    #[test]
    fn a_workspace_build_serves_the_specs_it_has_the_features_for() {
        let with = |package: &str, kind: &str, target: &str, features: &[&str]| Artifact {
            features: features.iter().map(|f| (*f).to_owned()).collect(),
            ..artifact(package, kind, target, &format!("/t/{package}-{target}"))
        };
        let built = vec![
            with(
                "crypto-offload",
                "lib",
                "crypto_offload",
                &["af-alg", "vfio"],
            ),
            with("crypto-offload", "test", "vfio", &["af-alg", "vfio"]),
            with("crypto-offload", "test", "af_alg", &["af-alg", "vfio"]),
            with("crypto-offload-vfio", "lib", "crypto_offload_vfio", &[]),
            with("crypto-offload-vfio", "test", "guest", &[]),
        ];
        let targets = |spec: &str| -> Option<Vec<String>> {
            pick_tests(&built, spec).map(|p| p.into_iter().map(|a| a.target).collect())
        };
        assert_eq!(
            targets("crypto-offload+vfio+af-alg/vfio"),
            Some(vec!["vfio".to_owned()])
        );
        assert_eq!(
            targets("crypto-offload-vfio"),
            Some(vec!["crypto_offload_vfio".to_owned(), "guest".to_owned()])
        );
        assert_eq!(
            targets("crypto-offload+sim-only/vfio"),
            None,
            "a feature it lacks"
        );
        assert_eq!(targets("crypto-offload/nonexistent"), None);
        assert_eq!(targets("crypto-offload-fallback"), None, "not built");
    }

    #[test]
    fn bin_specs_parse() {
        assert_eq!(
            "offload-cli:offload".parse::<BinSpec>().unwrap(),
            BinSpec {
                package: "offload-cli".into(),
                bin: "offload".into()
            }
        );
        assert!("offload".parse::<BinSpec>().is_err());
        assert!(":offload".parse::<BinSpec>().is_err());
        assert!("p:".parse::<BinSpec>().is_err());
    }

    #[test]
    fn the_af_alg_backend_is_the_default_when_present() {
        let package = |name: &str| Package {
            name: name.into(),
            manifest_path: format!("/r/{name}/Cargo.toml").into(),
            targets: Vec::new(),
        };
        let mut workspace = Workspace {
            workspace_root: "/r".into(),
            target_directory: "/r/target".into(),
            packages: vec![package(FALLBACK_PACKAGE)],
        };
        assert_eq!(workspace.default_test_packages(), [FALLBACK_PACKAGE]);
        workspace.packages.push(package(AF_ALG_PACKAGE));
        assert_eq!(workspace.default_test_packages(), [AF_ALG_PACKAGE]);
        // Without the VFIO driver, the vfio run runs what the others do;
        // the weak run runs only its steps.
        for run in RunKind::ALL {
            let expected: &[&str] = if run == RunKind::Weak {
                &[]
            } else {
                &[AF_ALG_PACKAGE]
            };
            assert_eq!(workspace.default_test_packages_for(run), expected);
        }
        workspace.packages.push(package(VFIO_PACKAGE));
        assert_eq!(
            workspace.default_test_packages_for(RunKind::Vfio),
            [VFIO_PACKAGE]
        );
        assert_eq!(
            workspace.default_test_packages_for(RunKind::Virtio),
            [AF_ALG_PACKAGE]
        );
        // With `Offload`, its VFIO test, built with both backends.
        workspace.packages.push(package(OFFLOAD_PACKAGE));
        let vfio = workspace.default_test_packages_for(RunKind::Vfio);
        assert_eq!(vfio, [VFIO_PACKAGE, "crypto-offload+vfio+af-alg/vfio"]);
        assert_eq!(
            parse_test_spec(&vfio[1]),
            ("crypto-offload", vec!["vfio", "af-alg"], Some("vfio"))
        );
        assert_eq!(
            parse_test_spec("crypto-offload+af-alg+testing/af_alg"),
            ("crypto-offload", vec!["af-alg", "testing"], Some("af_alg"))
        );
        assert_eq!(parse_test_spec("p"), ("p", vec![], None));
    }
}
