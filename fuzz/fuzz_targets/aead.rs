#![no_main]
//! See `crypto_offload_fuzz::aead`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: crypto_offload_fuzz::aead::Input| {
    crypto_offload_fuzz::aead::check(crypto_offload_fuzz::harness(), &input);
});
