//! Reflected CRC-64s folded 128 bits at a time with PCLMULQDQ: the CRC-64
//! path for inputs too long for a table walk and too short for crc-fast's
//! 512-bit loop.
//!
//! crc-fast (1.10) runs CRC-64 on its VPCLMULQDQ (AVX-512) loop for every
//! input of 256 bytes or more where the CPU has one, and that loop costs
//! ~30 ns before its first byte. On an Intel Xeon family 6 model 207
//! (Emerald Rapids) `paired --group crc-64 --all` put it at 32–37 ns for
//! 256 and 512 bytes, where crc64fast-nvme's 128-bit folding took 15–23
//! and 25–32 ns (median ratio 0.46 at 256 B). Neither crate can be asked
//! for the other loop: crc-fast picks its loop per CPU, once, inside; the
//! crc64fast crates each cover one CRC-64, and the NVMe one exports
//! unprefixed C symbols (`digest_new`, ...) into every link. So this is
//! the textbook fold (Intel's "Fast CRC Computation for Generic Polynomials
//! Using PCLMULQDQ"), for any reflected CRC-64, with its constants computed
//! at compile time from the polynomial; its figures against both crates are
//! in the fallback's README.
//!
//! # The arithmetic
//!
//! A 16-byte block loaded little-endian is a 128-bit value whose bit `k`
//! is the coefficient of `x^(127-k)`: its low lane `L` holds the high
//! powers, so the block is `L·x^64 + H`. Carrying a block `d` bits forward
//! is `L·x^(d+64) + H·x^d`, and modulo `P` that is two carry-less products
//! with 64-bit constants. A carry-less product of two such reflected lanes
//! comes out one bit short of the 128-bit layout (it is the product times
//! `x`), so the constants are `x^(d+63) mod P` and `x^(d-1) mod P`. The
//! last block `X` is reduced as `X·x^64 mod P` (the CRC of a message `M`
//! is `M·x^64 mod P` once the running value is added to its first 64 bits):
//! one more fold brings it to `A·x^64 + B` with 64-bit `A` and `B`, and
//! Barrett reduction takes `A·x^64` below `P` with two products.

/// A reflected CRC-64's folding constants, computed from its polynomial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc64Fold {
    /// `[x^(d+63) mod P, x^(d-1) mod P]`, reflected, for `d` = 128·(j+1)
    /// bits: carrying a block `j + 1` blocks forward (up to 14).
    fold: [[u64; 2]; CARRIES],
    /// `x^127 mod P`, reflected: the last block's high half times `x^128`.
    last: u64,
    /// `floor(x^128 / P)` without its `x^0` term, reflected over 65 bits
    /// (bit `i` is the coefficient of `x^(64-i)`).
    mu: u64,
    /// `P` without its `x^0` term, reflected the same way.
    poly: u64,
    /// The byte-at-a-time step for inputs shorter than a block: `P`
    /// reflected over 64 bits.
    reflected: u64,
}

/// The longest carry, in blocks: the first of eight accumulators past up
/// to seven blocks left over (14), or the first of up to 15 blocks.
const CARRIES: usize = 14;

/// `x^e mod P` for `P = x^64 + poly` (unreflected: bit `i` is `x^i`).
const fn x_pow_mod(e: u32, poly: u64) -> u64 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < e {
        let carry = r >> 63;
        r <<= 1;
        if carry == 1 {
            r ^= poly;
        }
        i += 1;
    }
    r
}

/// `floor(x^128 / P)` for `P = x^64 + poly`: 65 bits, unreflected.
const fn barrett_mu(poly: u64) -> u128 {
    let p = (1u128 << 64) | poly as u128;
    // x^128 divided by P: its leading quotient term x^64 leaves
    // x^128 - x^64·P = poly·x^64.
    let mut q: u128 = 1 << 64;
    let mut r: u128 = (poly as u128) << 64;
    let mut i = 127;
    while i >= 64 {
        if (r >> i) & 1 == 1 {
            q |= 1 << (i - 64);
            r ^= p << (i - 64);
        }
        i -= 1;
    }
    q
}

impl Crc64Fold {
    /// The constants of the CRC-64 whose unreflected polynomial (without
    /// its `x^64` term, as CRC catalogues give it) is `poly`.
    ///
    /// # Panics
    /// If `poly` has no `x^0` term (an even number): the Barrett step
    /// relies on it, and every CRC polynomial has one. A constant made
    /// from one fails to compile.
    pub const fn new(poly: u64) -> Crc64Fold {
        assert!(poly & 1 == 1, "a CRC polynomial has an x^0 term");
        let mut fold = [[0; 2]; CARRIES];
        let mut j = 0;
        while j < CARRIES {
            let d = 128 * (j as u32 + 1);
            fold[j] = [
                x_pow_mod(d + 63, poly).reverse_bits(),
                x_pow_mod(d - 1, poly).reverse_bits(),
            ];
            j += 1;
        }
        Crc64Fold {
            fold,
            last: x_pow_mod(127, poly).reverse_bits(),
            mu: ((barrett_mu(poly) >> 1) as u64).reverse_bits(),
            poly: ((((1u128 << 64) | poly as u128) >> 1) as u64).reverse_bits(),
            reflected: poly.reverse_bits(),
        }
    }

    /// CRC-64/NVME (`0xad93d23594c93659`).
    pub const NVME: Crc64Fold = Crc64Fold::new(0xad93_d235_94c9_3659);
    /// CRC-64/XZ (ECMA-182, `0x42f0e1eba9ea3693`).
    pub const XZ: Crc64Fold = Crc64Fold::new(0x42f0_e1eb_a9ea_3693);
    /// CRC-64/GO-ISO (`0x1b`).
    pub const GO_ISO: Crc64Fold = Crc64Fold::new(0x1b);

    /// Continues the CRC register `state` (the value before the final XOR;
    /// all ones at the start of a CRC whose `init` is all ones) over
    /// `data`. Inputs shorter than 16 bytes go a byte at a time: callers
    /// fold from where that loses to a table, well above it.
    #[inline]
    pub fn update(&self, clmul: Clmul, state: u64, data: &[u8]) -> u64 {
        if data.len() < 16 {
            return self.bytewise(state, data);
        }
        let _ = clmul;
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `Clmul` exists only where `Clmul::detect` found
            // PCLMULQDQ, SSSE3 and SSE4.1 on this CPU, all `fold` asks for.
            unsafe { x86::fold(self, state, data) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.bytewise(state, data)
        }
    }

    /// One bit at a time (reflected): inputs under a block.
    fn bytewise(&self, mut state: u64, data: &[u8]) -> u64 {
        for &b in data {
            state ^= u64::from(b);
            for _ in 0..8 {
                state = (state >> 1) ^ (self.reflected & (state & 1).wrapping_neg());
            }
        }
        state
    }
}

/// Proof that this CPU carries out [`Crc64Fold::update`]'s instructions
/// (PCLMULQDQ, SSSE3 and SSE4.1), from [`Clmul::detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clmul(());

impl Clmul {
    /// `Some` where the CPU has PCLMULQDQ, SSSE3 and SSE4.1 (x86-64
    /// only; each asked for, as a hypervisor may hide one alone).
    pub fn detect() -> Option<Clmul> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("ssse3")
            && std::arch::is_x86_feature_detected!("sse4.1")
        {
            return Some(Clmul(()));
        }
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm_clmulepi64_si128, _mm_extract_epi64, _mm_loadu_si128, _mm_set_epi64x,
        _mm_setzero_si128, _mm_shuffle_epi8, _mm_srli_si128, _mm_xor_si128,
    };

    use super::Crc64Fold;

    /// 16 bytes, loaded little-endian.
    #[inline(always)]
    fn load(block: &[u8]) -> __m128i {
        let block: &[u8; 16] = block.try_into().expect("a 16-byte block");
        // SAFETY: `block` is 16 readable bytes; `loadu` has no alignment
        // requirement.
        unsafe { _mm_loadu_si128(block.as_ptr().cast()) }
    }

    /// A constant pair `[lo, hi]` as one register.
    #[inline(always)]
    fn load_pair(pair: &[u64; 2]) -> __m128i {
        // SAFETY: `pair` is 16 readable bytes, `lo` first (little-endian).
        unsafe { _mm_loadu_si128(pair.as_ptr().cast()) }
    }

    /// `pshufb` masks: from byte `r` on, 16 - `r` zeros then bytes 0..`r`
    /// (a block moved `16 - r` bytes up).
    static UP: [u8; 32] = {
        let mut t = [0x80; 32];
        let mut i = 16;
        while i < 32 {
            t[i] = (i - 16) as u8;
            i += 1;
        }
        t
    };
    /// From byte `r` on: bytes `r`..16 then zeros (a block moved `r` bytes
    /// down).
    static DOWN: [u8; 32] = {
        let mut t = [0x80; 32];
        let mut i = 0;
        while i < 16 {
            t[i] = i as u8;
            i += 1;
        }
        t
    };

    /// `x ⊕ b·x^(128·d)`, reduced: `b` carried `d` blocks forward onto `x`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    fn add(c: &Crc64Fold, x: __m128i, b: __m128i, d: usize) -> __m128i {
        if d == 0 {
            return _mm_xor_si128(x, b);
        }
        let k = load_pair(&c.fold[d - 1]);
        let (lo, hi) = products(b, k);
        _mm_xor_si128(x, _mm_xor_si128(lo, hi))
    }

    /// The two lanes' products: `b.lo·k.lo` and `b.hi·k.hi`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    fn products(b: __m128i, k: __m128i) -> (__m128i, __m128i) {
        (
            _mm_clmulepi64_si128::<0x00>(b, k),
            _mm_clmulepi64_si128::<0x11>(b, k),
        )
    }

    /// The register after `data` (at least 16 bytes) from `state`.
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    pub(super) fn fold(c: &Crc64Fold, state: u64, data: &[u8]) -> u64 {
        // The message as whole blocks: 16 - r zero bytes ahead of it
        // change nothing (a register of 0 stays 0 over zeros), so the
        // first two blocks are 16 - r zeros and the first 16 + r bytes,
        // the running value added to the first 8, and the rest of `data`
        // is whole blocks.
        let r = data.len() % 16;
        let s = _mm_set_epi64x(0, state as i64);
        let b0 = _mm_shuffle_epi8(_mm_xor_si128(load(&data[..16]), s), load(&UP[r..r + 16]));
        let b1 = _mm_xor_si128(
            load(&data[r..r + 16]),
            _mm_shuffle_epi8(s, load(&DOWN[r..r + 16])),
        );
        let mut rest = &data[16 + r..];
        let left = rest.len() / 16;
        let mut x = _mm_setzero_si128();
        if left < 14 {
            // Up to 15 blocks: each carried to the last in one step.
            x = add(c, x, b0, left + 1);
            x = add(c, x, b1, left);
            for (i, b) in rest.chunks_exact(16).enumerate() {
                x = add(c, x, load(b), left - 1 - i);
            }
        } else {
            // Eight blocks in flight, each carried 1024 bits a step, ...
            let mut acc = [b0, b1, x, x, x, x, x, x];
            for (a, b) in acc[2..].iter_mut().zip(rest.chunks_exact(16)) {
                *a = load(b);
            }
            rest = &rest[96..];
            let k8 = load_pair(&c.fold[7]);
            while rest.len() >= 128 {
                let (eight, tail) = rest.split_at(128);
                for (a, b) in acc.iter_mut().zip(eight.chunks_exact(16)) {
                    let (lo, hi) = products(*a, k8);
                    *a = _mm_xor_si128(_mm_xor_si128(lo, hi), load(b));
                }
                rest = tail;
            }
            // ... then they and the blocks left carried to the last.
            let left = rest.len() / 16;
            for (j, a) in acc.iter().enumerate() {
                x = add(c, x, *a, 7 - j + left);
            }
            for (i, b) in rest.chunks_exact(16).enumerate() {
                x = add(c, x, load(b), left - 1 - i);
            }
        }

        // x·x^64 mod P: the low lane times x^128 leaves A·x^64 + B ...
        let z = _mm_clmulepi64_si128::<0x00>(x, _mm_set_epi64x(0, c.last as i64));
        let w = _mm_xor_si128(z, _mm_srli_si128::<8>(x));
        // ... and Barrett takes A·x^64 below P.
        let t1 = _mm_clmulepi64_si128::<0x00>(w, _mm_set_epi64x(0, c.mu as i64));
        let t2 = _mm_clmulepi64_si128::<0x00>(t1, _mm_set_epi64x(0, c.poly as i64));
        let hi = _mm_extract_epi64::<1>(_mm_xor_si128(t2, w)) as u64;
        let t1_lo = _mm_extract_epi64::<0>(t1) as u64;
        hi ^ t1_lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(alg: &'static crc::Algorithm<u64>, data: &[u8]) -> u64 {
        crc::Crc::<u64>::new(alg).checksum(data)
    }

    const ALL: [(Crc64Fold, &crc::Algorithm<u64>); 3] = [
        (Crc64Fold::NVME, &crc::CRC_64_NVME),
        (Crc64Fold::XZ, &crc::CRC_64_XZ),
        (Crc64Fold::GO_ISO, &crc::CRC_64_GO_ISO),
    ];

    fn data(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn every_length_to_1100_matches_the_catalogue() {
        let Some(clmul) = Clmul::detect() else {
            eprintln!("no PCLMULQDQ here: the fold is not tested");
            return;
        };
        for (fold, alg) in ALL {
            for len in 0..1100 {
                let d = data(len, len as u32);
                let ours = fold.update(clmul, u64::MAX, &d) ^ u64::MAX;
                assert_eq!(ours, reference(alg, &d), "{} at {len} B", alg.check);
            }
        }
    }

    #[test]
    fn a_crc_split_anywhere_is_the_crc_of_the_whole() {
        let Some(clmul) = Clmul::detect() else {
            return;
        };
        let d = data(700, 7);
        for (fold, alg) in ALL {
            let whole = reference(alg, &d);
            for at in (0..700).step_by(13) {
                let s = fold.update(clmul, u64::MAX, &d[..at]);
                let s = fold.update(clmul, s, &d[at..]);
                assert_eq!(s ^ u64::MAX, whole, "split at {at}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "x^0 term")]
    fn a_polynomial_without_its_x0_term_is_refused() {
        let _ = std::hint::black_box(Crc64Fold::new)(0xe173_e9b9_3883_00f8);
    }

    /// Other reflected CRC-64s than the three constants: the constants
    /// are computed for any polynomial.
    #[test]
    fn other_catalogue_crc64s_fold_too() {
        let Some(clmul) = Clmul::detect() else {
            return;
        };
        for alg in [&crc::CRC_64_MS, &crc::CRC_64_REDIS] {
            assert!(alg.refin && (alg.init == !0 || alg.init == 0));
            let fold = Crc64Fold::new(alg.poly);
            for len in [0, 9, 16, 100, 255, 256, 1000, 4097] {
                let d = data(len, 3);
                let s = fold.update(clmul, alg.init, &d) ^ alg.xorout;
                assert_eq!(s, reference(alg, &d), "{len} B");
            }
        }
    }

    #[test]
    fn the_catalogue_check_values() {
        for (fold, alg) in ALL {
            // 9 bytes: the byte-at-a-time path.
            let s = fold.bytewise(u64::MAX, b"123456789");
            assert_eq!(s ^ u64::MAX, alg.check);
            if let Some(clmul) = Clmul::detect() {
                let long = b"123456789123456789";
                assert_eq!(
                    fold.update(clmul, u64::MAX, long) ^ u64::MAX,
                    reference(alg, long)
                );
            }
        }
    }
}
