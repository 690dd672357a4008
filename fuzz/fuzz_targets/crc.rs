#![no_main]
//! See `crypto_offload_fuzz::crc`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: crypto_offload_fuzz::crc::Input| {
    crypto_offload_fuzz::crc::check(crypto_offload_fuzz::harness(), &input);
});
