#![no_main]
//! See `crypto_offload_fuzz::lifecycle`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: crypto_offload_fuzz::lifecycle::Input| {
    crypto_offload_fuzz::lifecycle::check(&input);
});
