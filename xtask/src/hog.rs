//! A bounded CPU hog on the host, beside a guest: `--host-hog N` gives a
//! run N spinning threads that the guest switches on and off with console
//! lines (`VMTEST-HOG on`, `VMTEST-HOG off`), so that one boot measures the
//! same thing on a quiet and on a loaded host — production hosts are busy,
//! and a selector that only holds on a quiet one does not hold.
//!
//! Bounded: the threads stop at `off`, when the run ends (the hog's drop),
//! and at [`MAX_ON`] after `on` whatever the guest does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The console marker of a hog request.
pub const MARKER: &str = "VMTEST-HOG";

/// The longest the hog spins after one `on`.
pub const MAX_ON: Duration = Duration::from_secs(600);

/// What a console line asks of the hog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    On,
    Off,
}

/// The hog request on a console line, if it has one: `VMTEST-HOG on|off`
/// at the start of the line; `Err` for a malformed one.
pub fn parse_request(line: &str) -> Option<Result<Request, String>> {
    let rest = line.trim().strip_prefix(MARKER)?;
    Some(match rest.trim() {
        "on" => Ok(Request::On),
        "off" => Ok(Request::Off),
        other => Err(format!("{MARKER} {other:?}: expected on or off")),
    })
}

/// N spinning threads, off until switched on.
#[derive(Debug)]
pub struct Hog {
    threads: usize,
    running: Option<(Arc<AtomicBool>, Vec<JoinHandle<u64>>)>,
}

impl Hog {
    /// A hog of `threads` threads (none spin yet).
    pub fn new(threads: usize) -> Hog {
        Hog {
            threads,
            running: None,
        }
    }

    /// Its threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether it spins.
    pub fn is_on(&self) -> bool {
        self.running.is_some()
    }

    /// Starts the threads (if they are not running): each spins until
    /// [`Hog::off`], the drop, or [`MAX_ON`].
    pub fn on(&mut self) {
        if self.running.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..self.threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let until = Instant::now() + MAX_ON;
                    let mut spins = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Work the optimiser keeps, then a look at the clock
                        // every so often.
                        for _ in 0..100_000 {
                            spins = std::hint::black_box(spins.wrapping_mul(31).wrapping_add(7));
                        }
                        if Instant::now() >= until {
                            break;
                        }
                    }
                    spins
                })
            })
            .collect();
        self.running = Some((stop, handles));
    }

    /// Stops the threads and waits for them.
    pub fn off(&mut self) {
        if let Some((stop, handles)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            for h in handles {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.off();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_off_console_lines() {
        assert_eq!(parse_request("VMTEST-HOG on"), Some(Ok(Request::On)));
        assert_eq!(parse_request("VMTEST-HOG off\r"), Some(Ok(Request::Off)));
        assert!(matches!(parse_request("VMTEST-HOG maybe"), Some(Err(_))));
        assert_eq!(parse_request("VMTEST-NOTE VMTEST-HOG on"), None);
        assert_eq!(parse_request("hello"), None);
    }

    #[test]
    fn the_hog_spins_until_switched_off_or_dropped() {
        let mut hog = Hog::new(1);
        assert!(!hog.is_on());
        hog.on();
        assert!(hog.is_on());
        let spins = {
            let (_, handles) = hog.running.as_ref().unwrap();
            assert!(!handles[0].is_finished());
            handles.len()
        };
        assert_eq!(spins, 1);
        hog.off();
        assert!(!hog.is_on());
        hog.on();
        drop(hog);
    }
}
