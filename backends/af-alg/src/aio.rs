//! Linux native AIO for the operation socket's read: the kernel runs an
//! AF_ALG read submitted with `io_submit` asynchronously (`algif_skcipher`
//! completes it from the engine's callback), so no thread waits in the
//! kernel; one reaper thread collects completions with `io_getevents` and
//! wakes the waiting task. It is the alternative to the request threads of
//! [`crate::blocking`], which `af-alg-overhead` measures against them: one
//! thread hand-off a request instead of two. Single-operation skcipher
//! requests only (`Skcipher::encrypt_aio`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::libc;

use crate::error::Error;
use crate::socket::Op;

/// `struct iocb` (include/uapi/linux/aio_abi.h), little-endian layout.
#[cfg(target_endian = "little")]
#[repr(C)]
struct Iocb {
    aio_data: u64,
    aio_key: u32,
    aio_rw_flags: i32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

/// `IOCB_CMD_PREAD`.
const CMD_PREAD: u16 = 0;

/// Requests in flight at once (the context's size).
const DEPTH: usize = 1024;

/// What a completion hands back: the output buffer, the socket, and the
/// read's result (bytes, or a negated errno).
pub(crate) type Completion = (Vec<u8>, Op, i64);

/// A submitted read, kept whole until its completion: the kernel writes
/// into `out` and reads nothing else of ours after `io_submit` returns, but
/// the buffer and the socket must outlive the operation.
struct Pending {
    out: Vec<u8>,
    op: Op,
    done: tokio::sync::oneshot::Sender<Completion>,
}

pub(crate) struct Aio {
    ctx: u64,
    pending: Mutex<HashMap<u64, Pending>>,
    next: AtomicU64,
}

impl Aio {
    /// The process's AIO context and its reaper, set up on first use;
    /// `None` where the kernel has no native AIO (or no thread starts).
    pub(crate) fn get() -> Option<&'static Aio> {
        static AIO: OnceLock<Option<&'static Aio>> = OnceLock::new();
        *AIO.get_or_init(|| {
            let mut ctx: u64 = 0;
            // SAFETY: io_setup writes the new context id to the u64 we pass
            // (aio_context_t is an unsigned long, 64 bits here) and reads
            // nothing else.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_setup,
                    DEPTH as libc::c_long,
                    &mut ctx as *mut u64,
                )
            };
            if r != 0 {
                return None;
            }
            let aio: &'static Aio = Box::leak(Box::new(Aio {
                ctx,
                pending: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
            }));
            std::thread::Builder::new()
                .name("af-alg-aio".into())
                .spawn(move || aio.reap())
                .ok()
                .map(|_| aio)
        })
    }

    /// Submits a read of `out.len()` bytes from `op` (whose operation was
    /// sent) into `out`.
    pub(crate) fn submit(
        &'static self,
        op: Op,
        mut out: Vec<u8>,
    ) -> Result<tokio::sync::oneshot::Receiver<Completion>, Error> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let iocb = Iocb {
            aio_data: id,
            aio_key: 0,
            aio_rw_flags: 0,
            aio_lio_opcode: CMD_PREAD,
            aio_reqprio: 0,
            aio_fildes: op.raw_fd() as u32,
            aio_buf: out.as_mut_ptr() as u64,
            aio_nbytes: out.len() as u64,
            aio_offset: 0,
            aio_reserved2: 0,
            aio_flags: 0,
            aio_resfd: 0,
        };
        let (done, rx) = tokio::sync::oneshot::channel();
        // Registered before the submit (the completion may come at once),
        // and not under the lock during it: for a synchronous driver the
        // whole operation runs inside io_submit.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Pending { out, op, done });
        let mut iocbs = [&iocb as *const Iocb];
        // SAFETY: one valid iocb pointer in a valid array; the kernel copies
        // the iocb during the call. Its buffer (the registered `out`'s heap
        // storage, which did not move when the Vec moved into the map) and
        // the socket stay alive and untouched in the map until the
        // completion is reaped.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                self.ctx as libc::c_ulong,
                1 as libc::c_long,
                iocbs.as_mut_ptr(),
            )
        };
        if r != 1 {
            let errno = if r < 0 {
                nix::errno::Errno::last()
            } else {
                nix::errno::Errno::EAGAIN
            };
            // Not submitted: the kernel never saw the buffer or socket,
            // which are dropped here.
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Err(Error::sys("io_submit", "", errno));
        }
        Ok(rx)
    }

    fn reap(&self) {
        let mut events = [IoEvent::default(); 64];
        loop {
            // SAFETY: the event array is valid for 64 entries, which the
            // kernel fills; a null timeout waits for at least one.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx as libc::c_ulong,
                    1 as libc::c_long,
                    events.len() as libc::c_long,
                    events.as_mut_ptr(),
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
            if n < 0 {
                // EINTR; anything else would repeat, so pause rather than spin.
                if nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for ev in &events[..n as usize] {
                if let Some(p) = pending.remove(&ev.data) {
                    // A waiter that went away drops the buffer and socket
                    // here, after the kernel is done with them.
                    let _ = p.done.send((p.out, p.op, ev.res));
                }
            }
        }
    }
}
