//! The two AF_ALG sockets: a *transform* socket, bound to an algorithm (by
//! generic or driver name) and holding its key, and the *operation* sockets
//! accepted from it, each carrying one request at a time.
//!
//! Everything here is synchronous: the calls block while the kernel (or its
//! engine) works. [`crate::blocking`] moves them off the async workers.

use std::cell::Cell;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, SpliceFFlags, splice, vmsplice};

use nix::sys::socket::{
    AddressFamily, AlgAddr, ControlMessage, MsgFlags, SockFlag, SockType, accept4, bind,
    getsockopt, sendmsg, setsockopt, socket, sockopt,
};

use crate::error::Error;

/// `struct sockaddr_alg`'s `salg_type` and `salg_name` sizes, with their
/// terminating NUL.
const TYPE_MAX: usize = 14;
const NAME_MAX: usize = 64;

/// The send and receive buffers asked for on each operation socket. The
/// kernel caps them at twice `net.core.wmem_max` / `rmem_max` (416 KiB by
/// default); one operation takes at most what they hold.
pub(crate) const SOCKET_BUFFER: usize = 1 << 20;

/// Operations of this many bytes or more are spliced rather than copied
/// into the socket (see `SPLICE` in the crate's README for the measurement).
pub(crate) const SPLICE_FROM: usize = 16 * 1024;

/// What one operation may carry with these socket buffers: what
/// `af_alg_sendmsg` queues without waiting for a reader (the send buffer in
/// whole pages), and what one `read` maps of the result before
/// `af_alg_readable()` stops it (the receive buffer in whole pages, less a
/// page) — an AEAD result beyond that comes back short. Never below a page.
pub(crate) fn operation_limit(send: usize, receive: usize, page: usize) -> usize {
    let page = page.max(1);
    let whole = |b: usize| b / page * page;
    whole(send)
        .min(whole(receive).saturating_sub(page))
        .max(page)
}

/// The kernel's page size (4 KiB on x86-64; 16 or 64 KiB on some arm64).
pub(crate) fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// A transform socket: the algorithm and its key, for the session's life.
/// (A kernel driver does its runtime-PM get when this is created and its put
/// when it closes, so a session keeps it open rather than one per request.)
#[derive(Debug)]
pub(crate) struct Transform {
    fd: OwnedFd,
    name: String,
    /// The implementation the kernel bound, where `/proc/crypto` says.
    driver: Option<String>,
    /// The most one operation may carry for this driver (its engine's
    /// quirk), before the socket's own limit.
    max_operation: usize,
    /// The address alignment its driver wants of spliced data.
    align: usize,
    splicing: Arc<Splicing>,
}

impl Transform {
    /// A socket bound to `name` ("cbc(aes)" or a driver name such as
    /// "virtio_crypto_aes_cbc") of `kind` ("skcipher", "aead", "hash").
    /// `is_driver`: the caller knows `name` is a driver name, so
    /// `/proc/crypto` need not be read to learn which driver was bound.
    pub(crate) fn bind(
        kind: &'static str,
        name: &str,
        is_driver: bool,
    ) -> Result<Transform, Error> {
        if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
            return Err(Error::Invalid {
                what: "algorithm name",
                detail: format!("{name:?}: 1 to {} bytes, no NUL", NAME_MAX - 1),
            });
        }
        debug_assert!(kind.len() < TYPE_MAX);
        let fd = socket(
            AddressFamily::Alg,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| Error::sys("socket", "sockets", e))?;
        bind(fd.as_raw_fd(), &AlgAddr::new(kind, name)).map_err(|e| Error::sys("bind", name, e))?;
        let driver = if is_driver {
            Some(name.to_owned())
        } else {
            bound_driver(kind, name)
        };
        let (max_operation, align) = match driver.as_deref() {
            Some(d) => {
                let engine = crate::engine::classify(d);
                (engine.max_request.unwrap_or(usize::MAX), engine.align)
            }
            // An engine we cannot name may have limits we cannot look up:
            // stay within the smallest the table knows.
            None => (UNKNOWN_DRIVER_OPERATION, UNKNOWN_DRIVER_ALIGN),
        };
        Ok(Transform {
            fd,
            name: name.to_owned(),
            driver,
            max_operation,
            align,
            splicing: Arc::new(Splicing {
                from: AtomicUsize::new(SPLICE_FROM),
                sent: AtomicU64::new(0),
            }),
        })
    }

    /// Sends operations of `min_len` bytes or more by `vmsplice`/`splice`
    /// (`None`: always copy). Applies to this transform's operation sockets.
    pub(crate) fn set_splice_from(&self, min_len: Option<usize>) {
        self.splicing
            .from
            .store(min_len.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// How many operations were sent spliced rather than copied.
    pub(crate) fn spliced(&self) -> u64 {
        self.splicing.sent.load(Ordering::Relaxed)
    }

    /// The splice threshold; `None` if copying always.
    pub(crate) fn splice_from(&self) -> Option<usize> {
        Some(self.splicing.from.load(Ordering::Relaxed)).filter(|&n| n != usize::MAX)
    }

    /// The implementation the kernel bound (from `/proc/crypto`: the name
    /// itself if it is a driver name, else the highest-priority driver for
    /// it), if known.
    pub(crate) fn driver(&self) -> Option<&str> {
        self.driver.as_deref()
    }

    /// The name it was bound with.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Sets the key (`ALG_SET_KEY`). The kernel keeps its own copy; the
    /// caller wipes theirs.
    pub(crate) fn set_key(&self, key: &[u8]) -> Result<(), Error> {
        setsockopt(&self.fd, sockopt::AlgSetKey::default(), &key)
            .map_err(|e| Error::sys("ALG_SET_KEY", &self.name, e))
    }

    /// Sets an AEAD's tag length (`ALG_SET_AEAD_AUTHSIZE`).
    pub(crate) fn set_tag_len(&self, len: usize) -> Result<(), Error> {
        setsockopt(&self.fd, sockopt::AlgSetAeadAuthSize, &len)
            .map_err(|e| Error::sys("ALG_SET_AEAD_AUTHSIZE", &self.name, e))
    }

    /// A new operation socket, with as large a send buffer as the kernel
    /// grants — close-on-exec, as the transform socket is: it computes
    /// with the transform's key, and a program the server execs must not
    /// inherit it.
    pub(crate) fn accept(&self) -> Result<Op, Error> {
        let raw = accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC)
            .map_err(|e| Error::sys("accept", &self.name, e))?;
        // SAFETY: `accept` succeeded, so `raw` is a new open descriptor that
        // nothing else owns; the `OwnedFd` takes sole ownership and closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A smaller buffer is no error: the limit below follows what we got.
        let _ = setsockopt(&fd, sockopt::SndBuf, &SOCKET_BUFFER);
        let _ = setsockopt(&fd, sockopt::RcvBuf, &SOCKET_BUFFER);
        let send = getsockopt(&fd, sockopt::SndBuf).unwrap_or(0);
        let receive = getsockopt(&fd, sockopt::RcvBuf).unwrap_or(0);
        let limit = operation_limit(send, receive, page_size()).min(self.max_operation);
        Ok(Op {
            fd,
            limit,
            splicing: self.splicing.clone(),
            align: self.align,
            splice_max: whole_pages(send, page_size()).saturating_sub(page_size()),
        })
    }
}

/// An operation socket.
#[derive(Debug)]
pub(crate) struct Op {
    fd: OwnedFd,
    /// The most data one operation (one `sendmsg` without `MSG_MORE`) may
    /// carry without blocking.
    limit: usize,
    /// Its transform's splicing.
    splicing: Arc<Splicing>,
    /// The address alignment its driver wants of spliced data.
    align: usize,
    /// The most one spliced operation may carry: the send buffer in whole
    /// pages, less a page. Spliced data arrives in pieces that end at page
    /// boundaries of the caller's buffer, and the kernel takes each piece
    /// only while a whole page of send buffer is free — an operation of
    /// the full buffer would wait for room no reader will make.
    splice_max: usize,
}

/// Whether `data` (`total` bytes) is spliced: from the threshold `from`
/// up to `max`, and only if every piece starts at the driver's alignment (a
/// copy lands page-aligned).
fn splices(data: &[IoSlice<'_>], total: usize, from: usize, max: usize, align: usize) -> bool {
    total > 0
        && total >= from
        && total <= max
        && data
            .iter()
            .all(|d| d.is_empty() || (d.as_ptr() as usize).is_multiple_of(align.max(1)))
}

fn whole_pages(bytes: usize, page: usize) -> usize {
    bytes / page.max(1) * page.max(1)
}

/// A transform's splicing: its threshold and what it spliced, shared with
/// its operation sockets.
#[derive(Debug)]
struct Splicing {
    /// Operations of this many bytes or more are spliced; `usize::MAX`
    /// never (asked so, or the kernel refused a splice).
    from: AtomicUsize,
    /// Operations sent spliced.
    sent: AtomicU64,
}

thread_local! {
    /// This thread's pipe for spliced input (read end, write end): taken
    /// for a send and put back only empty. Per thread, not per socket: a
    /// request uses it synchronously, and threads are far fewer than idle
    /// sockets (pipes count against the user's pipe-page limit).
    static PIPE: Cell<Option<(OwnedFd, OwnedFd)>> = const { Cell::new(None) };
}

/// Retries a system call that a signal interrupted.
fn retrying<T>(mut call: impl FnMut() -> nix::Result<T>) -> nix::Result<T> {
    loop {
        match call() {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// Whether an errno from the first `vmsplice` or `splice` says this kernel
/// (or its seccomp policy) does not splice into AF_ALG at all, rather than
/// that this one attempt failed.
fn refuses_splicing(e: Errno) -> bool {
    matches!(
        e,
        Errno::ENOSYS | Errno::EPERM | Errno::EACCES | Errno::EINVAL | Errno::EOPNOTSUPP
    )
}

/// What became of a spliced send.
enum Spliced {
    Sent,
    /// No data reached the socket (which waits for it, as if nothing had
    /// been sent): with the errno if the kernel refuses splicing for good.
    Refused(Option<Errno>),
}

fn short(op: &'static str) -> Error {
    Error::Io {
        op,
        source: std::io::Error::other("the kernel took no data"),
    }
}

/// What one `sendmsg` carries besides its data.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Control<'a> {
    /// `ALG_OP_ENCRYPT` (true) or `ALG_OP_DECRYPT` (false); `None` for hashes.
    pub(crate) encrypt: Option<bool>,
    /// The IV, if the mode takes one.
    pub(crate) iv: Option<&'a [u8]>,
    /// The AEAD's associated-data length.
    pub(crate) assoc_len: Option<u32>,
}

impl Op {
    /// The most data one operation may carry.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// The most data one operation may carry.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Sends `data` (all of it) with its control messages.
    /// From the transform's splice threshold up, the data's pages go to the
    /// kernel by `vmsplice`/`splice` instead of being copied; where the
    /// kernel refuses that, this copies, and so does the transform from then
    /// on.
    pub(crate) fn send(&self, control: Control<'_>, data: &[IoSlice<'_>]) -> Result<(), Error> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        let from = self.splicing.from.load(Ordering::Relaxed);
        if splices(data, total, from, self.splice_max, self.align) {
            match self.send_spliced(control, data, total)? {
                Spliced::Sent => {
                    self.splicing.sent.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Spliced::Refused(Some(errno)) => {
                    tracing::debug!(?errno, "splice refused; copying from now on");
                    self.splicing.from.store(usize::MAX, Ordering::Relaxed);
                }
                Spliced::Refused(None) => {}
            }
        }
        self.send_copy(control, data)
    }

    /// Sends `data` (all of it) with its control messages, copied into the
    /// socket whatever its length.
    pub(crate) fn send_copy(
        &self,
        control: Control<'_>,
        data: &[IoSlice<'_>],
    ) -> Result<(), Error> {
        self.send_with(control, data, MsgFlags::empty())
    }

    /// Sends `data` (`total` bytes) as one operation without copying it:
    /// the control messages by `sendmsg(MSG_MORE)`, the pages by `vmsplice`
    /// into this thread's pipe and `splice` from it into the socket (the
    /// kernel holds references to them until the operation has been read).
    /// `Refused` leaves the socket as if nothing had been sent. On any error
    /// the caller closes the socket; the pipe, unless empty, is dropped here.
    fn send_spliced(
        &self,
        control: Control<'_>,
        data: &[IoSlice<'_>],
        total: usize,
    ) -> Result<Spliced, Error> {
        let pipe = match PIPE.take() {
            Some(p) => p,
            None => match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
                Ok(p) => p,
                Err(_) => return Ok(Spliced::Refused(None)),
            },
        };
        let (r, empty) = self.splice_through(&pipe, control, data, total);
        if empty {
            PIPE.set(Some(pipe));
        }
        r
    }

    /// [`Op::send_spliced`] through `pipe`; and whether the pipe is empty
    /// after.
    fn splice_through(
        &self,
        (read_end, write_end): &(OwnedFd, OwnedFd),
        control: Control<'_>,
        data: &[IoSlice<'_>],
        total: usize,
    ) -> (Result<Spliced, Error>, bool) {
        let refused = |e: Errno| Spliced::Refused(refuses_splicing(e).then_some(e));
        let mut slices = data.to_vec();
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        let mut remaining = total;
        let mut moved_any = false;
        while remaining > 0 {
            // The pipe takes 16 pages (its default size): longer input goes
            // in rounds.
            let queued = match retrying(|| vmsplice(write_end, rest, SpliceFFlags::empty())) {
                Ok(n) if n > 0 => n,
                Ok(_) => return (Err(short("vmsplice")), true),
                Err(e) if !moved_any => return (Ok(refused(e)), true),
                Err(e) => return (Err(Error::sys("vmsplice", "", e)), true),
            };
            if !moved_any {
                let more = MsgFlags::from_bits_retain(nix::libc::MSG_MORE);
                if let Err(e) = self.send_with(control, &[], more) {
                    return (Err(e), false);
                }
            }
            // Without SPLICE_F_MORE on its last page the operation is
            // complete: only the last round goes without.
            let flags = if queued < remaining {
                SpliceFFlags::SPLICE_F_MORE
            } else {
                SpliceFFlags::empty()
            };
            let mut left = queued;
            while left > 0 {
                match retrying(|| splice(read_end, None, &self.fd, None, left, flags)) {
                    Ok(n) if n > 0 => left -= n,
                    Ok(_) => return (Err(short("splice")), false),
                    // Nothing reached the socket, which still waits for its
                    // data after MSG_MORE: the caller may copy it.
                    Err(e) if !moved_any => return (Ok(refused(e)), false),
                    Err(e) => return (Err(Error::sys("splice", "", e)), false),
                }
                moved_any = true;
            }
            remaining -= queued;
            IoSlice::advance_slices(&mut rest, queued);
        }
        (Ok(Spliced::Sent), true)
    }

    fn send_with(
        &self,
        control: Control<'_>,
        data: &[IoSlice<'_>],
        flags: MsgFlags,
    ) -> Result<(), Error> {
        let op = control.encrypt.map(libc_op);
        let mut cmsgs = Vec::with_capacity(3);
        if let Some(op) = &op {
            cmsgs.push(ControlMessage::AlgSetOp(op));
        }
        if let Some(iv) = control.iv {
            // nix writes `struct af_alg_iv`: the length, then the IV.
            cmsgs.push(ControlMessage::AlgSetIv(iv));
        }
        if let Some(len) = &control.assoc_len {
            cmsgs.push(ControlMessage::AlgSetAeadAssoclen(len));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        let sent = sendmsg::<AlgAddr>(self.fd.as_raw_fd(), data, &cmsgs, flags, None)
            .map_err(|e| Error::sys("sendmsg", "", e))?;
        if sent != total {
            return Err(Error::Io {
                op: "sendmsg",
                source: std::io::Error::other(format!("sent {sent} of {total} bytes")),
            });
        }
        Ok(())
    }

    /// Reads the operation's result into `bufs`; returns the bytes read.
    pub(crate) fn recv(&self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, Error> {
        loop {
            match nix::sys::uio::readv(&self.fd, bufs) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => return r.map_err(|e| Error::sys("read", "", e)),
            }
        }
    }
}

/// The most one operation carries when `/proc/crypto` cannot say which
/// driver was bound.
const UNKNOWN_DRIVER_OPERATION: usize = 64 * 1024;

/// The alignment spliced data needs when `/proc/crypto` cannot say which
/// driver was bound: the strictest the table knows.
const UNKNOWN_DRIVER_ALIGN: usize = 4;

/// Which driver binding `name` as `kind` reaches, by `/proc/crypto`: the
/// highest priority, the first listed on a tie (as the kernel's lookup).
fn bound_driver(kind: &str, name: &str) -> Option<String> {
    let table = crate::proc_crypto::read().ok()?;
    if table.iter().any(|r| r.driver == name) {
        return Some(name.to_owned());
    }
    table
        .into_iter()
        .filter(|r| r.name == name && r.af_alg_type() == Some(kind))
        .fold(
            None,
            |best: Option<crate::proc_crypto::Registered>, r| match best {
                Some(b) if b.priority >= r.priority => Some(b),
                _ => Some(r),
            },
        )
        .map(|r| r.driver)
}

fn libc_op(encrypt: bool) -> nix::libc::c_int {
    if encrypt {
        nix::libc::ALG_OP_ENCRYPT
    } else {
        nix::libc::ALG_OP_DECRYPT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splicing_needs_the_threshold_and_the_drivers_alignment() {
        let buf = [0u8; 64];
        // The first offset into `buf` at a 4-byte-aligned address.
        let aligned = (4 - buf.as_ptr() as usize % 4) % 4;
        let one = |o: usize| [IoSlice::new(&buf[o..o + 32])];
        let max = usize::MAX - 1;
        assert!(splices(&one(aligned), 32, 16, max, 4));
        assert!(
            !splices(&one(aligned), 32, 33, max, 4),
            "below the threshold"
        );
        assert!(!splices(&one(aligned), 32, 16, 31, 4), "above the maximum");
        assert!(!splices(&one(aligned + 1), 32, 16, max, 4), "misaligned");
        assert!(
            splices(&one(aligned + 1), 32, 16, max, 1),
            "no alignment wanted"
        );
        assert!(!splices(&[], 0, 0, max, 1), "nothing to send");
        assert!(!splices(&one(aligned), 32, usize::MAX, max, 1), "off");
    }

    #[test]
    fn the_operation_limit_follows_both_buffers_in_pages() {
        // Defaults: 2 × 208 KiB granted both ways, 4 KiB pages.
        assert_eq!(operation_limit(425_984, 425_984, 4096), 425_984 - 4096);
        // The receive window binds when it is the smaller.
        assert_eq!(operation_limit(425_984, 212_992, 4096), 212_992 - 4096);
        // 64 KiB pages round down, so a send never waits for a reader.
        assert_eq!(operation_limit(425_984, 1 << 20, 65_536), 393_216);
        // Never below a page.
        assert_eq!(operation_limit(0, 0, 4096), 4096);
    }
}
