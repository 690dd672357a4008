#![no_main]
//! See `crypto_offload_fuzz::xts`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: crypto_offload_fuzz::xts::Input| {
    crypto_offload_fuzz::xts::check(&input);
});
