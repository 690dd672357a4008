//! A stream's requests in flight, completed in any order, handed out in
//! the order they were sent.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::collections::VecDeque;
use std::io;

use crate::error::RequestError;

/// One request of a stream: a `'static` future (it owns an `Arc` of its
/// session), boxed once per chunk (tens of KiB), which is noise beside the
/// chunk's work.
pub(super) type Running =
    Pin<Box<dyn Future<Output = Result<Vec<u8>, RequestError<Vec<u8>>>> + Send>>;

/// A request's output, and how many bytes at its front are not the
/// stream's (a CTR chunk that starts inside a counter block is padded to
/// the block's start).
pub(super) struct Chunk {
    pub(super) buf: Vec<u8>,
    pub(super) skip: usize,
}

enum Slot {
    Running(Running, usize),
    Done(io::Result<Vec<u8>>, usize),
}

/// Requests in flight, oldest first.
#[derive(Default)]
pub(super) struct Queue {
    slots: VecDeque<Slot>,
}

impl Queue {
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Drops every request (a stream that failed).
    pub(super) fn clear(&mut self) {
        self.slots.clear();
    }

    pub(super) fn push(&mut self, request: Running, skip: usize) {
        self.slots.push_back(Slot::Running(request, skip));
    }

    /// Polls every request still running: a request is sent to its engine
    /// on its first poll, so each must be polled, not only the oldest. The
    /// waker is registered with each one still running.
    pub(super) fn poll_all(&mut self, cx: &mut Context<'_>) {
        for slot in &mut self.slots {
            if let Slot::Running(request, skip) = slot
                && let Poll::Ready(out) = request.as_mut().poll(cx)
            {
                *slot = Slot::Done(out.map_err(io::Error::from), *skip);
            }
        }
    }

    /// [`poll_all`](Self::poll_all), then the oldest request if it is done:
    /// `Ready(None)` when nothing is in flight, `Pending` while the oldest
    /// runs.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Chunk>>> {
        self.poll_all(cx);
        if let Some(Slot::Done(..)) = self.slots.front()
            && let Some(Slot::Done(out, skip)) = self.slots.pop_front()
        {
            return Poll::Ready(Some(out.map(|buf| Chunk { buf, skip })));
        }
        if self.slots.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}
