//! Records the optimisation level this crate is built at, so that a debug
//! build of a dependent project can say that its CRCs and AES run ~50x
//! slower than they will in release (`choice::OPT_LEVEL`).

fn main() {
    let level = std::env::var("OPT_LEVEL").unwrap_or_default();
    println!("cargo:rustc-env=CRYPTO_OFFLOAD_FALLBACK_OPT_LEVEL={level}");
    println!("cargo:rerun-if-changed=build.rs");
}
