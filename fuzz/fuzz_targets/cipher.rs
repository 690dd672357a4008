#![no_main]
//! See `crypto_offload_fuzz::cipher`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: crypto_offload_fuzz::cipher::Input| {
    crypto_offload_fuzz::cipher::check(crypto_offload_fuzz::harness(), &input);
});
