//! Symmetric ciphers (`skcipher`): AES in ECB, CBC, CTR and XTS.

use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

use tracing::Instrument;
use zeroize::Zeroize;

use crate::blocking::{self, RequestTimeout, Shared};
use crate::error::{Error, Failed};
use crate::socket::{Control, Op, Transform};

/// A block cipher mode AF_ALG offers for AES.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// `ecb(aes)`: no IV; whole blocks.
    Ecb,
    /// `cbc(aes)`: whole blocks.
    Cbc,
    /// `ctr(aes)`: a 128-bit big-endian counter block; any length.
    Ctr,
    /// `xts(aes)`: a tweak per request, which is one data unit of at least
    /// one block (ciphertext stealing for the rest); a double-length key.
    Xts,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 4] = [Mode::Ecb, Mode::Cbc, Mode::Ctr, Mode::Xts];

    /// The generic algorithm name, e.g. `"cbc(aes)"`.
    pub fn generic_name(self) -> &'static str {
        match self {
            Mode::Ecb => "ecb(aes)",
            Mode::Cbc => "cbc(aes)",
            Mode::Ctr => "ctr(aes)",
            Mode::Xts => "xts(aes)",
        }
    }

    /// The IV length the mode takes (0 for ECB).
    pub fn iv_len(self) -> usize {
        match self {
            Mode::Ecb => 0,
            _ => 16,
        }
    }

    /// The key lengths the mode takes.
    pub fn key_lens(self) -> &'static [usize] {
        match self {
            Mode::Xts => &[32, 48, 64],
            _ => &[16, 24, 32],
        }
    }

    /// Checks a request length: whole blocks for ECB and CBC, at least one
    /// block for XTS, anything for CTR.
    pub fn check_len(self, len: usize) -> Result<(), Error> {
        let bad = match self {
            Mode::Ecb | Mode::Cbc => !len.is_multiple_of(16),
            Mode::Xts => len != 0 && len < 16,
            Mode::Ctr => false,
        };
        if bad {
            return Err(Error::Invalid {
                what: "length",
                detail: format!("{len} bytes for {}", self.generic_name()),
            });
        }
        Ok(())
    }
}

/// How a transform's requests wait for the kernel without blocking an
/// async worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mechanism {
    /// A request thread runs each request's `sendmsg` and `read`, the
    /// task waiting on a channel: two thread hand-offs a request (the
    /// default: measured steadier, see the crate's README).
    #[default]
    Threads,
    /// Native AIO, batched: the operation is sent from the calling task and
    /// its read submitted with `io_submit` together with the reads other
    /// requests queued meanwhile; a reaper thread wakes the tasks whose
    /// reads completed, many per wake-up. Requests of one operation that
    /// are not spliced (below [`Skcipher::with_splice_from`]'s threshold)
    /// go this way; the others, and every request where the kernel has no
    /// native AIO, go to the request threads.
    ///
    /// Opt-in, with limits a review found and no test covers yet: the
    /// kernel's AIO reads are not backlogged, so an engine whose own queue
    /// is full (crypto_engine's 10, a full CAAM or QAT ring) fails them
    /// with `ENOSPC`/`EBUSY` where a thread would wait; the submitting
    /// request keeps submitting while others queue reads (on a synchronous
    /// driver their work runs on its thread); a refused `io_submit`
    /// (seccomp, a forked child) fails the request instead of falling back
    /// to the threads; idle sockets kept per transform can exhaust the
    /// descriptor limit with many busy sessions; deadlines are checked
    /// every 100 ms.
    Aio,
}

/// A keyed AES transform: many requests may be in flight at once, each on
/// its own operation socket.
#[derive(Debug, Clone)]
pub struct Skcipher {
    shared: Arc<Shared>,
    timeout: Option<RequestTimeout>,
    mode: Mode,
    mechanism: Mechanism,
}

impl Skcipher {
    /// Binds `mode` — to the kernel's highest-priority implementation, or
    /// with `driver` to that driver exactly (e.g. `"virtio_crypto_aes_cbc"`)
    /// — and sets the key.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if AF_ALG, the algorithm or the driver is not
    /// on offer here; [`Error::Invalid`] for a key length the mode does not
    /// take; [`Error::InvalidParameter`] if the kernel refuses the key
    /// (XTS with equal halves, in FIPS mode).
    pub fn bind(mode: Mode, driver: Option<&str>, key: &[u8]) -> Result<Skcipher, Error> {
        if !mode.key_lens().contains(&key.len()) {
            return Err(Error::Invalid {
                what: "key length",
                detail: format!("{} bytes for {}", key.len(), mode.generic_name()),
            });
        }
        let tfm = Transform::bind(
            "skcipher",
            driver.unwrap_or(mode.generic_name()),
            driver.is_some(),
        )?;
        tfm.set_key(key)?;
        Ok(Skcipher {
            shared: Shared::new(tfm),
            timeout: None,
            mode,
            mechanism: Mechanism::default(),
        })
    }

    blocking::bound_accessors!();

    /// Chooses how requests wait for the kernel (for this handle and the
    /// clones made from it after).
    pub fn with_mechanism(mut self, mechanism: Mechanism) -> Self {
        self.mechanism = mechanism;
        self
    }

    /// How requests wait for the kernel.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Encrypts `buf` in place.
    ///
    /// # Errors
    /// A length the mode does not take, an IV of the wrong length, or a
    /// failed system call; the buffer comes back unchanged with the error.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop a request the kernel has: it
    /// completes there, its buffers owned by the request thread or the AIO
    /// context's table until then, and then wiped and freed.
    pub async fn encrypt(&self, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        self.crypt(true, iv, buf).await
    }

    /// Decrypts `buf` in place.
    ///
    /// # Errors
    /// As for [`Skcipher::encrypt`].
    ///
    /// # Cancel safety
    /// As for [`Skcipher::encrypt`].
    pub async fn decrypt(&self, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        self.crypt(false, iv, buf).await
    }

    /// XTS over several data units: `buf` is a whole number of
    /// `unit_len`-byte units and unit `i` takes tweak `first_tweak + i`
    /// (128-bit little-endian), each unit one kernel operation. Other modes
    /// take the whole buffer as one request.
    ///
    /// # Errors
    /// As for [`Skcipher::encrypt`]; a `unit_len` that does not divide the
    /// buffer or is below one block is [`Error::Invalid`].
    ///
    /// # Cancel safety
    /// As for [`Skcipher::encrypt`].
    pub async fn crypt_units(
        &self,
        encrypt: bool,
        first_tweak: &[u8; 16],
        unit_len: usize,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Failed> {
        if self.mode != Mode::Xts || unit_len == buf.len() {
            return self.crypt(encrypt, first_tweak, buf).await;
        }
        if unit_len < 16 || !buf.len().is_multiple_of(unit_len) {
            let error = Error::Invalid {
                what: "data unit",
                detail: format!("{unit_len}-byte units in {} bytes", buf.len()),
            };
            return Err(Failed { error, buf });
        }
        let (shared, tweak) = (self.shared.clone(), *first_tweak);
        let span = tracing::trace_span!(
            "af_alg.skcipher.units",
            name = shared.tfm.name(),
            encrypt,
            len = buf.len(),
            unit_len
        );
        blocking::run(&self.shared.stuck, buf, self.timeout, move |data| {
            shared.with_op(|op| {
                into_fresh(data, |input, output| {
                    let first = u128::from_le_bytes(tweak);
                    let units = input.chunks(unit_len).zip(output.chunks_mut(unit_len));
                    for (i, (unit, out)) in units.enumerate() {
                        let t = first.wrapping_add(i as u128).to_le_bytes();
                        crypt(op, Mode::Xts, encrypt, t, unit, out)?;
                    }
                    Ok(())
                })
            })
        })
        .instrument(span)
        .await
        .map(|(buf, ())| buf)
    }

    /// Encrypts or decrypts `buf` with native AIO (`io_submit`, batched
    /// with other requests' reads) whatever the transform's
    /// [`Mechanism`]: one operation only (a request longer than one is
    /// [`Error::TooLarge`]), always copied into the socket.
    ///
    /// # Errors
    /// As for [`Skcipher::encrypt`]; a kernel without AIO gives
    /// `io_setup`'s error.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the read with the kernel; its buffer and
    /// socket are wiped and freed when it completes.
    pub async fn crypt_aio(
        &self,
        encrypt: bool,
        iv: &[u8],
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Failed> {
        let iv = match self.check(iv, buf.len()) {
            Ok(iv) => iv,
            Err(error) => return Err(Failed { error, buf }),
        };
        if buf.is_empty() {
            return Ok(buf);
        }
        let Some(aio) = crate::aio::Aio::get() else {
            let error = Error::Io {
                op: "io_setup",
                source: std::io::Error::last_os_error(),
            };
            return Err(Failed { error, buf });
        };
        match self.run_aio(aio, encrypt, iv, buf).await {
            Ok(out) => Ok(out),
            Err(Aio::TooLarge(buf, op)) => {
                let max = op.limit();
                self.shared.give_back(op);
                let error = Error::TooLarge {
                    len: buf.len(),
                    max,
                };
                Err(Failed { error, buf })
            }
            Err(Aio::Failed(f)) => Err(f),
        }
    }

    /// One request through [`crate::aio`]: room in the context, an
    /// operation socket, the operation sent (copied), the read submitted.
    ///
    /// # Cancel safety
    /// Before the submit nothing is in the kernel (a socket taken and not
    /// used is closed with the future); after it, the read's buffer and
    /// socket stay in the context's table until it completes.
    async fn run_aio(
        &self,
        aio: &'static crate::aio::Aio,
        encrypt: bool,
        iv: [u8; 16],
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, Aio> {
        if self.timeout.is_some()
            && self.shared.stuck.load(std::sync::atomic::Ordering::Acquire) >= blocking::MAX_STUCK
        {
            // The engine has not returned the last ones: do not send it more.
            let error = Error::Timeout(std::time::Duration::ZERO);
            return Err(Aio::Failed(Failed { error, buf }));
        }
        // The deadline runs from here: a request waiting for room behind
        // requests a hung engine holds times out like one in the engine
        // (and is replayed elsewhere), instead of waiting for ever.
        let limit = self.timeout.map(|t| t.for_len(buf.len()));
        let deadline = limit.and_then(|l| std::time::Instant::now().checked_add(l));
        let room = match limit {
            None => aio.room().await,
            Some(l) => match tokio::time::timeout(l, aio.room()).await {
                Ok(room) => room,
                Err(_) => {
                    let error = Error::Timeout(l);
                    return Err(Aio::Failed(Failed { error, buf }));
                }
            },
        };
        let op = match self.shared.take() {
            Ok(op) => op,
            Err(error) => return Err(Aio::Failed(Failed { error, buf })),
        };
        if buf.len() > op.limit() {
            return Err(Aio::TooLarge(buf, op));
        }
        // Copied, never spliced: a dropped future frees `buf` while the
        // read may still run, and spliced pages would be read from it.
        let sent = op.send_copy(
            Control {
                encrypt: Some(encrypt),
                iv: (self.mode.iv_len() > 0).then_some(&iv[..]),
                ..Control::default()
            },
            &[IoSlice::new(&buf)],
        );
        if let Err(error) = sent {
            // The socket may hold part of the operation: closed, not reused.
            return Err(Aio::Failed(Failed { error, buf }));
        }
        let ticket = aio.submit(
            room,
            op,
            vec![0u8; buf.len()],
            deadline,
            self.shared.stuck.clone(),
        );
        let (mut out, op, res) = match ticket.await {
            crate::aio::Outcome::Done(c) => c,
            crate::aio::Outcome::TimedOut => {
                // The kernel keeps its own buffer; the caller's is untouched.
                let error = Error::Timeout(limit.unwrap_or_default());
                return Err(Aio::Failed(Failed { error, buf }));
            }
        };
        if res == buf.len() as i64 {
            self.shared.give_back(op);
            let mut buf = buf;
            buf.zeroize();
            return Ok(out);
        }
        out.zeroize();
        let error = if res < 0 {
            Error::sys("read", "", nix::errno::Errno::from_raw(-res as i32))
        } else {
            Error::Io {
                op: "read",
                source: std::io::Error::other(format!("read {res} of {} bytes", buf.len())),
            }
        };
        Err(Aio::Failed(Failed { error, buf }))
    }

    /// Encrypts or decrypts `data` in place on the calling thread (which
    /// blocks until the kernel is done).
    ///
    /// # Errors
    /// As for [`Skcipher::encrypt`].
    pub fn crypt_blocking(&self, encrypt: bool, iv: &[u8], data: &mut [u8]) -> Result<(), Error> {
        let iv = self.check(iv, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.shared.with_op(|op| {
            let mut out = vec![0u8; data.len()];
            let r = crypt(op, self.mode, encrypt, iv, data, &mut out);
            if r.is_ok() {
                data.copy_from_slice(&out);
            }
            out.zeroize();
            r
        })
    }

    async fn crypt(&self, encrypt: bool, iv: &[u8], buf: Vec<u8>) -> Result<Vec<u8>, Failed> {
        let iv = match self.check(iv, buf.len()) {
            Ok(iv) => iv,
            Err(error) => return Err(Failed { error, buf }),
        };
        if buf.is_empty() {
            return Ok(buf);
        }
        let aio = match self.mechanism {
            Mechanism::Aio if self.splice_from().is_none_or(|s| buf.len() < s) => {
                crate::aio::Aio::get()
            }
            _ => None,
        };
        let buf = match aio {
            None => buf,
            Some(aio) => match self.run_aio(aio, encrypt, iv, buf).await {
                Ok(out) => return Ok(out),
                Err(Aio::Failed(f)) => return Err(f),
                // More than one operation: the request threads chain them.
                Err(Aio::TooLarge(buf, op)) => {
                    self.shared.give_back(op);
                    buf
                }
            },
        };
        let (shared, mode) = (self.shared.clone(), self.mode);
        let span = tracing::trace_span!(
            "af_alg.skcipher",
            name = shared.tfm.name(),
            encrypt,
            len = buf.len()
        );
        blocking::run(&self.shared.stuck, buf, self.timeout, move |data| {
            shared.with_op(|op| into_fresh(data, |i, o| crypt(op, mode, encrypt, iv, i, o)))
        })
        .instrument(span)
        .await
        .map(|(buf, ())| buf)
    }

    fn check(&self, iv: &[u8], len: usize) -> Result<[u8; 16], Error> {
        if iv.len() != self.mode.iv_len() {
            return Err(Error::Invalid {
                what: "IV length",
                detail: format!(
                    "{} bytes for {} (it takes {})",
                    iv.len(),
                    self.mode.generic_name(),
                    self.mode.iv_len()
                ),
            });
        }
        self.mode.check_len(len)?;
        let mut block = [0u8; 16];
        block[..iv.len()].copy_from_slice(iv);
        Ok(block)
    }
}

/// Why a request did not go through AIO.
enum Aio {
    /// It takes more than one operation: the buffer, untouched, and the
    /// socket, unused.
    TooLarge(Vec<u8>, Op),
    Failed(Failed),
}

/// One request, split into operations of at most the socket's limit where
/// the mode allows (the IV chained in userspace), from `input` into
/// `output` (the same length). The kernel writes its result in place of
/// the read buffer as it goes, so a request that fails part-way must not
/// read into the caller's buffer: that has to come back unchanged, to be
/// replayed elsewhere.
fn crypt(
    op: &Op,
    mode: Mode,
    encrypt: bool,
    mut iv: [u8; 16],
    input: &[u8],
    output: &mut [u8],
) -> Result<(), Error> {
    let limit = op.limit() / 16 * 16;
    if mode == Mode::Xts && input.len() > limit {
        // One tweak per operation: an XTS unit cannot be split.
        return Err(Error::TooLarge {
            len: input.len(),
            max: limit,
        });
    }
    let has_iv = mode.iv_len() > 0;
    let step = limit.max(16);
    for (piece, out) in input.chunks(step).zip(output.chunks_mut(step)) {
        let control = Control {
            encrypt: Some(encrypt),
            iv: has_iv.then_some(&iv[..]),
            ..Control::default()
        };
        op.send(control, &[IoSlice::new(piece)])?;
        let got = op.recv(&mut [IoSliceMut::new(out)])?;
        if got != piece.len() {
            return Err(Error::Io {
                op: "read",
                source: std::io::Error::other(format!("read {got} of {} bytes", piece.len())),
            });
        }
        iv = match (mode, encrypt) {
            (Mode::Cbc, true) => last_block(out),
            (Mode::Cbc, false) => last_block(piece),
            (Mode::Ctr, _) => add_blocks(iv, piece.len() / 16),
            _ => iv,
        };
    }
    Ok(())
}

/// Runs `f` from `data` into a fresh buffer and, only if it succeeds, puts
/// the result in `data` (the input, plaintext on one side or the other, is
/// wiped). On failure `data` is unchanged and the partial result wiped.
pub(crate) fn into_fresh(
    data: &mut Vec<u8>,
    f: impl FnOnce(&[u8], &mut [u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut out = vec![0u8; data.len()];
    match f(data, &mut out) {
        Ok(()) => {
            std::mem::swap(data, &mut out);
            out.zeroize();
            Ok(())
        }
        Err(e) => {
            out.zeroize();
            Err(e)
        }
    }
}

fn last_block(data: &[u8]) -> [u8; 16] {
    let mut b = [0u8; 16];
    if data.len() >= 16 {
        b.copy_from_slice(&data[data.len() - 16..]);
    }
    b
}

/// A CTR counter block advanced by `n` blocks (128-bit big-endian, wrapping,
/// as the kernel's `ctr(aes)` counts).
fn add_blocks(iv: [u8; 16], n: usize) -> [u8; 16] {
    u128::from_be_bytes(iv)
        .wrapping_add(n as u128)
        .to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctr_counter_wraps_like_the_kernel() {
        assert_eq!(add_blocks([0xff; 16], 1), [0; 16]);
        let mut one = [0; 16];
        one[15] = 1;
        assert_eq!(add_blocks([0; 16], 1), one);
    }

    #[test]
    fn lengths_and_keys_are_checked_per_mode() {
        assert!(Mode::Cbc.check_len(15).is_err());
        assert!(Mode::Ecb.check_len(32).is_ok());
        assert!(Mode::Ctr.check_len(7).is_ok());
        assert!(Mode::Xts.check_len(15).is_err());
        assert!(Mode::Xts.check_len(17).is_ok());
        assert!(Mode::Xts.check_len(0).is_ok());
        assert!(Mode::Xts.key_lens().contains(&64));
        assert!(!Mode::Cbc.key_lens().contains(&64));
    }

    #[test]
    fn a_bad_key_length_is_refused_before_any_system_call() {
        // Even where AF_ALG is missing, the key is checked first.
        let e = Skcipher::bind(Mode::Cbc, None, &[0; 15]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Invalid {
                    what: "key length",
                    ..
                }
            ),
            "{e}"
        );
    }
}
