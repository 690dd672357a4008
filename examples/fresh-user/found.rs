//! What `Offload::discover()` finds in a new user's project built with
//! crypto-offload's default features: every kind of engine it looked for,
//! the backends that joined; exits 1 if no AF_ALG engine joined (the
//! guest's virtio run has one: `af-alg:virtio_crypto`).

#[tokio::main]
async fn main() {
    let offload = crypto_offload::Offload::discover()
        .await
        .expect("discover");
    for search in offload.discovery() {
        println!("{search}");
    }
    let names: Vec<String> = offload.backends().into_iter().map(|b| b.name).collect();
    println!("backends: {}", names.join(", "));
    if !names.iter().any(|n| n.starts_with("af-alg:")) {
        eprintln!("no AF_ALG engine joined with the default features");
        std::process::exit(1);
    }
}
