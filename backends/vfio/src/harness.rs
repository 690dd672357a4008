//! The driver's queue code with the device played by arbitrary input: the
//! fuzz target `fuzz/fuzz_targets/virtqueue.rs` and this crate's own
//! property test feed bytes to [`run`], which decodes from them a device
//! configuration and a sequence of steps — requests submitted (single and
//! bursts, more than the ring holds), callers going away, the device
//! fetching requests and writing its used ring (right, or with any id,
//! length, index jump or duplicate), drains, failures — over plain memory,
//! and checks after every step what must always hold:
//!
//! * no panic, whatever the device writes;
//! * every caller that gets a completion gets its own buffer, and only
//!   once; a caller whose request is lost is never left waiting: it is
//!   either completed or told the device failed;
//! * every chain the driver has in the ring points at memory a request
//!   still holds (never freed or handed to another while a chain names
//!   it), and the ring's busy descriptors are exactly those chains';
//! * a device that writes an entry no driver could accept (an id past the
//!   ring, an index more than a ring ahead) is declared broken, and one
//!   that only completes what it was given is not;
//! * at the end every DMA unit is back, but for memory parked because the
//!   device failed with it.
//!
//! The same for the configuration: [`Limits::of`] and
//! `limits::queue_size` take any `max_size` and queue size without a
//! panic, and what they accept is usable.
//!
//! [`Limits::of`]: crate::Limits::of

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::device_ring::DeviceRing;
use crate::dma::{DmaBuf, DmaPool};
use crate::error::Error;
use crate::limits::{self, DATA_CHAIN, Limits};
use crate::protocol::{CipherAlgo, DeviceConfig};
use crate::queue::{Burst, Host, Pending, Queue, Ticket};
use crate::request::{Chain, DmaRequest, Layout};
use crate::session::next_iv;
use crate::virtqueue::{Segment, SplitQueue};

/// The bytes a fuzz input is read from; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn byte(&mut self) -> u8 {
        self.u8().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// The device's host as the harness plays it: takes requests until the
/// device is declared broken, then parks what it is handed.
#[derive(Default)]
struct FuzzHost {
    broken: Mutex<Option<String>>,
    parked: Mutex<Vec<DmaBuf>>,
}

impl Host for FuzzHost {
    fn accepting(&self) -> Result<(), Error> {
        match &*self.broken.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(Error::Broken(why.clone())),
            None => Ok(()),
        }
    }
    fn notify(&self, _q: &Queue) -> Result<(), Error> {
        Ok(())
    }
    fn broken(&self, q: &Queue, error: Error, orphans: Vec<DmaBuf>) {
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.extend(orphans);
        parked.extend(q.fail_all());
    }
}

type Enqueue = Pin<Box<dyn Future<Output = Result<Submitted, Error>>>>;

/// What a submission turns into once the ring took it.
enum Submitted {
    One(Ticket<Arc<Queue>>),
    Burst(Arc<Burst>),
}

/// A caller: its tags (one per request) and where it stands.
struct Caller {
    tags: Vec<u64>,
    state: CallerState,
}

enum CallerState {
    /// Waiting for room in the ring.
    Waiting(Enqueue),
    /// In the ring.
    Submitted(Submitted),
}

/// The harness: a queue, its host, and the device's side.
struct Harness {
    pool: Arc<DmaPool>,
    queue: Arc<Queue>,
    host: Arc<FuzzHost>,
    device: DeviceRing,
    /// DMA units in use with no request in flight (the ring itself).
    idle_units: usize,
    callers: Vec<Caller>,
    next_tag: u64,
    /// Heads the device fetched and has not completed.
    fetched: Vec<u16>,
    /// Heads it completed (for duplicates).
    completed: Vec<u16>,
    /// The device wrote only completions of what it fetched, once each.
    honest: bool,
    /// The device wrote something no driver could accept.
    lied: bool,
    /// The harness failed the queue itself (a reset).
    reset: bool,
    /// Requests the ring took, and callers answered with their buffers.
    submitted: u64,
    answered: u64,
}

impl Harness {
    fn new(size: u16, indirect: bool) -> Result<Harness, Error> {
        // Small enough that a run fills it (submissions then wait or are
        // skipped), and cheap to map for every input.
        let pool = Arc::new(DmaPool::unmapped(256 << 10)?);
        let mem = pool
            .try_alloc(SplitQueue::bytes(size))?
            .ok_or_else(|| Error::Device("no room for the ring".into()))?;
        let mut ring = SplitQueue::new(mem, size)?;
        ring.set_indirect(indirect);
        let device = DeviceRing::new(pool.clone(), size, ring.addresses());
        let idle_units = pool.units_in_use();
        Ok(Harness {
            pool,
            queue: Arc::new(Queue::new(0, 0, ring)),
            host: Arc::new(FuzzHost::default()),
            device,
            idle_units,
            callers: Vec::new(),
            next_tag: 1,
            fetched: Vec::new(),
            completed: Vec::new(),
            honest: true,
            lied: false,
            reset: false,
            submitted: 0,
            answered: 0,
        })
    }

    fn is_broken(&self) -> bool {
        self.host
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// A buffer of `len` bytes carrying `tag` in its first 8.
    fn tagged(&mut self, len: usize) -> Option<(DmaBuf, u64)> {
        let buf = self.pool.try_alloc(len.max(8)).ok()??;
        let tag = self.next_tag;
        self.next_tag += 1;
        buf.write_u64(0, tag).ok()?;
        Some((buf, tag))
    }

    /// A single request of `segments` segments (1–5) in one buffer.
    fn submit_one(&mut self, segments: usize, table: bool) {
        let Some((buf, tag)) = self.tagged(256) else {
            return;
        };
        let segs: Vec<Segment> = (0..segments)
            .map(|i| buf.segment(8 + 16 * i, 16, i + 1 == segments))
            .collect();
        let Ok(chain) = Chain::new(&segs) else {
            return;
        };
        let table = if table {
            // The chain written as an indirect table at 128 (room for 5).
            if crate::virtqueue::write_table(&buf, 128, chain.segments()).is_err() {
                return;
            }
            Some(buf.iova(128))
        } else {
            None
        };
        let (q, host) = (self.queue.clone(), self.host.clone());
        let fut: Enqueue = Box::pin(async move {
            let ticket = q
                .enqueue_one(&*host, &mut Some(buf), chain, table, None, None)
                .await?;
            Ok(Submitted::One(ticket.rehome(q.clone())))
        });
        self.callers.push(Caller {
            tags: vec![tag],
            state: CallerState::Waiting(fut),
        });
    }

    /// A burst of `n` prepared requests.
    fn submit_burst(&mut self, n: usize) {
        let mut requests = Vec::new();
        let mut tags = Vec::new();
        for _ in 0..n {
            let Some((dma, tag)) = self.tagged(512) else {
                break;
            };
            let layout = Layout::new(CipherAlgo::AesCbc, 16);
            let Ok(chain) = layout.write_chain(&dma, 16) else {
                return;
            };
            tags.push(tag);
            requests.push(DmaRequest {
                dma,
                chain,
                session: 1,
                encrypt: true,
                layout,
                iv_len: 16,
                status: None,
            });
        }
        if requests.is_empty() {
            return;
        }
        let burst = Arc::new(Burst::new(requests));
        let (q, host) = (self.queue.clone(), self.host.clone());
        let fut: Enqueue = Box::pin(async move {
            q.enqueue_burst(&*host, &burst)
                .await
                .map(|()| Submitted::Burst(burst))
        });
        self.callers.push(Caller {
            tags,
            state: CallerState::Waiting(fut),
        });
    }

    /// Polls every caller waiting for room once; checks every completed
    /// caller got its own buffers.
    fn poll(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        // Read when a failure is seen, not before: polling a caller that
        // waits for room drains the ring, which may find the device broken.
        let host = self.host.clone();
        let broken = || {
            host.broken
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
        };
        let (mut submitted, mut answered) = (0, 0);
        self.callers.retain_mut(|caller| {
            if let CallerState::Waiting(fut) = &mut caller.state {
                match fut.as_mut().poll(&mut cx) {
                    Poll::Pending => return true,
                    Poll::Ready(Ok(s)) => {
                        submitted += caller.tags.len() as u64;
                        caller.state = CallerState::Submitted(s);
                    }
                    // Refused (the device failed): the caller is told.
                    Poll::Ready(Err(_)) => return false,
                }
            }
            let CallerState::Submitted(s) = &mut caller.state else {
                return true;
            };
            match s {
                Submitted::One(ticket) => match ticket.try_take() {
                    Some(Ok((buf, _len))) => {
                        assert_eq!(
                            buf.read_u64(0).ok(),
                            Some(caller.tags[0]),
                            "a completion went to the wrong caller"
                        );
                        answered += 1;
                        false
                    }
                    None => true,
                    Some(Err(())) => {
                        assert!(broken(), "a request was dropped with the device working");
                        false
                    }
                },
                Submitted::Burst(burst) => match burst.finished() {
                    Ok(true) => {
                        let back = burst.take();
                        let tags: Vec<u64> =
                            back.iter().filter_map(|r| r.dma.read_u64(0).ok()).collect();
                        assert_eq!(tags, caller.tags, "a burst got other requests back");
                        answered += tags.len() as u64;
                        false
                    }
                    Ok(false) => true,
                    Err(_) => {
                        assert!(broken(), "a burst failed with the device working");
                        false
                    }
                },
            }
        });
        self.submitted += submitted;
        self.answered += answered;
    }

    /// The device takes every request made available so far.
    fn fetch(&mut self) {
        while let Ok(Some(head)) = self.device.pop_avail() {
            self.fetched.push(head);
        }
    }

    /// The device completes fetched request `pick` (as it must).
    fn complete(&mut self, pick: usize, len: u32) {
        if self.fetched.is_empty() {
            return;
        }
        let head = self.fetched.swap_remove(pick % self.fetched.len());
        if self.device.push_used(u32::from(head), len).is_ok() {
            self.completed.push(head);
        }
    }

    /// The device writes used entry `at` (relative to its index) and moves
    /// its index by `delta`, whatever they say.
    fn write_raw(&mut self, at: u16, id: u32, len: u32, delta: u16) {
        let Ok(idx) = self.device.used_idx() else {
            return;
        };
        let size = self.device.size();
        let _ = self.device.write_used_entry(idx.wrapping_add(at), id, len);
        let _ = self.device.set_used_idx(idx.wrapping_add(delta));
        self.honest = false;
        // Unambiguous lies: an id past the ring in an entry the index
        // announces, or an index more than a ring ahead. The driver looks
        // now (before a later write could cover the entry): it must stop
        // trusting the device — at this entry or at an earlier one.
        if (id >= u32::from(size) && at < delta) || delta > size {
            self.lied = true;
            self.queue.drain(&*self.host);
            assert!(self.is_broken(), "a device that wrote nonsense was trusted");
        }
    }

    /// The device completes a head it completed before, again.
    fn duplicate(&mut self, pick: usize) {
        if let Some(&head) = self.completed.get(pick % self.completed.len().max(1)) {
            let _ = self.device.push_used(u32::from(head), 0);
            self.honest = false;
        }
    }

    /// A caller goes away (its future or receiver dropped).
    fn drop_caller(&mut self, pick: usize) {
        if !self.callers.is_empty() {
            let i = pick % self.callers.len();
            self.callers.swap_remove(i);
        }
    }

    /// What must hold after every step.
    fn check(&self) {
        let state = self.queue.lock();
        if self.is_broken() {
            assert!(
                state.pending.is_empty(),
                "a broken device still holds requests"
            );
            return;
        }
        let mut busy = 0;
        for head in 0..state.ring.size() {
            let Some(chain) = state.ring.chain_of(head) else {
                assert!(!state.pending.contains(head), "a request with no chain");
                continue;
            };
            let Some(Some(owner)) = state.pending.slots.get(usize::from(head)) else {
                panic!("a chain owned by no request: {head}");
            };
            busy += chain.len();
            // The memory the request owning the chain holds: the chain may
            // point nowhere else (not at another request's memory, even if
            // that is allocated too).
            let owned: Vec<(u64, u64)> = match owner {
                Pending::One { buf, .. } => vec![(buf.iova(0), buf.iova(0) + buf.len() as u64)],
                Pending::Burst(burst) => burst.with_requests(|rs| {
                    rs.iter()
                        .map(|r| (r.dma.iova(0), r.dma.iova(0) + r.dma.len() as u64))
                        .collect()
                }),
            };
            let inside = |addr: u64, len: u32| {
                owned
                    .iter()
                    .any(|&(lo, hi)| addr >= lo && addr + u64::from(len) <= hi)
                    && self.pool.is_allocated(addr, len as usize)
            };
            let first = self.device.head_desc(head).expect("a head in the ring");
            if first.flags & crate::device_ring::DESC_F_INDIRECT != 0 {
                assert!(
                    inside(first.addr, first.len),
                    "chain {head}'s table is not its request's"
                );
            }
            let seen = self
                .device
                .chain(head)
                .expect("the driver's chain is well formed");
            for d in seen {
                assert!(
                    inside(d.addr, d.len),
                    "chain {head} points outside its request's memory"
                );
            }
        }
        assert_eq!(busy, state.ring.busy_descriptors(), "descriptors lost");
        assert_eq!(state.pending.len(), state.ring.chains_in_flight());
    }

    /// Ends the run: an honest device completes what is left; then every
    /// caller is answered and every unit is back (but for what is parked).
    fn finish(&mut self) {
        // Until every caller is answered, or a round makes no progress.
        let mut stalled = 0;
        while !self.callers.is_empty() && stalled < 3 {
            let progress = |h: &Self| {
                (
                    h.callers.len(),
                    h.submitted,
                    h.answered,
                    h.device.used_idx().ok(),
                )
            };
            let before = progress(self);
            self.fetch();
            while !self.fetched.is_empty() && !self.is_broken() {
                self.complete(0, 0);
            }
            self.queue.drain(&*self.host);
            self.poll();
            self.check();
            let after = progress(self);
            stalled = if after == before { stalled + 1 } else { 0 };
        }
        if self.lied {
            assert!(
                self.is_broken(),
                "a device that wrote nonsense was not declared broken"
            );
        }
        if self.honest && !self.reset {
            assert!(!self.is_broken(), "an honest device was declared broken");
            assert!(
                self.callers.is_empty(),
                "callers left waiting on an honest device"
            );
        }
        self.callers.clear();
        let parked: usize = self
            .host
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|b| b.len() / crate::dma::UNIT)
            .sum();
        let state = self.queue.lock();
        if !self.is_broken() {
            // A dishonest device may still hold requests it never completed.
            let held: usize = (0..state.ring.size())
                .filter(|&h| state.pending.contains(h))
                .count();
            if held > 0 {
                return;
            }
        }
        assert_eq!(
            state.tickets.in_use(),
            0,
            "a ticket outlived its caller and its request"
        );
        drop(state);
        assert_eq!(
            self.pool.units_in_use(),
            self.idle_units + parked,
            "DMA memory leaked or freed while parked"
        );
    }
}

/// The configuration half: what [`Limits::of`] and
/// [`limits::queue_size`] make of any values.
fn config(input: &mut Input<'_>) -> Option<(u16, bool)> {
    let max_size = input.u64();
    let config = DeviceConfig {
        max_size,
        ..DeviceConfig::default()
    };
    match Limits::of(&config) {
        Ok(l) => {
            let max = l.max_request;
            assert!(max >= 16 && max.is_multiple_of(16) && max <= limits::MAX_REQUEST);
            assert!(max as u64 <= max_size);
            // A long CBC request in such pieces chains its IV without a
            // panic, and the pieces cover it.
            let data = vec![0u8; 3 * max + 16];
            let mut iv = [0u8; 16];
            let mut covered = 0;
            for piece in data.chunks(max) {
                next_iv(CipherAlgo::AesCbc, true, &mut iv, piece, piece);
                next_iv(CipherAlgo::AesCtr, true, &mut iv, piece, piece);
                covered += piece.len();
            }
            assert_eq!(covered, data.len());
        }
        Err(_) => assert!(max_size < 16),
    }
    let offered = input.u16();
    let indirect = input.byte() & 1 == 1;
    let longest = if indirect { 1 } else { DATA_CHAIN };
    let size = limits::queue_size(0, offered, longest).ok()?;
    assert!(size.is_power_of_two() && size <= offered && usize::from(size) >= longest);
    // Small rings reach "full" often; large ones are slow to fill.
    Some((size.min(64), indirect))
}

/// What one run did (for tests that check a run reached what it meant
/// to).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The ring's size (0: the configuration was refused).
    pub ring: u16,
    /// Requests the ring took.
    pub submitted: u64,
    /// Callers answered with their buffers.
    pub completed: u64,
    /// Whether the device was declared broken.
    pub broken: bool,
}

/// Runs one fuzz input (see the module docs for what it checks).
///
/// # Panics
/// When an invariant breaks: that is the finding.
pub fn run(data: &[u8]) -> Report {
    let mut input = Input(data);
    let Some((size, indirect)) = config(&mut input) else {
        return Report::default();
    };
    let Ok(mut h) = Harness::new(size, indirect) else {
        return Report::default();
    };
    let mut steps = 0;
    while let Some(op) = input.u8() {
        steps += 1;
        if steps > 512 {
            break;
        }
        match op % 12 {
            0..=2 => {
                let segments = 1 + usize::from(input.byte()) % 5;
                let table = input.byte() & 1 == 1;
                h.submit_one(segments, table);
            }
            3 => {
                let n = 1 + usize::from(input.byte()) % 16;
                h.submit_burst(n);
            }
            4 | 5 => {
                h.fetch();
                let pick = usize::from(input.byte());
                let len = u32::from(input.byte());
                h.complete(pick, len);
            }
            6 => {
                let at = u16::from(input.byte() % 4);
                let id = input.u32();
                let len = input.u32();
                let delta = input.u16() % 0x0500;
                h.write_raw(at, id, len, delta);
            }
            7 => h.duplicate(usize::from(input.byte())),
            8 => h.drop_caller(usize::from(input.byte())),
            9 => {
                let orphans = h.queue.fail_all();
                h.host
                    .parked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(orphans);
                *h.host.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some("reset".into());
                h.reset = true;
            }
            _ => {
                h.queue.drain(&*h.host);
            }
        }
        h.poll();
        h.check();
    }
    h.finish();
    Report {
        ring: size,
        submitted: h.submitted,
        completed: h.answered,
        broken: h.is_broken(),
    }
}

/// Hand-written inputs that reach the interesting paths — an honest device
/// under overload (a full ring, completions out of order, a burst), and
/// each kind of unambiguous lie — for the fuzz corpus and the tests.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let header = |max_size: u64, offered: u16, indirect: bool| {
        let mut v = max_size.to_le_bytes().to_vec();
        v.extend(offered.to_le_bytes());
        v.push(u8::from(indirect));
        v
    };
    // A ring of 8 without indirect tables: 40 single requests of 1–5
    // segments and a burst of 16, completed in a scrambled order.
    let mut overload = header(u64::MAX, 8, false);
    for i in 0..40u8 {
        overload.extend([0, i % 5, i & 1]);
    }
    overload.extend([3, 15]);
    for i in 0..200u8 {
        overload.extend([4, i.wrapping_mul(7), 16, 10]);
    }
    // Two requests, one completed; then entry 0 names descriptor 999.
    let mut past_the_ring = header(4096, 16, true);
    past_the_ring.extend([0, 0, 1, 0, 1, 0, 4, 0, 16]);
    past_the_ring.extend([6, 0]);
    past_the_ring.extend(999u32.to_le_bytes());
    past_the_ring.extend(0u32.to_le_bytes());
    past_the_ring.extend(1u16.to_le_bytes());
    past_the_ring.push(10);
    // One request; the used index jumps 17 ahead on a ring of 16.
    let mut index_jump = header(4096, 16, true);
    index_jump.extend([0, 0, 1, 10]);
    index_jump.extend([6, 0]);
    index_jump.extend(0u32.to_le_bytes());
    index_jump.extend(0u32.to_le_bytes());
    index_jump.extend(17u16.to_le_bytes());
    index_jump.push(10);
    // Three requests, one completed twice, callers dropped, a reset.
    let mut duplicate = header(100, 4, true);
    duplicate.extend([
        0, 2, 1, 0, 0, 0, 0, 1, 1, 4, 0, 0, 10, 7, 0, 10, 8, 1, 9, 10,
    ]);
    vec![
        ("overload", overload),
        ("past-the-ring", past_the_ring),
        ("index-jump", index_jump),
        ("duplicate", duplicate),
    ]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn header(max_size: u64, offered: u16, indirect: bool) -> Vec<u8> {
        let mut v = max_size.to_le_bytes().to_vec();
        v.extend(offered.to_le_bytes());
        v.push(u8::from(indirect));
        v
    }

    fn seed(name: &str) -> Vec<u8> {
        seeds().into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn an_honest_device_under_overload_completes_everything() {
        let r = run(&seed("overload"));
        assert_eq!(
            (r.ring, r.submitted, r.completed, r.broken),
            (8, 56, 56, false)
        );
    }

    #[test]
    fn a_device_that_names_a_descriptor_past_the_ring_is_declared_broken() {
        let r = run(&seed("past-the-ring"));
        assert!(r.broken && r.submitted == 2 && r.completed == 1, "{r:?}");
    }

    #[test]
    fn a_used_index_a_ring_ahead_is_declared_broken() {
        let r = run(&seed("index-jump"));
        assert!(r.broken && r.submitted == 1, "{r:?}");
    }

    #[test]
    fn a_duplicate_completion_and_a_reset_keep_the_invariants() {
        let r = run(&seed("duplicate"));
        assert!(r.ring == 4 && r.submitted >= 2, "{r:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        #[test]
        fn any_device_behaviour_keeps_the_invariants(
            data in prop::collection::vec(any::<u8>(), 0..600)
        ) {
            run(&data);
        }

        /// Mostly honest devices (the steps biased to submitting and
        /// completing), so that runs reach full rings and completions.
        #[test]
        fn busy_honest_devices_answer_every_caller(
            ring in 0u16..200,
            steps in prop::collection::vec((0u8..6, any::<u8>(), any::<u8>(), any::<u8>()), 0..300)
        ) {
            let mut data = header(u64::MAX, ring, ring % 2 == 0);
            for (op, a, b, c) in steps {
                // Each step as many bytes as it reads.
                match op {
                    0..=2 => data.extend([op, a, b]),
                    3 => data.extend([op, a]),
                    _ => data.extend([op, a, c]),
                }
            }
            let r = run(&data);
            prop_assert!(!r.broken);
            prop_assert!(r.completed <= r.submitted);
        }
    }
}
