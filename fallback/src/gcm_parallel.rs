//! AES-GCM over several cores: the CTR part split into chunks, each chunk's
//! GHASH computed on its own core, the pieces combined in GF(2¹²⁸).
//!
//! GHASH is a polynomial in H: for blocks P then Q,
//! `Z(P‖Q) = Z(P)·H^|Q| ⊕ Z(Q)`, where `Z` is the GHASH state after the
//! blocks (starting from zero) and `|Q|` counts Q's blocks. So the tag of
//! `A ‖ C₁ ‖ … ‖ Cₚ ‖ L` is assembled from each chunk's `Z(Cⱼ)·H` and a
//! handful of multiplications by powers of H (square-and-multiply: ~2·log₂
//! of the message's block count). The field multiplications are the `ghash`
//! crate's own (a one-block GHASH with key `a` over block `b` is `a·b`), so
//! no field arithmetic is written here.
//!
//! Each chunk's `Z(Cⱼ)·H` comes from the implementation the key runs on:
//! RustCrypto's `ghash` directly; with aws-lc, from a GCM seal of nothing
//! with the chunk as its AAD — aws-lc's hashing of AAD is its fastest GHASH
//! — whose tag is `E(J₀) ⊕ Z(Cⱼ)·H ⊕ Lⱼ·H` (`Lⱼ` the length block), all
//! known. That tag never leaves this module. The keystream is the key's CTR
//! implementation from counter `J₀ + 1 + offset/16` (a 96-bit nonce starts
//! the 32-bit counter at 2 and GCM's length limit keeps it from wrapping, so
//! a 128-bit counter gives the same blocks).

use ghash::GHash;
use ghash::universal_hash::UniversalHash;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

use crate::gcm::{NONCE_LEN, Tag, check_len};
use crate::{Ctr, Error, Gcm};

/// A field element, in GCM's byte order.
type Elem = [u8; 16];

/// The field's one (GCM's bit order: the first bit is x⁰).
const ONE: Elem = {
    let mut one = [0u8; 16];
    one[0] = 0x80;
    one
};

fn mul(a: &Elem, b: &Elem) -> Elem {
    let mut g = GHash::new(&(*a).into());
    g.update(&[(*b).into()]);
    g.finalize().into()
}

fn xor(a: &mut Elem, b: &Elem) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x ^= y);
}

/// `h^k`.
fn pow(h: &Elem, mut k: u64) -> Elem {
    let (mut acc, mut base) = (ONE, *h);
    while k > 0 {
        if k & 1 == 1 {
            acc = mul(&acc, &base);
        }
        base = mul(&base, &base);
        k >>= 1;
    }
    acc
}

/// GCM's length block for `a` bytes of AAD and `c` of text.
fn lengths(a: usize, c: usize) -> Elem {
    let mut l = [0u8; 16];
    l[..8].copy_from_slice(&((a as u64) * 8).to_be_bytes());
    l[8..].copy_from_slice(&((c as u64) * 8).to_be_bytes());
    l
}

fn blocks(len: usize) -> u64 {
    len.div_ceil(16) as u64
}

/// The per-request values every chunk needs.
struct Setup {
    ctr: Ctr,
    /// H = E(0¹²⁸), the hash key.
    h: Zeroizing<Elem>,
    /// E(J₀), the tag's mask.
    ek_j0: Zeroizing<Elem>,
    j0: u128,
}

impl Gcm {
    /// The fewest threads with which the `_parallel` calls beat the serial
    /// ones, for this build's default implementation. Each chunk is hashed
    /// in a pass of its own, so a core does more work than the fused serial
    /// code: measured here (16 MiB, AES-128), aws-lc's CTR runs at 9.7 GB/s
    /// and its GHASH at 23.6 against 12.4 GB/s for its fused GCM, so a core
    /// manages 6.9 GB/s of chunks and two cores only tie (12.5 GB/s); from
    /// three it pays. RustCrypto's GCM (2.4 GB/s) is slower than its own CTR
    /// (6.5) and GHASH (4.7) run apart, so two threads already give 5.2 GB/s.
    #[cfg(feature = "aws-lc")]
    pub const PARALLEL_MIN_THREADS: usize = 3;
    /// The fewest threads with which the `_parallel` calls beat the serial
    /// ones, for this build's default implementation (see the aws-lc build's
    /// note): RustCrypto's GCM (2.4 GB/s here) is slower than its own CTR
    /// (6.5) and GHASH (4.7) run apart, so two threads give 5.2 GB/s.
    #[cfg(not(feature = "aws-lc"))]
    pub const PARALLEL_MIN_THREADS: usize = 2;

    fn setup(&self, nonce: &[u8; NONCE_LEN]) -> Result<Setup, Error> {
        // The large requests' implementation (these are), or the CTR's own
        // choice where it has no CTR (ring).
        let ctr =
            match Ctr::with_implementation(self.key_bytes(), self.implementation_for(usize::MAX)) {
                Err(Error::Unavailable { .. }) => Ctr::new(self.key_bytes())?,
                other => other?,
            };
        let mut j0 = [0u8; 16];
        j0[..NONCE_LEN].copy_from_slice(nonce);
        j0[15] = 1;
        let mut h = Zeroizing::new([0u8; 16]);
        ctr.apply_keystream(&[0; 16], &mut h[..])?;
        let mut ek_j0 = Zeroizing::new([0u8; 16]);
        ctr.apply_keystream(&j0, &mut ek_j0[..])?;
        Ok(Setup {
            ctr,
            h,
            ek_j0,
            j0: u128::from_be_bytes(j0),
        })
    }

    /// `Z(data)·H`: the GHASH state after `data` (zero-padded to blocks)
    /// times H.
    fn hash_times_h(&self, s: &Setup, nonce: &[u8; NONCE_LEN], data: &[u8]) -> Result<Elem, Error> {
        if data.is_empty() {
            return Ok([0; 16]);
        }
        match self.implementation_for(usize::MAX) {
            // A fused GCM (aws-lc, ring): the tag of `data` as AAD.
            #[cfg(any(feature = "aws-lc", feature = "ring"))]
            imp if imp != crate::Implementation::RustCrypto => {
                // tag = E(J₀) ⊕ Z(data)·H ⊕ L·H, with L = lengths(data, 0).
                let mut w = self.seal_in_place_detached(nonce, data, &mut [])?;
                xor(&mut w, &s.ek_j0);
                xor(&mut w, &mul(&lengths(data.len(), 0), &s.h));
                Ok(w)
            }
            // RustCrypto (a GCM key runs on no other).
            _ => {
                let _ = nonce; // the hash key is all GHASH needs
                let mut g = GHash::new(&(*s.h).into());
                g.update_padded(data);
                Ok(mul(&g.finalize().into(), &s.h))
            }
        }
    }

    /// One chunk at byte `offset` of the text: hash and en/decrypt.
    fn chunk(
        &self,
        s: &Setup,
        nonce: &[u8; NONCE_LEN],
        offset: usize,
        chunk: &mut [u8],
        encrypt: bool,
    ) -> Result<Elem, Error> {
        let counter = s.j0.wrapping_add(1 + (offset / 16) as u128).to_be_bytes();
        if encrypt {
            s.ctr.apply_keystream(&counter, chunk)?;
            self.hash_times_h(s, nonce, chunk)
        } else {
            let w = self.hash_times_h(s, nonce, chunk)?;
            s.ctr.apply_keystream(&counter, chunk)?;
            Ok(w)
        }
    }

    /// Runs every chunk (the first on this thread, the rest on their own),
    /// and returns the tag.
    fn run_parallel(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        threads: usize,
        encrypt: bool,
    ) -> Result<Tag, Error> {
        check_len(data.len())?;
        let s = self.setup(nonce)?;
        let len = data.len();
        let per = blocks(len).div_ceil(threads.max(1) as u64).max(1) as usize * 16;
        let chunks: Vec<(usize, &mut [u8])> = data
            .chunks_mut(per)
            .enumerate()
            .map(|(i, c)| (i * per, c))
            .collect();
        let hashes: Vec<(usize, Result<Elem, Error>)> = std::thread::scope(|scope| {
            let mut iter = chunks.into_iter();
            let first = iter.next();
            let s = &s;
            let handles: Vec<_> = iter
                .map(|(offset, c)| {
                    let n = c.len();
                    (
                        n,
                        scope.spawn(move || self.chunk(s, nonce, offset, c, encrypt)),
                    )
                })
                .collect();
            let mut out = Vec::with_capacity(handles.len() + 1);
            if let Some((offset, c)) = first {
                let n = c.len();
                out.push((n, self.chunk(s, nonce, offset, c, encrypt)));
            }
            for (n, h) in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                out.push((n, r));
            }
            out
        });
        // S = Z(A)·H^(n+1) ⊕ Σ Z(Cⱼ)·H^(rⱼ+1) ⊕ L·H, with n the text's
        // blocks and rⱼ those after chunk j.
        let mut after = blocks(len);
        let mut tag = mul(&self.hash_times_h(&s, nonce, aad)?, &pow(&s.h, after));
        for (n, w) in hashes {
            let w = w?;
            after -= blocks(n);
            xor(&mut tag, &mul(&w, &pow(&s.h, after)));
        }
        xor(&mut tag, &mul(&lengths(aad.len(), len), &s.h));
        xor(&mut tag, &s.ek_j0);
        Ok(tag)
    }

    /// [`seal_in_place_detached`](Gcm::seal_in_place_detached) on up to
    /// `threads` cores at once (scoped threads; the calling thread takes the
    /// first chunk). The same ciphertext and tag, whatever `threads`.
    ///
    /// Each chunk is hashed in a pass of its own, so a core does more work
    /// than the fused serial code: see
    /// [`PARALLEL_MIN_THREADS`](Gcm::PARALLEL_MIN_THREADS) for when it pays.
    ///
    /// # Errors
    /// As [`seal_in_place_detached`](Gcm::seal_in_place_detached).
    pub fn seal_in_place_detached_parallel(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        threads: usize,
    ) -> Result<Tag, Error> {
        if threads <= 1 {
            return self.seal_in_place_detached(nonce, aad, data);
        }
        self.run_parallel(nonce, aad, data, threads, true)
    }

    /// [`open_in_place_detached`](Gcm::open_in_place_detached) on up to
    /// `threads` cores at once. The chunks are decrypted as they are hashed;
    /// if the tag then does not verify, all of `data` is overwritten with
    /// zeros before this returns, so no unauthenticated plaintext is
    /// released.
    ///
    /// # Errors
    /// As [`open_in_place_detached`](Gcm::open_in_place_detached).
    pub fn open_in_place_detached_parallel(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &Tag,
        threads: usize,
    ) -> Result<(), Error> {
        if threads <= 1 {
            return self.open_in_place_detached(nonce, aad, data, tag);
        }
        match self.run_parallel(nonce, aad, data, threads, false) {
            Ok(expected) if bool::from(expected.ct_eq(tag)) => Ok(()),
            Ok(_) => {
                data.zeroize();
                Err(Error::Authentication)
            }
            Err(e @ Error::DataLength { .. }) => Err(e),
            Err(e) => {
                data.zeroize();
                Err(e)
            }
        }
    }
}
