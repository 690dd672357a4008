//! The contenders of a cipher group compute the same function: run once on
//! the same bytes, every one leaves the same ciphertext (a peer timed on a
//! different tweak convention or key would not be a peer). The CRCs'
//! agreement is the fallback's differential tests' job.

use crypto_offload_benches::contenders::groups;
use crypto_offload_benches::data;
use crypto_offload_benches::report::NOT_PEERS;

#[test]
fn every_cipher_contender_leaves_the_same_bytes() {
    let mut checked = 0;
    for mut g in groups().into_iter().filter(|g| !g.name.starts_with("crc")) {
        for size in [16, 64, 1024, 4096, 8192] {
            let mut first: Option<(String, Vec<u8>)> = None;
            for c in g
                .contenders
                .iter_mut()
                .filter(|c| !NOT_PEERS.contains(&c.name.as_str()))
            {
                let mut buf = data(size);
                c.run(&mut buf, 1);
                assert_ne!(
                    buf,
                    data(size),
                    "{} {} left {size} B as they were",
                    g.name,
                    c.name
                );
                match &first {
                    None => first = Some((c.name.clone(), buf)),
                    Some((name, want)) => {
                        assert!(
                            *want == buf,
                            "{} at {size} B: {} and {name} differ",
                            g.name,
                            c.name
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} comparisons");
}
