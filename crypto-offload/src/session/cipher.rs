//! Cipher sessions (AES-CBC, -CTR, -XTS).

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use super::iv::IvInput;
use super::request::{CpuJob, OpenContext, Operation, Request};
use super::{BoxedRequest, Contexts, session_key};
use crate::alg::{Algorithm, CipherAlg, CipherMode};
use crate::backend::{CipherContext, CipherParams, Failed, SharedBackend};
use crate::buffer::{Buffer, IoBuf};
use crate::cost::Direction;
use crate::cpu::{CpuCipher, map_error};
use crate::error::{Error, LengthRule, RequestError};
use crate::key::SecretKey;
use crate::select::Request as Asked;
use crate::slot::Slots;

/// A keyed cipher session.
///
/// Requests take `&self`: one session can have many requests in flight, and
/// can be shared between tasks (`CipherSession` is `Send + Sync`). Dropping
/// the session releases its backend contexts (and, with hardware backends,
/// its power references).
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{CipherAlg, Offload};
///
/// let offload = Offload::builder().build()?;
/// let key: Vec<u8> = (0..64).collect();
/// let xts = offload.cipher(CipherAlg::Aes256Xts, &key).await?.with_data_unit(512)?;
/// let sector_7 = 7u128.to_le_bytes();
/// let ct = xts.encrypt(&sector_7, vec![0u8; 4096]).await?;   // sectors 7..15
/// let pt = xts.decrypt(&sector_7, ct).await?;
/// assert_eq!(pt, vec![0u8; 4096]);
/// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
/// ```
pub struct CipherSession {
    alg: CipherAlg,
    data_unit: Option<usize>,
    cpu: Arc<CpuCipher>,
    key: SecretKey,
    contexts: Contexts<dyn CipherContext>,
    slots: Arc<Slots>,
}

impl fmt::Debug for CipherSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CipherSession")
            .field("alg", &self.alg)
            .field("data_unit", &self.data_unit)
            .field("engines", &self.contexts.open_on(&self.slots))
            .finish_non_exhaustive()
    }
}

impl CipherSession {
    pub(crate) async fn start(
        slots: Arc<Slots>,
        alg: CipherAlg,
        key: &[u8],
    ) -> Result<Self, Error> {
        let secret = session_key(alg.into(), alg.key_len(), key)?;
        let cpu = Arc::new(slots.cpu.cipher(alg, key)?);
        let key = secret;
        let contexts = Contexts::open(&slots, alg.into(), |b| {
            let key = key.clone();
            async move { b.open_cipher(alg, &key).await }
        })
        .await?;
        Ok(CipherSession {
            alg,
            data_unit: None,
            cpu,
            key,
            contexts,
            slots,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> CipherAlg {
        self.alg
    }

    /// The backend a request of `len` bytes would go to now.
    pub fn backend_for(&self, dir: Direction, len: usize) -> &str {
        let unit = self.data_unit.unwrap_or(len);
        let asked = Asked {
            alg: self.alg.into(),
            dir,
            len,
            unit,
        };
        self.slots[crate::select::choose(&self.slots, &asked).0].name()
    }

    /// XTS: treats each request as consecutive data units of `len` bytes
    /// (512 or 4096 for disks), unit `i` taking tweak `iv + i` — one request
    /// then covers many sectors. Without it a request is one data unit.
    ///
    /// # Errors
    /// [`Error::DataLength`] if `len` < 16, or if the session is not XTS.
    pub fn with_data_unit(mut self, len: usize) -> Result<Self, Error> {
        if self.alg.mode() != CipherMode::Xts || len < 16 {
            return Err(Error::DataLength {
                alg: self.alg.into(),
                len,
                rule: LengthRule::DataUnitTooSmall,
            });
        }
        self.data_unit = Some(len);
        Ok(self)
    }

    /// The XTS data-unit length set with [`with_data_unit`](Self::with_data_unit).
    pub fn data_unit(&self) -> Option<usize> {
        self.data_unit
    }

    /// Encrypts `buf` in place and returns it.
    ///
    /// `iv` is the CBC IV, the CTR initial counter block (the whole 128 bits
    /// count, big-endian, wrapping), or the XTS tweak of the first data unit
    /// (the sector number, 128-bit little-endian: sector `n` is
    /// `n.to_le_bytes()` for a `u128`); always 16 bytes, taken by value
    /// ([`IvInput`]: `[u8; 16]`, `&[u8; 16]` or a slice), so the request
    /// borrows only the session. (There is no `encrypt_sector(n, buf)`:
    /// on a CBC or CTR session it would take a sector number for an IV
    /// without complaint.)
    ///
    /// # Errors
    /// [`Error::IvLength`]; [`Error::DataLength`] for CBC data that is not
    /// whole blocks, XTS data under 16 bytes or not whole data units. The
    /// buffer comes back untouched in the [`RequestError`].
    ///
    /// # Cancel safety
    /// Dropping the future is safe at any point: on the CPU the work is done
    /// within one poll (or on the blocking pool, which finishes it); an
    /// engine keeps the buffer until it is done with it. The buffer is then
    /// lost to the caller.
    #[inline]
    pub fn encrypt<B: Buffer>(&self, iv: impl IvInput<16>, buf: B) -> CipherRequest<'_, B> {
        CipherRequest(Request::new(
            CipherOp {
                session: self,
                encrypt: true,
                iv: iv.into_block(),
            },
            buf,
        ))
    }

    /// Decrypts `buf` in place and returns it. See [`encrypt`](Self::encrypt).
    ///
    /// # Errors
    /// As for [`encrypt`](Self::encrypt).
    ///
    /// # Cancel safety
    /// As for [`encrypt`](Self::encrypt).
    #[inline]
    pub fn decrypt<B: Buffer>(&self, iv: impl IvInput<16>, buf: B) -> CipherRequest<'_, B> {
        CipherRequest(Request::new(
            CipherOp {
                session: self,
                encrypt: false,
                iv: iv.into_block(),
            },
            buf,
        ))
    }

    fn params(&self, iv: Result<[u8; 16], u32>, len: usize) -> Result<CipherParams, Error> {
        let alg: Algorithm = self.alg.into();
        let iv = iv.map_err(|given| Error::IvLength {
            alg,
            len: given as usize,
            expected: 16,
        })?;
        let rule = match self.alg.mode() {
            CipherMode::Cbc if !len.is_multiple_of(16) => Some(LengthRule::MultipleOfBlock),
            CipherMode::Xts if len < 16 => Some(LengthRule::AtLeastOneBlock),
            CipherMode::Xts => match self.data_unit {
                Some(u) if !len.is_multiple_of(u) => Some(LengthRule::MultipleOfDataUnit(u)),
                _ => None,
            },
            _ => None,
        };
        if let Some(rule) = rule {
            return Err(Error::DataLength { alg, len, rule });
        }
        Ok(CipherParams::new(iv, self.data_unit.unwrap_or(len)))
    }

    #[inline]
    fn run_cpu<B: Buffer>(
        &self,
        encrypt: bool,
        params: &CipherParams,
        mut buf: B,
    ) -> Result<B, RequestError<B>> {
        match self.cpu.run(encrypt, params, buf.bytes_mut()) {
            Ok(()) => Ok(buf),
            Err(e) => Err(RequestError::new(map_error(self.alg.into(), e), buf)),
        }
    }
}

/// The future of a [`CipherSession::encrypt`] or
/// [`decrypt`](CipherSession::decrypt) request.
///
/// A named, small future (not an `async fn`'s state machine): on the inline
/// CPU path it does the work in its first poll and moves only the buffer.
#[must_use = "futures do nothing unless awaited"]
pub struct CipherRequest<'a, B: Buffer>(Request<'a, CipherOp<'a>, B>);

impl<B: Buffer> Future for CipherRequest<'_, B> {
    type Output = Result<B, RequestError<B>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

impl<B: Buffer> fmt::Debug for CipherRequest<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.0.op();
        f.debug_struct("CipherRequest")
            .field("alg", &op.session.alg)
            .field("encrypt", &op.encrypt)
            .finish_non_exhaustive()
    }
}

/// A cipher request: its session, direction and IV (or the length of the
/// IV given, if it was not 16 bytes).
#[derive(Clone, Copy)]
pub(crate) struct CipherOp<'a> {
    session: &'a CipherSession,
    encrypt: bool,
    iv: Result<[u8; 16], u32>,
}

impl<'a, B: Buffer> Operation<'a, B> for CipherOp<'a> {
    type Params = CipherParams;
    type Ctx = dyn CipherContext;
    type EngineOut = IoBuf;
    type JobOut = ();
    type Output = B;
    type Caller = (&'a CipherSession, bool);
    const NAME: &'static str = "cipher";

    #[inline]
    fn alg(&self) -> Algorithm {
        self.session.alg.into()
    }

    #[inline]
    fn dir(&self) -> Direction {
        if self.encrypt {
            Direction::Encrypt
        } else {
            Direction::Decrypt
        }
    }

    #[inline]
    fn slots(&self) -> &'a Arc<Slots> {
        &self.session.slots
    }

    fn contexts(&self) -> &'a Contexts<dyn CipherContext> {
        &self.session.contexts
    }

    #[inline]
    fn check(&mut self, buf: &mut B) -> Result<CipherParams, Error> {
        self.session.params(self.iv, buf.bytes_mut().len())
    }

    #[inline]
    fn unit(params: &CipherParams, _len: usize) -> usize {
        // XTS over several data units: the unit (the whole request
        // otherwise).
        params.data_unit
    }

    #[inline]
    fn run_cpu(&mut self, params: &CipherParams, buf: B) -> Result<B, RequestError<B>> {
        self.session.run_cpu(self.encrypt, params, buf)
    }

    fn cpu_parts(&self, params: &CipherParams, len: usize, offered: usize) -> usize {
        let splits = self
            .session
            .cpu
            .split_step(self.encrypt, params, len)
            .is_some();
        if offered > 1 && splits { offered } else { 1 }
    }

    fn spawn_cpu(&self, params: CipherParams, mut buf: B, parts: usize) -> CpuJob<(), B> {
        let (cpu, encrypt) = (self.session.cpu.clone(), self.encrypt);
        tokio::task::spawn_blocking(move || {
            let r = cpu.run_split(encrypt, &params, buf.bytes_mut(), parts);
            (r, buf)
        })
    }

    fn job_done(&mut self, _: &CipherParams, (): (), buf: B) -> B {
        buf
    }

    fn caller(&self) -> Self::Caller {
        (self.session, self.encrypt)
    }

    fn open_context(
        (session, _): Self::Caller,
        backend: &'a SharedBackend,
    ) -> OpenContext<'a, dyn CipherContext> {
        backend.open_cipher(session.alg, &session.key)
    }

    fn call(
        (_, encrypt): Self::Caller,
        ctx: &'a dyn CipherContext,
        params: CipherParams,
        io: IoBuf,
    ) -> BoxedRequest<'a, IoBuf> {
        if encrypt {
            ctx.encrypt(params, io)
        } else {
            ctx.decrypt(params, io)
        }
    }

    fn engine_done(
        &mut self,
        _: &CipherParams,
        done: Result<IoBuf, Failed>,
    ) -> Result<Result<B, RequestError<B>>, Failed> {
        done.map(|io| Ok(B::from_io(io)))
    }
}
