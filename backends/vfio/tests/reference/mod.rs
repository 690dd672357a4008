//! The CPU's result for a request, from the fallback crate: what the
//! device must match. Shared by the guest tests and the driver's host
//! tests over the emulated device (`src/device/tests.rs`), each of which
//! has `CipherAlgo` in scope.

use crypto_offload_fallback as fb;

use super::CipherAlgo;

/// The fallback's result.
pub(crate) fn reference(algo: CipherAlgo, encrypt: bool, key: &[u8], iv: &[u8], data: &mut [u8]) {
    let iv16: [u8; 16] = iv.try_into().unwrap_or([0; 16]);
    match algo {
        CipherAlgo::AesEcb => {
            let c = fb::Cbc::new(key).unwrap();
            for block in data.chunks_mut(16) {
                if encrypt {
                    c.encrypt(&[0; 16], block).unwrap();
                } else {
                    c.decrypt(&[0; 16], block).unwrap();
                }
            }
        }
        CipherAlgo::AesCbc => {
            let c = fb::Cbc::new(key).unwrap();
            if encrypt {
                c.encrypt(&iv16, data).unwrap();
            } else {
                c.decrypt(&iv16, data).unwrap();
            }
        }
        CipherAlgo::AesCtr => fb::Ctr::new(key)
            .unwrap()
            .apply_keystream(&iv16, data)
            .unwrap(),
        CipherAlgo::AesXts => {
            let x = fb::Xts::new(key).unwrap();
            if encrypt {
                x.encrypt(&iv16, data).unwrap();
            } else {
                x.decrypt(&iv16, data).unwrap();
            }
        }
    }
}
