#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod backends;
pub mod block;
pub mod latency;
pub mod lifecycle;
pub mod pattern;
pub mod record;
pub mod wire;
