//! Kernel modules for the guest: which ones, and their load order.
//!
//! The order comes from `/lib/modules/<release>/modules.dep`, whose lines
//! read `kernel/path/name.ko: kernel/path/dep.ko ...`. Module names are the
//! file names without `.ko`; the kernel treats `-` and `_` in them as the
//! same, so both sides are normalised to `_` before matching. A requested
//! module that modules.dep does not list is assumed built in and skipped
//! with a note (which says whether `modules.builtin` confirms it).
//!
//! Every run loads [`GUEST_MODULES`]; a run may load more after them
//! ([`run_modules`]: the vfio run's VFIO modules), planned so that what the
//! common list already loaded is not loaded twice.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read as _;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::qemu::RunKind;

/// The modules the guest loads, in this order (each after its dependencies).
///
/// AF_ALG's socket families, the AES modes and their x86 accelerations (as
/// the vm-probe found them in Debian's 6.1 kernel), the CRCs behind the
/// `crc32`, `crc32c` and `crc64-rocksoft` hashes, then virtio-pci and the
/// virtio-crypto driver. Built-in ones (e.g. `cbc`) are skipped.
pub const GUEST_MODULES: &[&str] = &[
    "af_alg",
    "algif_skcipher",
    "algif_aead",
    "algif_hash",
    "ecb",
    "cbc",
    "ctr",
    "xts",
    "gf128mul",
    "ghash-generic",
    "gcm",
    "cryptd",
    "crypto_simd",
    "aesni-intel",
    "ghash-clmulni-intel",
    "crc32c_generic",
    "crc32c-intel",
    "crc32_generic",
    "crc32-pclmul",
    "crc64",
    "crc64_rocksoft_generic",
    "crc64_rocksoft",
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "crypto_engine",
    "virtio_crypto",
];

/// The modules only the vfio run loads, after [`GUEST_MODULES`]: VFIO, its
/// type-1 IOMMU backend and vfio-pci. modules.dep adds their dependencies
/// (`irqbypass`); the Intel IOMMU driver itself is built in.
pub const VFIO_MODULES: &[&str] = &[
    "vfio",
    "vfio_iommu_type1",
    "vfio_virqfd",
    "vfio-pci-core",
    "vfio-pci",
];

/// The modules only the virtio run loads, after [`GUEST_MODULES`]:
/// `crypto_user` (NETLINK_CRYPTO), which libkcapi asks for a cipher's
/// block and IV sizes before it opens a handle — the `kcapi-peer` the
/// `af-alg-vs-kcapi` step runs fails without it.
pub const VIRTIO_MODULES: &[&str] = &["crypto_user"];

/// The modules `run` loads after [`GUEST_MODULES`].
pub fn run_modules(run: RunKind) -> &'static [&'static str] {
    match run {
        RunKind::Plain => &[],
        RunKind::Virtio => VIRTIO_MODULES,
        RunKind::Vfio | RunKind::Weak => VFIO_MODULES,
    }
}

/// A module name as the kernel compares them: `-` and `_` are the same.
pub fn normalise(name: &str) -> String {
    name.replace('-', "_")
}

/// The normalised module name of a path such as `kernel/crypto/ghash-generic.ko`
/// (or `.ko.xz`, `.ko.gz`, `.ko.zst`).
pub fn name_of(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split_once(".ko").map_or(file, |(stem, _)| stem);
    normalise(stem)
}

/// The parsed `modules.dep`: each module's file and dependencies.
#[derive(Debug, Default)]
pub struct ModulesDep {
    /// Normalised name → (path relative to the modules folder, dependency paths).
    modules: BTreeMap<String, (String, Vec<String>)>,
}

/// Why a requested module is not in the load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// Listed in modules.builtin.
    BuiltIn(String),
    /// Neither in modules.dep nor in modules.builtin: assumed built in.
    Unknown(String),
}

/// The modules to load, dependencies first, and the requested ones skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LoadPlan {
    /// Paths relative to `/lib/modules/<release>`, in insmod order.
    pub order: Vec<String>,
    /// Requested modules that are not loadable files.
    pub skipped: Vec<Skipped>,
}

impl ModulesDep {
    /// Parses the text of a `modules.dep`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut modules = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (path, deps) = line
                .split_once(':')
                .with_context(|| format!("modules.dep line {}: no ':' in {line:?}", number + 1))?;
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            modules.insert(name_of(path), (path.trim().to_owned(), deps));
        }
        Ok(Self { modules })
    }

    /// The load order of `wanted` and everything they depend on: each
    /// module after its dependencies, each once, otherwise in request order.
    /// `builtin` holds the normalised names listed in modules.builtin.
    pub fn load_plan(&self, wanted: &[&str], builtin: &BTreeSet<String>) -> Result<LoadPlan> {
        self.load_plan_after(&[], wanted, builtin)
    }

    /// Like [`Self::load_plan`], for a guest that has already loaded the
    /// modules at `loaded` (paths as in a plan's `order`): those are left out.
    pub fn load_plan_after(
        &self,
        loaded: &[String],
        wanted: &[&str],
        builtin: &BTreeSet<String>,
    ) -> Result<LoadPlan> {
        let by_path: BTreeMap<&str, &str> = self
            .modules
            .iter()
            .map(|(name, (path, _))| (path.as_str(), name.as_str()))
            .collect();
        let mut plan = LoadPlan::default();
        let mut done: BTreeSet<String> = loaded.iter().map(|path| name_of(path)).collect();
        for &name in wanted {
            let name = normalise(name);
            if !self.modules.contains_key(&name) {
                plan.skipped.push(if builtin.contains(&name) {
                    Skipped::BuiltIn(name)
                } else {
                    Skipped::Unknown(name)
                });
                continue;
            }
            self.visit(&name, &by_path, &mut Vec::new(), &mut done, &mut plan.order)?;
        }
        Ok(plan)
    }

    /// Depth-first: dependencies are pushed before the module itself.
    fn visit(
        &self,
        name: &str,
        by_path: &BTreeMap<&str, &str>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        if done.contains(name) {
            return Ok(());
        }
        if stack.iter().any(|s| s == name) {
            bail!(
                "modules.dep has a dependency cycle: {} -> {name}",
                stack.join(" -> ")
            );
        }
        let (path, deps) = self.modules.get(name).with_context(|| {
            format!("modules.dep names {name} as a dependency but has no line for it")
        })?;
        stack.push(name.to_owned());
        for dep in deps {
            let dep_name = by_path
                .get(dep.as_str())
                .map_or_else(|| name_of(dep), |n| (*n).to_owned());
            self.visit(&dep_name, by_path, stack, done, order)?;
        }
        stack.pop();
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }
}

/// Normalised module names listed in a `modules.builtin`.
pub fn parse_builtin(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(name_of)
        .collect()
}

/// The modules of every run, from the modules folder of a kernel.
#[derive(Debug, Default)]
pub struct GuestPlan {
    /// [`GUEST_MODULES`], which every run loads.
    pub common: LoadPlan,
    /// Per run with modules of its own, what it loads after `common`.
    pub runs: Vec<(RunKind, LoadPlan)>,
}

impl GuestPlan {
    /// Every requested module that is not a loadable file, once.
    pub fn skipped(&self) -> Vec<&Skipped> {
        let mut skipped: Vec<&Skipped> = Vec::new();
        for s in std::iter::once(&self.common)
            .chain(self.runs.iter().map(|(_, plan)| plan))
            .flat_map(|plan| &plan.skipped)
        {
            if !skipped.contains(&s) {
                skipped.push(s);
            }
        }
        skipped
    }
}

/// The load plans of [`GUEST_MODULES`] and of each run's own modules
/// ([`run_modules`]) from the modules folder of a kernel.
pub fn plan_for(modules_dir: &Path) -> Result<GuestPlan> {
    let dep_path = modules_dir.join("modules.dep");
    let dep =
        fs::read_to_string(&dep_path).with_context(|| format!("reading {}", dep_path.display()))?;
    let builtin = fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let builtin = parse_builtin(&builtin);
    let dep = ModulesDep::parse(&dep)?;
    let common = dep.load_plan(GUEST_MODULES, &builtin)?;
    let mut runs = Vec::new();
    for run in RunKind::ALL {
        let wanted = run_modules(run);
        if !wanted.is_empty() {
            runs.push((run, dep.load_plan_after(&common.order, wanted, &builtin)?));
        }
    }
    Ok(GuestPlan { common, runs })
}

/// A module file's contents ready for busybox `insmod`: `.ko` as is, `.ko.xz`
/// and `.ko.gz` decompressed. Returns the bytes and the path to give the
/// file in the guest (ending in `.ko`).
pub fn module_file(modules_dir: &Path, relative: &str) -> Result<(Vec<u8>, String)> {
    let path = modules_dir.join(relative);
    let raw = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let plain = if let Some(stem) = relative.strip_suffix(".xz") {
        liblzma::read::XzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {}", path.display()))?;
        stem
    } else if let Some(stem) = relative.strip_suffix(".gz") {
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {}", path.display()))?;
        stem
    } else if relative.ends_with(".ko") {
        out = raw;
        relative
    } else {
        bail!("{}: unsupported module compression", path.display());
    };
    Ok((out, plain.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/crypto/af_alg.ko:
kernel/crypto/algif_skcipher.ko: kernel/crypto/af_alg.ko
kernel/crypto/cryptd.ko:
kernel/crypto/crypto_simd.ko: kernel/crypto/cryptd.ko
kernel/arch/x86/crypto/aesni-intel.ko: kernel/crypto/crypto_simd.ko kernel/crypto/cryptd.ko
kernel/lib/crc64.ko:
kernel/lib/crc64-rocksoft.ko: kernel/lib/crc64.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/crypto/crypto_engine.ko:
kernel/drivers/crypto/virtio/virtio_crypto.ko: kernel/crypto/crypto_engine.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/vfio/vfio.ko:
kernel/drivers/vfio/vfio_virqfd.ko:
kernel/drivers/vfio/vfio_iommu_type1.ko: kernel/drivers/vfio/vfio.ko
kernel/drivers/vfio/pci/vfio-pci-core.ko: kernel/drivers/vfio/vfio_virqfd.ko kernel/drivers/vfio/vfio.ko kernel/virt/lib/irqbypass.ko
kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/pci/vfio-pci-core.ko kernel/drivers/vfio/vfio_virqfd.ko kernel/drivers/vfio/vfio.ko kernel/virt/lib/irqbypass.ko
kernel/virt/lib/irqbypass.ko:
";

    fn plan(wanted: &[&str]) -> LoadPlan {
        let builtin = parse_builtin("kernel/crypto/cbc.ko\n");
        ModulesDep::parse(DEP)
            .unwrap()
            .load_plan(wanted, &builtin)
            .unwrap()
    }

    #[test]
    fn dashes_and_underscores_are_the_same_name() {
        assert_eq!(normalise("aesni-intel"), "aesni_intel");
        assert_eq!(
            name_of("kernel/arch/x86/crypto/ghash-clmulni-intel.ko"),
            "ghash_clmulni_intel"
        );
        assert_eq!(name_of("kernel/lib/crc64-rocksoft.ko.xz"), "crc64_rocksoft");
        // Asked for with either spelling, the file with the other one is found.
        assert_eq!(
            plan(&["crc64_rocksoft"]).order.last().unwrap(),
            "kernel/lib/crc64-rocksoft.ko"
        );
        assert_eq!(
            plan(&["aesni_intel"]).order.last().unwrap(),
            "kernel/arch/x86/crypto/aesni-intel.ko"
        );
    }

    #[test]
    fn dependencies_load_first_and_once() {
        let order = plan(&[
            "algif_skcipher",
            "aesni-intel",
            "af_alg",
            "virtio_crypto",
            "virtio",
        ])
        .order;
        assert_eq!(
            order,
            [
                "kernel/crypto/af_alg.ko",
                "kernel/crypto/algif_skcipher.ko",
                "kernel/crypto/cryptd.ko",
                "kernel/crypto/crypto_simd.ko",
                "kernel/arch/x86/crypto/aesni-intel.ko",
                "kernel/crypto/crypto_engine.ko",
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/crypto/virtio/virtio_crypto.ko",
            ]
        );
    }

    #[test]
    fn modules_missing_from_modules_dep_are_skipped_with_a_reason() {
        let plan = plan(&["cbc", "af_alg", "no_such_module"]);
        assert_eq!(plan.order, ["kernel/crypto/af_alg.ko"]);
        assert_eq!(
            plan.skipped,
            [
                Skipped::BuiltIn("cbc".into()),
                Skipped::Unknown("no_such_module".into())
            ]
        );
    }

    #[test]
    fn the_vfio_modules_load_after_their_dependencies_and_the_common_ones() {
        let dep = ModulesDep::parse(DEP).unwrap();
        let builtin = BTreeSet::new();
        // The common list already loaded virtio (and vfio, to show it is left out).
        let common = dep.load_plan(&["virtio_crypto", "vfio"], &builtin).unwrap();
        let vfio = dep
            .load_plan_after(&common.order, VFIO_MODULES, &builtin)
            .unwrap();
        assert_eq!(
            vfio.order,
            [
                "kernel/drivers/vfio/vfio_iommu_type1.ko",
                "kernel/drivers/vfio/vfio_virqfd.ko",
                "kernel/virt/lib/irqbypass.ko",
                "kernel/drivers/vfio/pci/vfio-pci-core.ko",
                "kernel/drivers/vfio/pci/vfio-pci.ko",
            ]
        );
        assert!(vfio.skipped.is_empty());
        assert_eq!(run_modules(RunKind::Plain), &[] as &[&str]);
        assert_eq!(run_modules(RunKind::Vfio), VFIO_MODULES);
    }

    #[test]
    fn a_dependency_cycle_is_an_error() {
        let dep = "a.ko: b.ko\nb.ko: a.ko\n";
        let error = ModulesDep::parse(dep)
            .unwrap()
            .load_plan(&["a"], &BTreeSet::new())
            .unwrap_err();
        assert!(error.to_string().contains("cycle"), "{error}");
    }

    #[test]
    fn a_malformed_line_is_an_error() {
        assert!(ModulesDep::parse("kernel/crypto/af_alg.ko\n").is_err());
    }

    #[test]
    fn the_guest_list_is_planned_from_a_real_modules_dep_when_present() {
        // Only on hosts with Debian's kernel: the list must resolve there.
        let Ok(release) =
            fs::read_dir(crate::tools::MODULES_ROOT).and_then(|mut d| d.next().transpose())
        else {
            return;
        };
        let Some(dir) = release
            .map(|e| e.path())
            .filter(|d| d.join("modules.dep").is_file())
        else {
            return;
        };
        let guest = plan_for(&dir).unwrap();
        let plan = &guest.common;
        assert!(
            plan.order.iter().any(|p| name_of(p) == "af_alg"),
            "{plan:?}"
        );
        // The virtio run's own: crypto_user, for libkcapi's peer.
        let (run, virtio) = &guest.runs[0];
        assert_eq!(*run, RunKind::Virtio);
        assert!(
            virtio.order.iter().any(|p| name_of(p) == "crypto_user"),
            "{virtio:?}"
        );
        // The vfio run's own modules: dependencies first, none of the common ones.
        let (run, vfio) = &guest.runs[1];
        assert_eq!(*run, RunKind::Vfio);
        let names: Vec<String> = vfio.order.iter().map(|p| name_of(p)).collect();
        let at = |name: &str| names.iter().position(|n| n == name);
        if let (Some(bypass), Some(core), Some(pci)) =
            (at("irqbypass"), at("vfio_pci_core"), at("vfio_pci"))
        {
            assert!(bypass < core && core < pci, "{names:?}");
            assert!(at("vfio") < Some(core), "{names:?}");
        }
        assert!(
            !vfio.order.iter().any(|p| plan.order.contains(p)),
            "{guest:?}"
        );
        let virtio_crypto = plan
            .order
            .iter()
            .position(|p| name_of(p) == "virtio_crypto");
        let virtio = plan.order.iter().position(|p| name_of(p) == "virtio");
        if let (Some(driver), Some(bus)) = (virtio_crypto, virtio) {
            assert!(bus < driver, "{plan:?}");
        }
    }
}
