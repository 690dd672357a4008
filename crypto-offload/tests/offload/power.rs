//! Power domains with tokio's paused clock: transitions happen per session,
//! never per request, and suspends wait out the autosuspend delay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crypto_offload::backend::{BackendError, PowerControl, PowerDomain, async_trait};

#[derive(Clone, Default)]
struct Switch {
    on: Arc<AtomicU64>,
    off: Arc<AtomicU64>,
    fail_on: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl PowerControl for Switch {
    async fn power_on(&self) -> Result<(), BackendError> {
        tokio::time::sleep(Duration::from_micros(300)).await; // resume latency
        if self.fail_on.load(Ordering::Relaxed) {
            return Err(BackendError::DeviceGone);
        }
        self.on.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    async fn power_off(&self) -> Result<(), BackendError> {
        self.off.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

const DELAY: Duration = Duration::from_millis(100);

#[tokio::test(start_paused = true)]
async fn one_session_with_many_requests_is_one_resume_and_one_suspend() {
    let sw = Switch::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    assert!(!domain.is_powered());
    let session = domain.acquire().await.unwrap();
    for _ in 0..5000 {
        let in_flight = session.clone(); // what a request holds
        tokio::time::sleep(Duration::from_micros(10)).await;
        drop(in_flight);
    }
    assert_eq!(domain.stats().resumes, 1);
    drop(session);
    // Still powered within the delay...
    tokio::time::sleep(DELAY / 2).await;
    assert!(domain.is_powered());
    // ...and suspended after it.
    tokio::time::sleep(DELAY).await;
    let s = domain.stats();
    assert_eq!(
        (s.resumes, s.suspends, s.powered, s.references),
        (1, 1, false, 0)
    );
    // (the paused clock advances timers in whole milliseconds)
    assert!(
        s.last_resume >= Duration::from_micros(300),
        "{:?}",
        s.last_resume
    );
    assert_eq!(
        (
            sw.on.load(Ordering::Relaxed),
            sw.off.load(Ordering::Relaxed)
        ),
        (1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn short_sessions_within_the_delay_share_one_resume() {
    let sw = Switch::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    for _ in 0..200 {
        let s = domain.acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(s);
        tokio::time::sleep(DELAY / 4).await; // a gap shorter than the delay
    }
    assert_eq!(domain.stats().resumes, 1);
    assert_eq!(domain.stats().suspends, 0);
    tokio::time::sleep(DELAY * 2).await;
    assert_eq!(domain.stats().suspends, 1);
    // A gap longer than the delay costs a new resume.
    drop(domain.acquire().await.unwrap());
    assert_eq!(domain.stats().resumes, 2);
}

#[tokio::test(start_paused = true)]
async fn an_in_flight_request_keeps_the_device_powered_after_the_session_drops() {
    let sw = Switch::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    let session = domain.acquire().await.unwrap();
    let request = session.clone();
    let completion = tokio::spawn(async move {
        tokio::time::sleep(DELAY * 3).await; // the device is still working
        drop(request);
    });
    drop(session);
    tokio::time::sleep(DELAY * 2).await;
    assert!(domain.is_powered(), "the request still holds a reference");
    assert_eq!(domain.stats().references, 1);
    completion.await.unwrap();
    tokio::time::sleep(DELAY + Duration::from_millis(1)).await;
    assert!(!domain.is_powered());
    assert_eq!(domain.stats().suspends, 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_first_users_resume_once() {
    let sw = Switch::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let d = domain.clone();
        tasks.push(tokio::spawn(async move { d.acquire().await.unwrap() }));
    }
    let mut refs = Vec::new();
    for t in tasks {
        refs.push(t.await.unwrap());
    }
    assert_eq!(domain.stats().resumes, 1);
    assert_eq!(domain.stats().references, 32);
    drop(refs);
    tokio::time::sleep(DELAY * 2).await;
    assert_eq!(domain.stats().suspends, 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_resume_takes_no_reference_and_is_counted() {
    let sw = Switch::default();
    sw.fail_on.store(true, Ordering::Relaxed);
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    assert!(matches!(
        domain.acquire().await,
        Err(BackendError::DeviceGone)
    ));
    let s = domain.stats();
    assert_eq!(
        (s.resumes, s.failures, s.references, s.powered),
        (0, 1, 0, false)
    );
    sw.fail_on.store(false, Ordering::Relaxed);
    let r = domain.acquire().await.unwrap();
    assert!(domain.is_powered());
    drop(r);
}

/// A switch whose transitions take 10 ms each.
#[derive(Clone, Default)]
struct Slow {
    on: Arc<AtomicU64>,
    off: Arc<AtomicU64>,
}

#[async_trait]
impl PowerControl for Slow {
    async fn power_on(&self) -> Result<(), BackendError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.on.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    async fn power_off(&self) -> Result<(), BackendError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.off.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_still_completes_the_resume() {
    let sw = Slow::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    let cancelled = tokio::time::timeout(Duration::from_millis(2), domain.acquire()).await;
    assert!(cancelled.is_err());
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The driver's power_on ran to the end and was counted; the reference
    // it took went with the cancelled future...
    let s = domain.stats();
    assert_eq!(sw.on.load(Ordering::Relaxed), 1);
    assert_eq!((s.resumes, s.powered, s.references), (1, true, 0), "{s:?}");
    // ...so the usual autosuspend follows.
    tokio::time::sleep(DELAY + Duration::from_millis(20)).await;
    let s = domain.stats();
    assert_eq!((s.suspends, s.powered), (1, false), "{s:?}");
    assert_eq!(sw.off.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_put_sync_still_suspends() {
    let sw = Slow::default();
    let domain = PowerDomain::new("dev", sw.clone(), Duration::from_secs(3600));
    let r = domain.acquire().await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(2), r.put_sync()).await;
    assert!(cancelled.is_err());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let s = domain.stats();
    assert_eq!(
        (s.suspends, s.powered, s.references),
        (1, false, 0),
        "not left on for the hour-long autosuspend: {s:?}"
    );
    assert_eq!(sw.off.load(Ordering::Relaxed), 1);
}

/// A switch that needs no runtime.
#[derive(Clone, Default)]
struct Instant(Arc<AtomicU64>);

#[async_trait]
impl PowerControl for Instant {
    async fn power_on(&self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn power_off(&self) -> Result<(), BackendError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn without_a_runtime_transitions_run_in_the_callers_future() {
    use futures::executor::block_on;
    let sw = Instant::default();
    let domain = PowerDomain::new("dev", sw.clone(), DELAY);
    let a = block_on(domain.acquire()).unwrap();
    assert_eq!(domain.stats().resumes, 1);
    // Nothing can time the autosuspend: the device stays on...
    drop(a);
    std::thread::sleep(DELAY * 2);
    assert!(domain.is_powered());
    assert_eq!(domain.stats().references, 0);
    // ...until a synchronous put.
    let b = block_on(domain.acquire()).unwrap();
    assert_eq!(domain.stats().resumes, 1, "still on: no second resume");
    block_on(b.put_sync());
    let s = domain.stats();
    assert_eq!(
        (s.suspends, s.powered, s.references),
        (1, false, 0),
        "{s:?}"
    );
    assert_eq!(sw.0.load(Ordering::Relaxed), 1);
}
