//! XTS-AES-256 on AWS-LC's EVP interface (feature `aws-lc`): aws-lc-rs has
//! no XTS, and AWS-LC's own (AES-NI, and VAES-512 where the CPU has
//! AVX-512) ran at 1.2–2.4× `crypto-offload-fallback`'s on the two AMD
//! machines measured (`fallback/README.md`).
//!
//! An `EVP_CIPHER_CTX` holds the key schedules *and* the current data
//! unit's tweak, so one context cannot serve two threads at once. [`Xts256`]
//! keeps one keyed context as a template that is never run, and runs each
//! request on a context of its own: the one in the first of a few slots
//! that holds an idle one, or a copy of the template when every slot's is
//! in use (more requests at once than slots; the copy is freed
//! afterwards). Each data unit re-arms the context with its tweak only: the
//! key schedule is made once, in [`Xts256::new`].
//!
//! The first [`OWN`] threads to run requests on a key (per direction) each
//! get a context of their own, copied from the template on their first
//! request and kept in a [`ThreadLocal`]: a request on it takes no lock and
//! no locked instruction. Other threads take a slot's.
//!
//! A slot owns one context for its life (copied from the template the first
//! time the slot is taken). Taking it is one atomic swap that leaves the
//! slot empty; only the request that took it puts it back, with a plain
//! store, since nothing else writes an empty slot. An earlier version
//! returned contexts with a compare-and-swap into any empty slot: the two
//! locked instructions cost ~20 ns a request on an Intel Xeon (family 6
//! model 207; a swap and a store ~9), a third of a 64-byte request. The
//! swap alone still cost ~5 ns there: `paired --group xts-256 --all` put
//! ours at 0.89–0.92 of AWS-LC's EVP XTS called directly at 64–256 B with
//! it, and level (0.98–1.02) without it.
//!
//! So a key holds at most `1 + OWN + SPARES` contexts per direction (~700
//! bytes each: two AES-256 key schedules and the `EVP_CIPHER_CTX`), and
//! more only while more requests than that run at once. A thread that
//! exits leaves its context to the next thread given its id
//! (`thread_local` reuses ids, lowest first), not to the allocator, until
//! the key is dropped; a context a request failed on is freed and its
//! place given back. Which threads have the [`OWN`] places is first come,
//! first served: a thread that has none keeps taking slots (asking again
//! each request costs one relaxed load). Besides the contexts, each
//! direction holds the `ThreadLocal` inline (64 words) and, for the
//! threads with a place only, `thread_local`'s bucket holding their id
//! (16 bytes an entry, 2^⌊log2(id + 1)⌋ entries: ids count the threads
//! that use any `ThreadLocal` at once, process-wide).
//!
//! Two limits come with `thread_local` (as for crypto-offload's request
//! counters): a thread's first use of any `ThreadLocal` takes the crate's
//! id lock, so in a child forked while another thread held it, a thread's
//! first request would wait for ever; and a request made from a
//! thread-local destructor that runs after `thread_local`'s own has run
//! panics there (which aborts).
//!
//! With AWS-LC's default allocator the key schedules are wiped when a
//! context is freed (`OPENSSL_free` cleanses every allocation it returns);
//! a process that installs its own (`CRYPTO_set_mem_functions`) gets them
//! unwiped in its free hook (`tests/xts_review.rs` shows it). The key this
//! crate is given stays the caller's.

use core::cell::Cell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use subtle::ConstantTimeEq;
use thread_local::ThreadLocal;

use aws_lc_sys::{
    CRYPTO_library_init, EVP_CIPHER_CTX, EVP_CIPHER_CTX_copy, EVP_CIPHER_CTX_free,
    EVP_CIPHER_CTX_new, EVP_Cipher, EVP_CipherInit_ex, EVP_aes_256_xts,
};

/// Why an [`Xts256`] call did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XtsError {
    /// The two halves of the key are equal (IEEE 1619 and FIPS forbid
    /// it; AWS-LC refuses such a key).
    #[error("XTS key halves are equal")]
    EqualHalves,
    /// A data unit shorter than 16 bytes or longer than
    /// [`Xts256::MAX_UNIT`], or one that does not divide the data.
    #[error("data of {len} bytes cannot be run as {unit_len}-byte XTS data units")]
    UnitLength {
        /// The data unit length asked for.
        unit_len: usize,
        /// The data's length.
        len: usize,
    },
    /// AWS-LC reported a failure (out of memory, or a call it refused).
    /// Data units before the failing one have been processed in place.
    #[error("AWS-LC's XTS failed")]
    Failed,
}

/// An XTS-AES-256 key (Key1 ‖ Key2, 64 bytes) on AWS-LC, usable from any
/// number of threads at once.
///
/// The tweak of a data unit is its 16-byte sequence number as a
/// little-endian integer (what dm-crypt's `plain64`, Linux's `xts(aes)` and
/// OpenSSL take); ciphertext stealing covers data units that are not a
/// whole number of blocks.
///
/// ```
/// use crypto_offload_native::Xts256;
///
/// let mut key = [0u8; 64];
/// key[32] = 1; // Key2 must differ from Key1
/// let xts = Xts256::new(&key).unwrap();
/// let mut sectors = vec![7u8; 3 * 512];
/// xts.encrypt_units(&5u128.to_le_bytes(), 512, &mut sectors).unwrap();
/// xts.decrypt_units(&5u128.to_le_bytes(), 512, &mut sectors).unwrap();
/// assert!(sectors.iter().all(|&b| b == 7));
/// ```
pub struct Xts256 {
    enc: Contexts,
    dec: Contexts,
}

impl core::fmt::Debug for Xts256 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Xts256").finish_non_exhaustive()
    }
}

impl Xts256 {
    /// The key length: two AES-256 keys.
    pub const KEY_LEN: usize = 64;

    /// The longest data unit AWS-LC takes: 2^20 blocks (IEEE 1619-2018 and
    /// NIST SP 800-38E).
    pub const MAX_UNIT: usize = 16 << 20;

    /// Expands `key` (Key1 ‖ Key2) for both directions.
    ///
    /// # Errors
    /// [`XtsError::EqualHalves`] when Key1 = Key2; [`XtsError::Failed`] when
    /// AWS-LC cannot allocate a context.
    pub fn new(key: &[u8; 64]) -> Result<Self, XtsError> {
        if bool::from(key[..32].ct_eq(&key[32..])) {
            return Err(XtsError::EqualHalves);
        }
        Ok(Xts256 {
            enc: Contexts::new(key, Direction::Encrypt)?,
            dec: Contexts::new(key, Direction::Decrypt)?,
        })
    }

    /// Encrypts consecutive data units of `unit_len` bytes in place; unit
    /// `i` has tweak `first_tweak + i` (little-endian, wrapping at 2^128).
    ///
    /// # Errors
    /// [`XtsError::UnitLength`] (nothing is touched), [`XtsError::Failed`].
    pub fn encrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        self.enc.run(first_tweak, unit_len, data)
    }

    /// Decrypts consecutive data units in place. See
    /// [`Xts256::encrypt_units`].
    ///
    /// # Errors
    /// As for [`Xts256::encrypt_units`].
    pub fn decrypt_units(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        self.dec.run(first_tweak, unit_len, data)
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Encrypt,
    Decrypt,
}

/// How many contexts a direction keeps for reuse: more requests at once
/// than this copy the template (~0.1 µs here) and free the copy afterwards.
const SPARES: usize = 4;

/// How many threads get a context of their own, per key and direction:
/// the first this many to run a request on it.
const OWN: usize = 8;

/// One direction's contexts: a keyed template, the per-thread ones and the
/// slots.
struct Contexts {
    /// Keyed, never run, never handed out: only read (copied) after `new`.
    template: Ctx,
    /// The calling thread's own context: `Some` while idle; `None` while a
    /// request runs on it, and in a thread without a place (it came after
    /// [`OWN`] others had theirs, or its copy or a request failed), which
    /// takes slots and asks for a place again each request.
    own: ThreadLocal<Cell<Option<Ctx>>>,
    /// How many per-thread contexts exist (at most [`OWN`]).
    owners: AtomicUsize,
    /// Each slot is [`unfilled`] until a request first takes it, then its
    /// own context while idle and null while a request runs on it. A
    /// context a request failed on is freed and its slot left unfilled.
    slots: [AtomicPtr<EVP_CIPHER_CTX>; SPARES],
}

/// What [`unfilled`] points to: a static's address, which no allocator
/// can return for a context.
static UNFILLED: u8 = 0;

/// The mark of a slot that holds no context and is not taken: never
/// dereferenced or freed.
fn unfilled() -> *mut EVP_CIPHER_CTX {
    ptr::from_ref(&UNFILLED).cast_mut().cast()
}

/// A context a request runs on: a slot's, which [`Taken::give_back`] puts
/// back in its slot, or a copy of the template. Dropped otherwise (the
/// request failed, or unwound), it frees the context and leaves its slot
/// unfilled, for a later request to fill with a fresh copy.
struct Taken<'a> {
    ctx: NonNull<EVP_CIPHER_CTX>,
    slot: Option<&'a AtomicPtr<EVP_CIPHER_CTX>>,
}

impl Taken<'_> {
    /// Puts a slot's context back in its slot (which stayed empty while it
    /// was out: no one else writes an empty slot), or frees a copy.
    fn give_back(self) {
        if let Some(slot) = self.slot {
            slot.store(self.ctx.as_ptr(), Ordering::Release);
            core::mem::forget(self);
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.store(unfilled(), Ordering::Release);
        }
        drop(Ctx(self.ctx));
    }
}

impl Contexts {
    fn new(key: &[u8; 64], dir: Direction) -> Result<Self, XtsError> {
        // The CPU features AWS-LC runs by, read before the key schedules
        // are laid out for them (`aes_block::expand` says why).
        // SAFETY: no preconditions; idempotent and thread-safe.
        unsafe { CRYPTO_library_init() };
        let template = Ctx::new()?;
        let enc = match dir {
            Direction::Encrypt => 1,
            Direction::Decrypt => 0,
        };
        // SAFETY: `template` is a live context this function owns;
        // EVP_aes_256_xts returns a static cipher; `key` is valid for the 64
        // bytes an AES-256-XTS key is read as; a null engine and IV are
        // allowed (the IV is set per data unit).
        let ok = unsafe {
            EVP_CipherInit_ex(
                template.0.as_ptr(),
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
                enc,
            )
        };
        if ok != 1 {
            return Err(XtsError::Failed);
        }
        Ok(Contexts {
            template,
            own: ThreadLocal::new(),
            owners: AtomicUsize::new(0),
            slots: core::array::from_fn(|_| AtomicPtr::new(unfilled())),
        })
    }

    /// The calling thread's own context, idle, moved out of its cell (and
    /// the cell, to put it back), or `None` for a thread that cannot have
    /// one now. A thread without a cell gets one (and with it a bucket of
    /// the `ThreadLocal`) only while fewer than [`OWN`] contexts exist; a
    /// thread whose cell is empty (it came after [`OWN`] others, or its
    /// copy or a request failed) asks again each request, a relaxed load
    /// once [`OWN`] contexts exist.
    #[inline]
    fn own_idle(&self) -> Option<(&Cell<Option<Ctx>>, Ctx)> {
        let cell = match self.own.get() {
            Some(cell) => cell,
            None if self.owners.load(Ordering::Relaxed) >= OWN => return None,
            None => self.own.get_or(|| Cell::new(None)),
        };
        match cell.take() {
            Some(ctx) => Some((cell, ctx)),
            None => self.own_context().map(|ctx| (cell, ctx)),
        }
    }

    /// A new context for a thread's own, if fewer than [`OWN`] exist: a
    /// copy of the template, counted in `owners` until [`Self::disown`]
    /// (or the key's drop) frees it.
    #[cold]
    fn own_context(&self) -> Option<Ctx> {
        self.owners
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < OWN).then_some(n + 1)
            })
            .ok()?;
        let ctx = self.copy().ok();
        if ctx.is_none() {
            self.owners.fetch_sub(1, Ordering::Relaxed);
        }
        ctx
    }

    /// Frees a thread's own context a request failed on (it is not reused)
    /// and gives its place back: the thread's next request makes another.
    #[cold]
    fn disown(&self, ctx: Ctx) {
        drop(ctx);
        self.owners.fetch_sub(1, Ordering::Relaxed);
    }

    /// The first idle slot's context, or a copy of the template.
    fn take(&self) -> Result<Taken<'_>, XtsError> {
        for slot in &self.slots {
            let p = slot.swap(ptr::null_mut(), Ordering::Acquire);
            if p == unfilled() {
                // This request fills the slot: it alone writes it now.
                return match self.copy() {
                    Ok(ctx) => Ok(Taken {
                        ctx: into_raw(ctx),
                        slot: Some(slot),
                    }),
                    Err(e) => {
                        slot.store(unfilled(), Ordering::Release);
                        Err(e)
                    }
                };
            }
            if let Some(ctx) = NonNull::new(p) {
                return Ok(Taken {
                    ctx,
                    slot: Some(slot),
                });
            }
        }
        Ok(Taken {
            ctx: into_raw(self.copy()?),
            slot: None,
        })
    }

    /// A keyed context of its own: a copy of the template.
    fn copy(&self) -> Result<Ctx, XtsError> {
        #[cfg(test)]
        if tests::fails(&tests::FAIL_COPIES) {
            return Err(XtsError::Failed);
        }
        let ctx = Ctx::new()?;
        // SAFETY: `ctx` is a live, fresh context owned here; the template is
        // live and keyed, and only read: EVP_CIPHER_CTX_copy takes it as
        // `const`, and XTS's copy hook (EVP_CTRL_COPY) reads it and writes
        // only the copy, so copies made at once on several threads do not
        // race.
        let ok = unsafe { EVP_CIPHER_CTX_copy(ctx.0.as_ptr(), self.template.0.as_ptr()) };
        if ok != 1 {
            return Err(XtsError::Failed);
        }
        Ok(ctx)
    }

    fn run(
        &self,
        first_tweak: &[u8; 16],
        unit_len: usize,
        data: &mut [u8],
    ) -> Result<(), XtsError> {
        // A lone unit (the usual request) is told apart without a
        // division: a 64-bit `div` is 5 ns or more, a tenth of a short
        // request, and the loop over several units pays another.
        let lone = data.len() == unit_len;
        if !(16..=Xts256::MAX_UNIT).contains(&unit_len)
            || !(lone || data.len().is_multiple_of(unit_len))
        {
            return Err(XtsError::UnitLength {
                unit_len,
                len: data.len(),
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        if let Some((cell, ctx)) = self.own_idle() {
            return if run_units(ctx.0.as_ptr(), first_tweak, unit_len, lone, data) {
                cell.set(Some(ctx));
                Ok(())
            } else {
                self.disown(ctx);
                Err(XtsError::Failed)
            };
        }
        let taken = self.take()?;
        if run_units(taken.ctx.as_ptr(), first_tweak, unit_len, lone, data) {
            taken.give_back();
            Ok(())
        } else {
            // A context that failed is freed, not reused (`Taken`'s drop).
            Err(XtsError::Failed)
        }
    }
}

/// Runs `data` (one unit when `lone`, else whole units of `unit_len`
/// bytes) in place on `ctx`, a live keyed context this call alone uses;
/// whether AWS-LC reported success for every unit.
#[inline(always)]
fn run_units(
    ctx: *mut EVP_CIPHER_CTX,
    first_tweak: &[u8; 16],
    unit_len: usize,
    lone: bool,
    data: &mut [u8],
) -> bool {
    #[cfg(test)]
    if tests::fails(&tests::FAIL_RUNS) {
        return false;
    }
    if lone {
        run_unit(ctx, first_tweak, data)
    } else {
        let mut sector = u128::from_le_bytes(*first_tweak);
        data.chunks_exact_mut(unit_len).all(|unit| {
            let tweak = sector.to_le_bytes();
            sector = sector.wrapping_add(1);
            run_unit(ctx, &tweak, unit)
        })
    }
}

/// Runs one data unit of 16 to [`Xts256::MAX_UNIT`] bytes in place on
/// `ctx`, a live keyed context this call alone uses; whether AWS-LC
/// reported success.
#[inline(always)]
fn run_unit(ctx: *mut EVP_CIPHER_CTX, tweak: &[u8; 16], unit: &mut [u8]) -> bool {
    // SAFETY: `ctx` is a live context keyed for this direction and owned
    // by this call (taken out of its slot, or a copy); a null cipher,
    // engine and key keep the key schedules, `tweak` is the 16 bytes XTS
    // reads as its IV, and -1 keeps the context's direction.
    let armed = unsafe {
        EVP_CipherInit_ex(
            ctx,
            ptr::null(),
            ptr::null_mut(),
            ptr::null(),
            tweak.as_ptr(),
            -1,
        )
    };
    if armed != 1 {
        return false;
    }
    let p = unit.as_mut_ptr();
    // EVP_Cipher calls the cipher directly; EVP_CipherUpdate would first
    // go through the buffering for partial blocks that XTS (block size 1,
    // the whole unit in one call) never uses.
    // SAFETY: `ctx` is armed with this unit's tweak (above); `p` is valid
    // for reads and writes of `unit.len()` bytes (16 to 2^24) and is both
    // input and output: AWS-LC's XTS reads each block before it writes it,
    // and writes exactly `unit.len()` bytes.
    unsafe { EVP_Cipher(ctx, p, p, unit.len()) == 1 }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let p = *slot.get_mut();
            if p != unfilled()
                && let Some(p) = NonNull::new(p)
            {
                drop(Ctx(p));
            }
        }
    }
}

/// An owned `EVP_CIPHER_CTX`, freed (and its key schedules wiped) on drop.
struct Ctx(NonNull<EVP_CIPHER_CTX>);

impl Ctx {
    fn new() -> Result<Self, XtsError> {
        // SAFETY: no preconditions; the result is an owned context or null.
        let ctx = NonNull::new(unsafe { EVP_CIPHER_CTX_new() })
            .map(Ctx)
            .ok_or(XtsError::Failed)?;
        #[cfg(test)]
        tests::LIVE.fetch_add(1, Ordering::SeqCst);
        Ok(ctx)
    }
}

/// The context `ctx` owned, now owned by the caller (a slot or a
/// [`Taken`]).
fn into_raw(ctx: Ctx) -> NonNull<EVP_CIPHER_CTX> {
    let p = ctx.0;
    core::mem::forget(ctx);
    p
}

impl Drop for Ctx {
    fn drop(&mut self) {
        #[cfg(test)]
        tests::LIVE.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: the context is live and owned by this value alone (never
        // in a slot while a `Ctx` holds it); it is not used afterwards.
        unsafe { EVP_CIPHER_CTX_free(self.0.as_ptr()) }
    }
}

// SAFETY: a context is plain heap memory AWS-LC does not tie to a thread;
// `Ctx` owns it exclusively.
unsafe impl Send for Ctx {}

// SAFETY: `Contexts` shares only the template across threads, and only for
// reading (EVP_CIPHER_CTX_copy, see `copy`); every context that is run is
// owned by one call at a time: a thread's own is reached only through
// `ThreadLocal::get_or`, which gives each thread its own entry (a later
// thread reusing an exited one's id gets that entry, never two threads at
// once), and is moved out of its cell while a request runs on it; a slot's
// is moved out by an atomic swap, which leaves the slot empty until that
// call stores it back.
unsafe impl Sync for Contexts {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    use core::sync::atomic::AtomicIsize;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// Contexts alive in this test process (made by `Ctx::new`, not yet
    /// freed).
    pub(super) static LIVE: AtomicIsize = AtomicIsize::new(0);

    /// How many of the next requests fail as if AWS-LC had refused them
    /// (before touching the data), and how many of the next copies of a
    /// template: the failure paths, which AWS-LC reaches only out of
    /// memory. Set only under `serial()`.
    pub(super) static FAIL_RUNS: AtomicUsize = AtomicUsize::new(0);
    pub(super) static FAIL_COPIES: AtomicUsize = AtomicUsize::new(0);

    /// Whether this call is one of the failures `counter` still holds.
    pub(super) fn fails(counter: &AtomicUsize) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Threads taking and returning contexts as fast as they can, one in
    /// eleven dropped as a failed request drops it: no context is ever
    /// held by two requests at once, every result is right, and dropping
    /// the key frees every context made (none leaked or freed twice).
    #[test]
    fn slots_under_contention_are_never_shared_and_all_freed() {
        let _one = serial();
        let before = LIVE.load(Ordering::SeqCst);
        let xts = Xts256::new(&key()).unwrap();
        let mut want = [7u8; 16];
        xts.encrypt_units(&[1; 16], 16, &mut want).unwrap();
        let owned = Mutex::new(HashSet::<usize>::new());
        let c = &xts.enc;
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let owned = &owned;
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for _ in 0..20_000 {
                        let taken = c.take().unwrap();
                        let p = taken.ctx.as_ptr() as usize;
                        assert_ne!(p, unfilled() as usize);
                        assert!(owned.lock().unwrap().insert(p), "two owners of {p:#x}");
                        let mut d = [7u8; 16];
                        assert!(run_unit(taken.ctx.as_ptr(), &[1; 16], &mut d));
                        assert_eq!(d, want);
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if x % 3 == 0 {
                            std::thread::yield_now();
                        }
                        assert!(owned.lock().unwrap().remove(&p));
                        if x % 11 == 0 {
                            drop(taken);
                        } else {
                            taken.give_back();
                        }
                    }
                });
            }
        });
        assert!(c.slots.iter().all(|s| !s.load(Ordering::Acquire).is_null()));
        let live = LIVE.load(Ordering::SeqCst) - before;
        // Two templates and at most every slot of both directions.
        assert!(live <= 2 + 2 * SPARES as isize, "{live} contexts live");
        drop(xts);
        assert_eq!(
            LIVE.load(Ordering::SeqCst),
            before,
            "contexts leaked or freed twice"
        );
    }

    /// The tests here make contexts, and one counts them all: they run
    /// one at a time.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static SERIAL: Mutex<()> = Mutex::new(());
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key() -> [u8; 64] {
        core::array::from_fn(|i| i as u8)
    }

    /// IEEE 1619-2007 vector 10 (XTS-AES-256, 512-byte unit, tweak 0xff).
    #[test]
    fn ieee_1619_vector_10() {
        let _one = serial();
        let key: [u8; 64] = hex(concat!(
            "2718281828459045235360287471352662497757247093699959574966967627",
            "3141592653589793238462643383279502884197169399375105820974944592"
        ))
        .try_into()
        .unwrap();
        let plain: Vec<u8> = (0..512).map(|i| i as u8).collect();
        let mut data = plain.clone();
        let xts = Xts256::new(&key).unwrap();
        xts.encrypt_units(&0xffu128.to_le_bytes(), 512, &mut data)
            .unwrap();
        assert_eq!(
            &data[..32],
            &hex("1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b")[..]
        );
        assert_eq!(
            &data[480..],
            &hex("773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151")[..]
        );
        xts.decrypt_units(&0xffu128.to_le_bytes(), 512, &mut data)
            .unwrap();
        assert_eq!(data, plain);
    }

    /// Bad lengths are refused before anything is touched; equal halves
    /// are refused.
    #[test]
    fn bad_lengths_and_equal_halves_are_refused() {
        let _one = serial();
        let xts = Xts256::new(&key()).unwrap();
        for (unit, len) in [
            (15, 15),
            (0, 0),
            (16, 24),
            (512, 1000),
            (Xts256::MAX_UNIT + 16, Xts256::MAX_UNIT + 16),
        ] {
            let mut data = vec![9u8; len];
            assert_eq!(
                xts.encrypt_units(&[0; 16], unit, &mut data),
                Err(XtsError::UnitLength {
                    unit_len: unit,
                    len
                }),
            );
            assert!(data.iter().all(|&b| b == 9));
        }
        assert_eq!(xts.encrypt_units(&[0; 16], 16, &mut []), Ok(()));
        assert_eq!(Xts256::new(&[3u8; 64]).unwrap_err(), XtsError::EqualHalves);
    }

    /// Many units in one call equal one call per unit with consecutive
    /// tweaks (wrapping at 2^128), for whole-block and stolen lengths.
    #[test]
    fn a_run_of_units_is_units_one_by_one() {
        let _one = serial();
        let xts = Xts256::new(&key()).unwrap();
        for unit in [16, 17, 31, 512, 520, 4096] {
            let first = u128::MAX - 1;
            let plain: Vec<u8> = (0..unit * 4).map(|i| (i * 7) as u8).collect();
            let mut whole = plain.clone();
            xts.encrypt_units(&first.to_le_bytes(), unit, &mut whole)
                .unwrap();
            let mut parts = plain.clone();
            for (i, u) in parts.chunks_mut(unit).enumerate() {
                let t = first.wrapping_add(i as u128);
                xts.encrypt_units(&t.to_le_bytes(), unit, u).unwrap();
            }
            assert_eq!(whole, parts, "unit {unit}");
            assert_ne!(whole, plain);
            xts.decrypt_units(&first.to_le_bytes(), unit, &mut whole)
                .unwrap();
            assert_eq!(whole, plain, "unit {unit}");
        }
    }

    fn filled(c: &Contexts) -> Vec<bool> {
        c.slots
            .iter()
            .map(|s| {
                let p = s.load(Ordering::Acquire);
                assert!(!p.is_null(), "a slot left empty with no request running");
                p != unfilled()
            })
            .collect()
    }

    /// The calling thread's own context in `c` (its address), if it has
    /// one; left in place.
    fn own_of(c: &Contexts) -> Option<usize> {
        let cell = c.own.get()?;
        let ctx = cell.take();
        let p = ctx.as_ref().map(|ctx| ctx.0.as_ptr() as usize);
        cell.set(ctx);
        p
    }

    /// One thread runs every request on a context of its own, made on its
    /// first request and reused after; no slot is filled, and the other
    /// direction makes none until it runs.
    #[test]
    fn a_thread_runs_on_a_context_of_its_own() {
        let _one = serial();
        let xts = Xts256::new(&key()).unwrap();
        assert_eq!(own_of(&xts.enc), None);
        let mut data = [3u8; 64];
        xts.encrypt_units(&[0; 16], 32, &mut data).unwrap();
        let first = own_of(&xts.enc).expect("an own context after a request");
        let live = LIVE.load(Ordering::SeqCst);
        for _ in 0..3 {
            let mut data = [3u8; 48];
            xts.encrypt_units(&[1; 16], 48, &mut data).unwrap();
        }
        // The same context, not one freed and made again at its address.
        assert_eq!(LIVE.load(Ordering::SeqCst), live);
        assert_eq!(own_of(&xts.enc), Some(first));
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), 1);
        assert_eq!(filled(&xts.enc), [false; SPARES]);
        assert_eq!(own_of(&xts.dec), None);
        assert_eq!(filled(&xts.dec), [false; SPARES]);
    }

    /// Runs `f(i)` on `n` threads at once and waits for every thread to
    /// end, its thread-local destructors included (the end of a scope
    /// waits only for the closures): the threads' `thread_local` ids are
    /// free again after, so a later test's threads reuse them in a known
    /// order (the lowest free id first).
    fn on_threads(n: usize, f: impl Fn(usize) + Sync) {
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
            for h in handles {
                h.join().unwrap();
            }
        });
    }

    /// Threads running at once: contexts of their own for the first that
    /// make [`OWN`] of them, slots for the rest, every result right, and
    /// dropping the key frees every context (the per-thread ones included).
    #[test]
    fn the_first_own_threads_get_their_own_and_the_rest_take_slots() {
        let _one = serial();
        let before = LIVE.load(Ordering::SeqCst);
        let xts = Xts256::new(&key()).unwrap();
        // On this thread: one of the OWN.
        let mut want = [7u8; 512];
        xts.encrypt_units(&[2; 16], 512, &mut want).unwrap();
        let threads = OWN + 3;
        let all_ran = std::sync::Barrier::new(threads);
        let owned = AtomicIsize::new(0);
        on_threads(threads, |_| {
            for _ in 0..50 {
                let mut d = [7u8; 512];
                xts.encrypt_units(&[2; 16], 512, &mut d).unwrap();
                assert_eq!(d, want);
            }
            if own_of(&xts.enc).is_some() {
                owned.fetch_add(1, Ordering::SeqCst);
            }
            // Every thread alive until all ran: none reuses the id (and
            // context) of one that exited.
            all_ran.wait();
        });
        assert_eq!(owned.load(Ordering::SeqCst), OWN as isize - 1);
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), OWN);
        // The other threads ran on slots.
        assert!(filled(&xts.enc).iter().any(|&f| f));
        let live = LIVE.load(Ordering::SeqCst) - before;
        assert!(
            live <= (2 + OWN + SPARES) as isize,
            "{live} contexts live: more than two templates, OWN and the slots"
        );
        drop(xts);
        assert_eq!(
            LIVE.load(Ordering::SeqCst),
            before,
            "contexts leaked or freed twice"
        );
    }

    /// A thread that exits leaves its context to the next thread given its
    /// id: threads one after another make one context between them, not
    /// one each (the memory bound in the module's docs), and later
    /// requests make none.
    #[test]
    fn threads_one_after_another_share_one_context() {
        let _one = serial();
        let before = LIVE.load(Ordering::SeqCst);
        let xts = Xts256::new(&key()).unwrap();
        let seen_by = Mutex::new(HashSet::new());
        for _ in 0..6 {
            on_threads(1, |_| {
                for _ in 0..3 {
                    let mut d = [1u8; 32];
                    xts.encrypt_units(&[0; 16], 32, &mut d).unwrap();
                }
                seen_by.lock().unwrap().insert(own_of(&xts.enc).unwrap());
            });
        }
        let seen = seen_by.into_inner().unwrap();
        // One context, handed from each thread to the next, when no other
        // thread frees an id meanwhile. Another test's thread (libtest
        // runs each test on a thread of its own, two at a time) that ends
        // while this runs frees a lower id, and the next thread here takes
        // that one and makes a context: hence up to three, not six.
        let made = seen.len();
        assert!(made <= 3, "a context per thread: {seen:?}");
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), made);
        // Two templates and those contexts: none freed and made again.
        assert_eq!(LIVE.load(Ordering::SeqCst) - before, 2 + made as isize);
    }

    /// A request that fails on a thread's own context frees it and gives
    /// its place back; the thread's next request makes another, and a
    /// failed copy leaves the place free for the request after.
    #[test]
    fn a_failed_request_replaces_the_threads_own_context() {
        let _one = serial();
        let before = LIVE.load(Ordering::SeqCst);
        let xts = Xts256::new(&key()).unwrap();
        let mut want = [4u8; 64];
        xts.encrypt_units(&[3; 16], 64, &mut want).unwrap();
        assert_eq!(LIVE.load(Ordering::SeqCst) - before, 3);
        FAIL_RUNS.store(1, Ordering::SeqCst);
        let mut d = [4u8; 64];
        assert_eq!(
            xts.encrypt_units(&[3; 16], 64, &mut d),
            Err(XtsError::Failed)
        );
        assert_eq!(own_of(&xts.enc), None);
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), 0);
        assert_eq!(
            LIVE.load(Ordering::SeqCst) - before,
            2,
            "the failed one freed"
        );
        // The next copy fails too: that request runs on a slot.
        FAIL_COPIES.store(1, Ordering::SeqCst);
        let mut d = [4u8; 64];
        xts.encrypt_units(&[3; 16], 64, &mut d).unwrap();
        assert_eq!(d, want);
        assert_eq!(own_of(&xts.enc), None);
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), 0);
        assert!(filled(&xts.enc)[0]);
        // The one after makes the thread's own again.
        let mut d = [4u8; 64];
        xts.encrypt_units(&[3; 16], 64, &mut d).unwrap();
        assert_eq!(d, want);
        assert!(own_of(&xts.enc).is_some());
        assert_eq!(xts.enc.owners.load(Ordering::Relaxed), 1);
        // A failure on a slot's context leaves the slot unfilled.
        let t = xts.enc.take().unwrap();
        FAIL_RUNS.store(1, Ordering::SeqCst);
        assert!(!run_units(t.ctx.as_ptr(), &[3; 16], 64, true, &mut d));
        drop(t);
        assert!(!filled(&xts.enc)[0]);
        drop(xts);
        assert_eq!(LIVE.load(Ordering::SeqCst), before);
    }

    /// Threads that start, run a few requests and exit, many at once and
    /// one after another, while the key lives: every result right, never
    /// more than [`OWN`] contexts of their own, all freed with the key.
    #[test]
    fn threads_coming_and_going_stay_within_own() {
        let _one = serial();
        let before = LIVE.load(Ordering::SeqCst);
        let xts = Xts256::new(&key()).unwrap();
        let mut want = vec![9u8; 1024];
        xts.encrypt_units(&[5; 16], 512, &mut want).unwrap();
        for round in 0..20 {
            on_threads(1 + round % 12, |t| {
                for _ in 0..=t {
                    let mut d = vec![9u8; 1024];
                    xts.encrypt_units(&[5; 16], 512, &mut d).unwrap();
                    assert_eq!(d, want);
                    xts.decrypt_units(&[5; 16], 512, &mut d).unwrap();
                    assert!(d.iter().all(|&b| b == 9));
                }
            });
            assert!(xts.enc.owners.load(Ordering::Relaxed) <= OWN);
            assert!(xts.dec.owners.load(Ordering::Relaxed) <= OWN);
            let live = LIVE.load(Ordering::SeqCst) - before;
            assert!(
                live <= 2 * (1 + OWN + SPARES) as isize,
                "{live} contexts live"
            );
        }
        drop(xts);
        assert_eq!(LIVE.load(Ordering::SeqCst), before);
    }

    /// Requests in flight take the slots in order, then copies (no slot);
    /// each slot gets its own context back. A context dropped after a
    /// failure (or an unwind) leaves its slot unfilled, and the next
    /// request there makes a fresh copy that gives the same bytes.
    #[test]
    fn slots_fill_in_order_and_a_discarded_context_is_replaced() {
        let _one = serial();
        let xts = Xts256::new(&key()).unwrap();
        let mut want = [5u8; 40];
        xts.encrypt_units(&[9; 16], 40, &mut want).unwrap();
        let c = &xts.enc;
        let taken: Vec<Taken<'_>> = (0..SPARES + 2).map(|_| c.take().unwrap()).collect();
        for (i, t) in taken.iter().enumerate() {
            match t.slot {
                Some(slot) => assert!(core::ptr::eq(slot, &c.slots[i])),
                None => assert!(i >= SPARES),
            }
        }
        assert!(c.slots.iter().all(|s| s.load(Ordering::Acquire).is_null()));
        let ptrs: Vec<_> = taken.iter().map(|t| t.ctx.as_ptr()).collect();
        let mut taken = taken.into_iter();
        // What a failed request does with its context: drops it.
        drop(taken.next().unwrap());
        for t in taken {
            t.give_back();
        }
        assert_eq!(c.slots[0].load(Ordering::Acquire), unfilled());
        for (slot, p) in c.slots.iter().zip(&ptrs).skip(1) {
            assert_eq!(slot.load(Ordering::Acquire), *p);
        }
        // The slot left unfilled gets a fresh copy, which gives the same
        // bytes.
        let t = c.take().unwrap();
        assert!(core::ptr::eq(t.slot.unwrap(), &c.slots[0]));
        let mut again = [5u8; 40];
        assert!(run_unit(t.ctx.as_ptr(), &[9; 16], &mut again));
        t.give_back();
        assert_eq!(again, want);
        assert_eq!(filled(c), [true; SPARES]);
    }

    /// More threads at once than spare contexts: every result right.
    #[test]
    fn more_callers_at_once_than_spare_contexts() {
        let _one = serial();
        let xts = Xts256::new(&key()).unwrap();
        let mut want = vec![1u8; 4096];
        xts.encrypt_units(&[0; 16], 512, &mut want).unwrap();
        on_threads(SPARES * 3, |_| {
            for _ in 0..200 {
                let mut data = vec![1u8; 4096];
                xts.encrypt_units(&[0; 16], 512, &mut data).unwrap();
                assert_eq!(data, want);
                xts.decrypt_units(&[0; 16], 512, &mut data).unwrap();
                assert!(data.iter().all(|&b| b == 1));
            }
        });
    }
}
