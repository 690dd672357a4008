//! The request pipeline every session's requests share: spend the task's
//! budget → validate → decide → run inline on the CPU, or send to the
//! blocking pool or an engine → poll → replay on the CPU if the engine
//! failed. An [`Operation`] says what differs between a cipher request, a
//! seal, an open and a CRC update.
//!
//! [`Request`] is a named, small future, not an `async fn`'s state machine:
//! on the inline CPU path it does the work in its first poll and moves only
//! the buffer; a request sent away is boxed (one allocation beside that
//! round trip), so that the future stays small and cheap to move.

use core::future::Future;
use core::mem;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use tokio::sync::OnceCell;
use tracing::Instrument;

use super::{BoxedRequest, Contexts, Dispatch, cpu_plan, inline_cpu, join_failed, spend_budget};
use crate::alg::Algorithm;
use crate::backend::{Failed, SharedBackend};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::error::{BackendError, Error, RequestError};
use crate::select::{Prediction, Request as Asked};
use crate::slot::{SlotId, Slots};

/// A context being opened on an engine.
pub(crate) type OpenContext<'a, C> =
    Pin<Box<dyn Future<Output = Result<Box<C>, BackendError>> + Send + 'a>>;

/// One kind of request. Implemented by a small struct holding the session
/// (by reference) and the caller's raw parameters.
pub(crate) trait Operation<'a, B: Buffer>: Sized {
    /// The validated parameters: kept for a replay on the CPU.
    type Params: Copy + Send + 'static;
    /// The session's context type on an engine.
    type Ctx: ?Sized + Send + Sync + 'a;
    /// What the engine context's request returns (the buffer, and a tag
    /// or a CRC).
    type EngineOut: Send + 'a;
    /// What a blocking-pool CPU job returns beside the buffer.
    type JobOut: Send + 'static;
    /// What the request returns.
    type Output;
    /// The request's name in traces.
    const NAME: &'static str;

    fn alg(&self) -> Algorithm;
    fn dir(&self) -> Direction;
    fn slots(&self) -> &'a Arc<Slots>;
    fn contexts(&self) -> &'a Contexts<Self::Ctx>;

    /// Validates the request; may take a tag off the buffer's end, but only
    /// once every check has passed (on an error the caller gets the buffer
    /// back as it was).
    fn check(&mut self, buf: &mut B) -> Result<Self::Params, Error>;

    /// The data unit the selector weighs (XTS; the length otherwise).
    fn unit(params: &Self::Params, len: usize) -> usize {
        let _ = params;
        len
    }

    /// Runs the request inline on the CPU.
    fn run_cpu(&mut self, params: &Self::Params, buf: B) -> Result<Self::Output, RequestError<B>>;

    /// The parts a blocking-pool job of `len` bytes really splits into, of
    /// the `offered` the plan allows (1: it runs whole).
    fn cpu_parts(&self, params: &Self::Params, len: usize, offered: usize) -> usize;

    /// Starts the request on the blocking pool in `parts`.
    fn spawn_cpu(&self, params: Self::Params, buf: B, parts: usize) -> CpuJob<Self::JobOut, B>;

    /// A blocking-pool job's result.
    fn job_done(&mut self, params: &Self::Params, out: Self::JobOut, buf: B) -> Self::Output;

    /// What an engine call needs of the operation (the session, the
    /// direction, the associated data), copied out of it so that the
    /// request's future borrows only the session.
    type Caller: Copy + Send + Sync + 'a;

    fn caller(&self) -> Self::Caller;

    /// Opens the session's context on `backend`.
    fn open_context(caller: Self::Caller, backend: &'a SharedBackend)
    -> OpenContext<'a, Self::Ctx>;

    /// The request on an open engine context.
    fn call(
        caller: Self::Caller,
        ctx: &'a Self::Ctx,
        params: Self::Params,
        io: IoBuf,
    ) -> BoxedRequest<'a, Self::EngineOut>;

    /// An engine's answer: `Ok` completes the request (its result may still
    /// be an error of the data's, such as a tag that does not verify), `Err`
    /// replays it on the CPU.
    fn engine_done(
        &mut self,
        params: &Self::Params,
        done: Result<Self::EngineOut, Failed>,
    ) -> Result<Result<Self::Output, RequestError<B>>, Failed>;
}

/// A blocking-pool job: its result and the buffer.
pub(crate) type CpuJob<T, B> =
    tokio::task::JoinHandle<(Result<T, crypto_offload_fallback::Error>, B)>;

/// The future of one request.
pub(crate) struct Request<'a, O: Operation<'a, B>, B: Buffer> {
    op: O,
    state: State<'a, O, B>,
}

enum State<'a, O: Operation<'a, B>, B: Buffer> {
    Start(B),
    Away(Box<Away<'a, O, B>>),
    Done,
}

/// A request on an engine or the blocking pool.
struct Away<'a, O: Operation<'a, B>, B: Buffer> {
    dispatch: Dispatch<'a>,
    /// For the replay on the CPU if the engine fails the request.
    params: O::Params,
    on: On<'a, O, B>,
}

enum On<'a, O: Operation<'a, B>, B: Buffer> {
    Engine(tracing::instrument::Instrumented<BoxedRequest<'a, O::EngineOut>>),
    Cpu(CpuJob<O::JobOut, B>),
}

impl<'a, O: Operation<'a, B>, B: Buffer> Request<'a, O, B> {
    #[inline]
    pub(crate) fn new(op: O, buf: B) -> Self {
        Request {
            op,
            state: State::Start(buf),
        }
    }

    /// The operation (its session and parameters), for `Debug`.
    pub(crate) fn op(&self) -> &O {
        &self.op
    }

    /// Polls a request sent away, keeping it while it is pending.
    fn poll_away(
        &mut self,
        mut away: Box<Away<'a, O, B>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<O::Output, RequestError<B>>> {
        let params = &away.params;
        let done = match &mut away.on {
            On::Cpu(job) => match Pin::new(job).poll(cx) {
                Poll::Pending => None,
                Poll::Ready(Ok((Ok(out), buf))) => Some(Ok(Ok(self.op.job_done(params, out, buf)))),
                Poll::Ready(Ok((Err(e), buf))) => Some(Ok(Err(RequestError::new(
                    crate::cpu::map_error(self.op.alg(), e),
                    buf,
                )))),
                Poll::Ready(Err(e)) => join_failed(e),
            },
            On::Engine(fut) => match Pin::new(fut).poll(cx) {
                Poll::Pending => None,
                Poll::Ready(done) => Some(self.op.engine_done(params, done)),
            },
        };
        let Some(done) = done else {
            self.state = State::Away(away);
            return Poll::Pending;
        };
        let Away {
            dispatch, params, ..
        } = *away;
        Poll::Ready(match done {
            Ok(result) => {
                dispatch.completed();
                result
            }
            // Not the input it was sent (a backend that could not get it
            // back from its device): a replay would compute on other
            // bytes, and pass for a result.
            Err(failed) if failed.buf.len() != dispatch.len() => {
                let backend = dispatch.lost(&failed.error);
                let error = crate::Error::Backend {
                    backend,
                    source: failed.error,
                };
                Err(RequestError::new(error, B::from_io(failed.buf)))
            }
            Err(failed) => {
                dispatch.failed(&failed.error);
                self.op.run_cpu(&params, B::from_io(failed.buf))
            }
        })
    }
}

impl<'a, O: Operation<'a, B> + Unpin, B: Buffer> Future for Request<'a, O, B> {
    type Output = Result<O::Output, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut buf = match mem::replace(&mut this.state, State::Done) {
            State::Start(buf) => buf,
            State::Away(away) => return this.poll_away(away, cx),
            State::Done => panic!("{} polled after it completed", O::NAME),
        };
        let (alg, dir) = (this.op.alg(), this.op.dir());
        let slots = this.op.slots();
        if !spend_budget(cx, slots, alg, dir, buf.bytes_mut().len()) {
            this.state = State::Start(buf);
            return Poll::Pending;
        }
        let params = match this.op.check(&mut buf) {
            Ok(p) => p,
            Err(e) => return Poll::Ready(Err(RequestError::new(e, buf))),
        };
        let len = buf.bytes_mut().len();
        let asked = Asked {
            alg,
            dir,
            len,
            unit: O::unit(&params, len),
        };
        let at_once = crate::select::cpu_at_once(slots, &asked);
        if at_once && cpu_plan(slots, alg, dir, len).is_none() {
            let op = &mut this.op;
            return Poll::Ready(inline_cpu(slots, alg, dir, len, None, || {
                op.run_cpu(&params, buf)
            }));
        }
        // (`cpu_at_once` also answers for an Offload without engines or
        // pinned: nothing to weigh there.)
        let (slot, predicted) = if at_once && slots.pinned.is_none() && slots.has_engines() {
            crate::select::decide_weighed(slots, &asked, || crate::select::explore_turn(alg, dir))
        } else {
            crate::select::decide(slots, &asked, || crate::select::explore_turn(alg, dir))
        };
        let plan = if slot.is_cpu() {
            cpu_plan(slots, alg, dir, len)
        } else {
            None
        };
        if slot.is_cpu() && plan.is_none() {
            let op = &mut this.op;
            return Poll::Ready(inline_cpu(slots, alg, dir, len, predicted, || {
                op.run_cpu(&params, buf)
            }));
        }
        let away = send_away(&this.op, params, buf, slot, plan, predicted);
        this.poll_away(away, cx)
    }
}

/// Sends a request to an engine or the blocking pool.
#[cold]
#[inline(never)]
fn send_away<'a, O: Operation<'a, B>, B: Buffer>(
    op: &O,
    params: O::Params,
    mut buf: B,
    slot: SlotId,
    plan: Option<usize>,
    predicted: Option<Prediction>,
) -> Box<Away<'a, O, B>> {
    let slots = op.slots();
    let len = buf.bytes_mut().len();
    let dispatch = Dispatch::new(slots, slot, op.alg(), op.dir(), len, predicted);
    let (dispatch, on) = if slot.is_cpu() {
        // A job split over cores is not one core's service time; one that
        // runs whole (CBC encryption, a single XTS unit) is, however many
        // parts the plan offered.
        let parts = op.cpu_parts(&params, len, plan.unwrap_or(1));
        (
            dispatch.unobserved_if(parts > 1),
            On::Cpu(op.spawn_cpu(params, buf, parts)),
        )
    } else {
        (
            dispatch.unobserved_if(op.contexts().opens_first(slot)),
            On::Engine(on_engine(op, slot, params, buf.into_io())),
        )
    };
    Box::new(Away {
        dispatch,
        params,
        on,
    })
}

/// The request on engine `slot`'s context, opening the context first if
/// this is the session's first request there.
fn on_engine<'a, O: Operation<'a, B>, B: Buffer>(
    op: &O,
    slot: SlotId,
    params: O::Params,
    io: IoBuf,
) -> tracing::instrument::Instrumented<BoxedRequest<'a, O::EngineOut>> {
    let slots: &'a Slots = op.slots();
    let backend = slots[slot]
        .backend()
        .expect("the selector sends only engine requests away");
    let span = tracing::trace_span!(
        "request",
        op = O::NAME,
        backend = backend.name(),
        alg = %op.alg(),
        len = io.len()
    );
    let cell: &'a OnceCell<Box<O::Ctx>> = op.contexts().cell(slot);
    let caller = op.caller();
    let fut = match cell.get() {
        Some(ctx) => O::call(caller, ctx, params, io),
        None => Box::pin(async move {
            match cell
                .get_or_try_init(|| O::open_context(caller, backend))
                .await
            {
                Ok(ctx) => O::call(caller, ctx, params, io).await,
                Err(e) => Err(Failed::new(e, io)),
            }
        }),
    };
    fut.instrument(span)
}
