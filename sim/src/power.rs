//! The simulated engine's power switch, behind a [`PowerDomain`] of its own
//! — what a third-party backend with runtime power management provides.

use std::time::Duration;

use crypto_offload::backend::async_trait;
use crypto_offload::backend::{BackendError, PowerControl, PowerDomain};

use crate::config::{SimPower, SimTimer};

/// The simulated power switch: a resume takes `resume`.
struct SimSwitch {
    resume: Duration,
    timer: SimTimer,
}

#[async_trait]
impl PowerControl for SimSwitch {
    async fn power_on(&self) -> Result<(), BackendError> {
        match self.timer {
            SimTimer::Tokio => tokio::time::sleep(self.resume).await,
            // A thread's sleep is ~60 µs precise, a tokio timer 1 ms.
            SimTimer::Device => {
                let d = self.resume;
                tokio::task::spawn_blocking(move || std::thread::sleep(d))
                    .await
                    .map_err(|e| BackendError::Other(Box::new(e)))?;
            }
        }
        Ok(())
    }
    async fn power_off(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The power domain of the engine `name`: resumes take `p.resume`; the
/// device suspends `p.autosuspend` after its last reference goes, or at
/// once in `per_request` mode (where each request's own reference is its
/// last).
pub(crate) fn domain(name: &str, p: SimPower, timer: SimTimer) -> PowerDomain {
    let delay = if p.per_request {
        Duration::ZERO
    } else {
        p.autosuspend
    };
    let switch = SimSwitch {
        resume: p.resume,
        timer,
    };
    PowerDomain::new(name.to_owned(), switch, delay)
}
