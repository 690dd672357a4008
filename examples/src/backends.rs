//! The servers' and load generators' `--policy`, `--backend` and `--sim`
//! flags, the [`Offload`] they build, and what each backend served.

use std::path::PathBuf;
use std::sync::Arc;

use crypto_offload::{Algorithm, Offload, Policy, Profile, ProfileError};
use crypto_offload_sim::{SimConfig, SimEngine};
use serde::{Deserialize, Serialize};

/// Which backends a process uses and how it chooses among them.
///
/// By default: every backend `Offload::discover_with` finds on this machine
/// (the CPU, AF_ALG's hardware engines, virtio-crypto devices bound to
/// `vfio-pci`), chosen per request under the Throughput policy.
#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// Selection policy: latency, throughput, cpu-saving[=MS].
    #[arg(long, default_value = "throughput")]
    pub policy: Policy,
    /// Run every request on this backend instead of choosing: `cpu`,
    /// `sim:qce`, an AF_ALG engine or a `vfio:` device (see `offload probe`).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Add a simulated engine (repeatable): omap, qce, mcrc64, eip197.
    #[arg(long = "sim", value_name = "PRESET")]
    pub sims: Vec<String>,
    /// Load the cost model and the CPU implementations from a profile
    /// (`offload calibrate --out FILE`) instead of measuring them at start:
    /// a start in milliseconds rather than seconds, and the same choices
    /// every start.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
}

impl Default for BackendArgs {
    fn default() -> Self {
        BackendArgs {
            policy: Policy::Throughput,
            backend: None,
            sims: Vec::new(),
            profile: None,
        }
    }
}

/// Why the backends asked for could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// `--sim` named no preset.
    #[error("unknown --sim {0:?}; presets: {presets}", presets = SimConfig::PRESETS.join(", "))]
    UnknownSim(String),
    /// `--profile` could not be read.
    #[error("--profile {path}: {source}", path = path.display())]
    ReadProfile {
        /// The file.
        path: PathBuf,
        /// Why (keeps the errno).
        source: std::io::Error,
    },
    /// `--profile` is not a profile.
    #[error("--profile {path}: {source}", path = path.display())]
    Profile {
        /// The file.
        path: PathBuf,
        /// Where and why it does not parse.
        source: ProfileError,
    },
    /// `--profile` parses but holds neither costs nor CPU implementations
    /// (an empty file, or another TOML file).
    #[error("--profile {path}: no [[entry]] and no [[cpu_implementation]]: not a profile `offload calibrate --out` wrote", path = path.display())]
    EmptyProfile {
        /// The file.
        path: PathBuf,
    },
    /// The `Offload` could not be built (a `--backend` that names no backend).
    #[error(transparent)]
    Offload(#[from] crypto_offload::Error),
}

impl BackendArgs {
    /// Discovers this machine's backends, adds the simulated ones, and
    /// applies the policy and the forced backend. Must run inside a tokio
    /// runtime (a simulated engine starts its device threads there).
    ///
    /// With `--profile`, the profile's costs and CPU implementations are
    /// taken as they are; only what it lacks is measured (an engine it has
    /// no costs for: `Offload::discover_with`; a CPU mode it does not name).
    ///
    /// # Errors
    /// [`SetupError::UnknownSim`]; [`SetupError::ReadProfile`],
    /// [`SetupError::Profile`] and [`SetupError::EmptyProfile`] for a
    /// `--profile` that cannot be read, parsed, or holds nothing;
    /// [`SetupError::Offload`] for a `--backend` that names no backend.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind (the simulated engines
    /// built so far are dropped with it).
    pub async fn offloads(&self) -> Result<Offloads, SetupError> {
        let profile = self.profile()?;
        let mut builder = Offload::builder().policy(self.policy);
        if let Some(profile) = &profile {
            builder = builder.profile(profile.clone());
        }
        for name in &self.sims {
            let config =
                SimConfig::preset(name).ok_or_else(|| SetupError::UnknownSim(name.clone()))?;
            builder = builder.backend(Arc::new(SimEngine::new(config)));
        }
        if let Some(name) = &self.backend {
            builder = builder.pin(name.clone());
        }
        let main = Offload::discover_with(builder).await?;
        let forced = main
            .backends()
            .into_iter()
            .any(|b| b.pinned && b.name != "cpu");
        let cpu = forced.then(|| {
            let builder = Offload::builder();
            match profile {
                Some(profile) => builder.profile(profile),
                None => builder,
            }
            .build()
        });
        Ok(Offloads {
            cpu: cpu.transpose()?,
            main,
        })
    }

    /// The `--profile`, read and parsed.
    fn profile(&self) -> Result<Option<Profile>, SetupError> {
        let Some(path) = &self.profile else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::ReadProfile {
            path: path.clone(),
            source,
        })?;
        let profile = Profile::from_toml(&text).map_err(|source| SetupError::Profile {
            path: path.clone(),
            source,
        })?;
        if profile.entries.is_empty() && profile.cpu_implementations.is_empty() {
            return Err(SetupError::EmptyProfile { path: path.clone() });
        }
        Ok(Some(profile))
    }
}

/// The `Offload` a server's sessions open on — and, when `--backend`
/// forces an engine, a CPU-only one for the algorithms that engine does not
/// run (`sim:qce` has XTS but no CRC-32C: the block store's CRCs then stay
/// on the CPU).
#[derive(Debug, Clone)]
pub struct Offloads {
    main: Offload,
    cpu: Option<Offload>,
}

impl From<Offload> for Offloads {
    fn from(main: Offload) -> Self {
        Offloads { main, cpu: None }
    }
}

impl Offloads {
    /// The `Offload` to open `alg`'s sessions on.
    pub fn for_alg(&self, alg: impl Into<Algorithm>) -> &Offload {
        let alg = alg.into();
        match &self.cpu {
            Some(cpu) if !self.forced_runs(alg) => cpu,
            _ => &self.main,
        }
    }

    fn forced_runs(&self, alg: Algorithm) -> bool {
        self.main
            .backends()
            .iter()
            .any(|b| b.pinned && b.algorithms.contains(&alg))
    }

    /// The algorithms of `algs` a forced engine does not run (they stay on
    /// the CPU).
    pub fn left_on_cpu(&self, algs: &[Algorithm]) -> Vec<Algorithm> {
        if self.cpu.is_none() {
            return Vec::new();
        }
        algs.iter()
            .copied()
            .filter(|&a| !self.forced_runs(a))
            .collect()
    }

    /// `auto (throughput)` or `forced sim:qce`.
    pub fn selection(&self) -> String {
        match self.main.backends().into_iter().find(|b| b.pinned) {
            Some(b) => format!("forced {}", b.name),
            None => format!("auto ({})", self.main.policy()),
        }
    }

    /// One line: the backends and the selection.
    pub fn describe(&self) -> String {
        let backends = self.main.backends();
        let names: Vec<&str> = backends.iter().map(|b| b.name.as_str()).collect();
        format!("backends {}, {}", names.join(", "), self.selection())
    }

    /// What every backend has served so far (the CPU's count includes the
    /// CPU-only `Offload`'s).
    pub fn served(&self) -> Vec<Served> {
        let mut all = served(&self.main);
        if let Some(cpu) = &self.cpu {
            for extra in served(cpu) {
                match all.iter_mut().find(|s| s.name == extra.name) {
                    Some(s) => {
                        s.requests += extra.requests;
                        s.bytes += extra.bytes;
                    }
                    None => all.push(extra),
                }
            }
        }
        all
    }
}

/// What one backend has served, as the servers report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// The backend's name.
    pub name: String,
    /// Requests completed on it.
    pub requests: u64,
    /// Bytes of those requests.
    pub bytes: u64,
}

/// What every backend of `offload` has served so far.
fn served(offload: &Offload) -> Vec<Served> {
    offload
        .backends()
        .into_iter()
        .map(|b| Served {
            name: b.name,
            requests: b.stats.requests,
            bytes: b.stats.bytes,
        })
        .collect()
}

/// `after − before`, backend by backend (a backend missing from `before`
/// counts from zero).
pub fn served_since(before: &[Served], after: &[Served]) -> Vec<Served> {
    after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.name == a.name);
            Served {
                name: a.name.clone(),
                requests: a.requests.saturating_sub(b.map_or(0, |b| b.requests)),
                bytes: a.bytes.saturating_sub(b.map_or(0, |b| b.bytes)),
            }
        })
        .collect()
}

/// `cpu 12.3 MB, sim:qce 4.5 MB`: the bytes each backend served.
pub fn format_served(served: &[Served]) -> String {
    let parts: Vec<String> = served
        .iter()
        .map(|s| format!("{} {:.1} MB", s.name, s.bytes as f64 / 1e6))
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_since_subtracts_by_name_and_counts_new_backends_from_zero() {
        let before = [Served {
            name: "cpu".into(),
            requests: 2,
            bytes: 100,
        }];
        let after = [
            Served {
                name: "cpu".into(),
                requests: 5,
                bytes: 400,
            },
            Served {
                name: "sim:qce".into(),
                requests: 1,
                bytes: 4096,
            },
        ];
        let d = served_since(&before, &after);
        assert_eq!(
            d[0],
            Served {
                name: "cpu".into(),
                requests: 3,
                bytes: 300
            }
        );
        assert_eq!(
            d[1],
            Served {
                name: "sim:qce".into(),
                requests: 1,
                bytes: 4096
            }
        );
    }

    #[tokio::test]
    async fn a_forced_engine_leaves_what_it_does_not_run_on_the_cpu() {
        use crypto_offload::{CipherAlg, CrcAlg};
        let args = BackendArgs {
            backend: Some("sim:qce".into()),
            sims: vec!["qce".into()],
            ..BackendArgs::default()
        };
        let o = args.offloads().await.unwrap();
        assert_eq!(o.selection(), "forced sim:qce");
        let xts = o.for_alg(CipherAlg::Aes256Xts).backends();
        assert!(xts.iter().any(|b| b.pinned && b.name == "sim:qce"));
        let crc = o.for_alg(CrcAlg::Crc32Iscsi).backends();
        assert_eq!(crc.len(), 1, "CPU only");
        assert_eq!(
            o.left_on_cpu(&[CipherAlg::Aes256Xts.into(), CrcAlg::Crc32Iscsi.into()]),
            vec![Algorithm::from(CrcAlg::Crc32Iscsi)]
        );
        // Not forced: one Offload for everything, nothing set aside.
        let auto = BackendArgs::default().offloads().await.unwrap();
        assert!(auto.left_on_cpu(&[CrcAlg::Crc32Iscsi.into()]).is_empty());
        assert_eq!(auto.selection(), "auto (throughput)");
    }

    #[tokio::test]
    async fn a_profile_is_taken_as_it_is_by_both_offloads() {
        use crypto_offload::cpu::ChoiceSource;
        use crypto_offload::cpu_choice::Mode;
        use crypto_offload::{CipherAlg, CrcAlg};
        let sim = BackendArgs {
            sims: vec!["qce".into()],
            ..BackendArgs::default()
        };
        let saved = sim
            .offloads()
            .await
            .unwrap()
            .for_alg(CrcAlg::Crc32Iscsi)
            .profile();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.toml");
        std::fs::write(&path, saved.to_toml().unwrap()).unwrap();
        let args = BackendArgs {
            backend: Some("sim:qce".into()),
            profile: Some(path),
            ..sim
        };
        let o = args.offloads().await.unwrap();
        // What the profile says each mode runs on, as a plain Offload reads it.
        let loaded = Offload::builder().profile(saved.clone()).build().unwrap();
        // The forced engine's Offload and the CPU-only one beside it both
        // run the profile's CPU implementations rather than measuring.
        for alg in [
            Algorithm::from(CipherAlg::Aes256Xts),
            CrcAlg::Crc32Iscsi.into(),
        ] {
            let offload = o.for_alg(alg);
            for mode in Mode::ALL {
                let (choice, source) = offload.cpu_choice(mode);
                assert_eq!(source, ChoiceSource::Given, "{alg} {mode:?}");
                assert_eq!(choice, loaded.cpu_choice(mode).0, "{alg} {mode:?}");
            }
        }
        // Not forced, the engine's costs are the profile's, as they were
        // saved (measured again, they would differ in some digit).
        let auto = BackendArgs {
            backend: None,
            ..args
        };
        let now = auto
            .offloads()
            .await
            .unwrap()
            .for_alg(CipherAlg::Aes256Xts)
            .profile();
        let qce: Vec<_> = saved
            .entries
            .iter()
            .filter(|e| e.backend == "sim:qce")
            .collect();
        assert!(!qce.is_empty());
        for e in qce {
            assert!(now.entries.contains(e), "{e:?}");
        }
    }

    #[tokio::test]
    async fn a_missing_or_malformed_profile_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = BackendArgs {
            profile: Some(dir.path().join("none.toml")),
            ..BackendArgs::default()
        };
        match missing.offloads().await {
            Err(SetupError::ReadProfile { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[[entry]]\nbackend = 3\n").unwrap();
        let malformed = BackendArgs {
            profile: Some(bad),
            ..BackendArgs::default()
        };
        let err = malformed.offloads().await.unwrap_err();
        assert!(matches!(err, SetupError::Profile { .. }), "{err}");
        assert!(err.to_string().contains("bad.toml"), "{err}");
        // Another TOML file parses as a profile with nothing in it.
        let other = dir.path().join("Cargo.toml");
        std::fs::write(&other, "[package]\nname = \"x\"\n").unwrap();
        let empty = BackendArgs {
            profile: Some(other),
            ..BackendArgs::default()
        };
        let err = empty.offloads().await.unwrap_err();
        assert!(matches!(err, SetupError::EmptyProfile { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_forced_backend_that_does_not_exist_is_an_error() {
        let args = BackendArgs {
            backend: Some("no-such-engine".into()),
            ..BackendArgs::default()
        };
        assert!(matches!(args.offloads().await, Err(SetupError::Offload(_))));
        let args = BackendArgs {
            sims: vec!["nope".into()],
            ..BackendArgs::default()
        };
        assert!(matches!(
            args.offloads().await,
            Err(SetupError::UnknownSim(_))
        ));
    }
}
