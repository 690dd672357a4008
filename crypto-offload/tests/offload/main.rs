//! crypto-offload's integration tests, one module a subject, in one test
//! binary: each binary of its own linked the whole dependency tree again and
//! instantiated the same generic request paths, which made these twelve
//! files most of the workspace's test build (244 of 810 s of compile time;
//! see CHANGELOG). `af_alg.rs`, `vfio.rs` and `cancel.rs` stay binaries of
//! their own, as the guest runs (`cargo xtask vm-test`) and valgrind
//! (`.ci/valgrind-cancel`) run them alone; so does `load.rs`, whose
//! memory figure is the whole process's peak.
//!
//! Run one subject with a filter: `cargo test -p crypto-offload --test
//! offload bad_input::`.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod bad_input;
mod device_buf;
mod differential;
mod faults;
mod large;
mod pipeline;
mod power;
mod scenarios;
mod streams;
mod vectors;
mod vfio_emulated;
