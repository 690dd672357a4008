//! Where a request runs.
//!
//! The rule today is fixed and stated plainly: a session whose `Offload`
//! pins a backend ([`OffloadBuilder::pin`](crate::OffloadBuilder::pin))
//! sends every request there (and replays on the CPU what that backend
//! fails); otherwise every request runs inline on the CPU. This function is
//! the one place that decides, so the cost-model selector (predicted
//! completion time, CPU time and queueing per backend, measured per machine)
//! replaces it without touching the sessions.

/// Where one request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Inline on the calling task, on the CPU.
    Cpu,
    /// The session's context on its pinned backend.
    Engine,
}

/// The route of a request of a session that has (or lacks) an engine context.
#[inline]
pub(crate) fn route(has_engine: bool) -> Route {
    if has_engine {
        Route::Engine
    } else {
        Route::Cpu
    }
}
