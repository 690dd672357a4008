#![no_main]
//! The VFIO virtio-crypto driver's queues with the fuzzer playing the
//! device: it writes the used ring (ids, lengths, index jumps, duplicates,
//! values out of range) and the configuration (`max_size`, queue sizes)
//! while requests are submitted, dropped and drained, over plain memory.
//! The invariants are checked by `crypto_offload_vfio::harness::run`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    crypto_offload_vfio::harness::run(data);
});
