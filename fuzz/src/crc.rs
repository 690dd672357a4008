//! The `crc` target: every CRC (CRC-32/ISO-HDLC, CRC-32/ISCSI, CRC-64/NVME,
//! CRC-64/XZ, CRC-64/GO-ISO) streamed in pieces cut at arbitrary points, on
//! every subject, against the `crc` crate: after every piece the running
//! value and length, at the end `verify`, with owned (`update`) and borrowed
//! (`update_from_slice`) pieces, `Vec` and `BytesMut`, and a `reset`
//! midway. Then CRC combination, which the public API offers twice
//! (`crypto_offload::crc_combine`, and `crypto_offload_fallback::Crc::resume`
//! to continue a CRC computed elsewhere), at every cut. And the CRC-64
//! fold (`crypto_offload_native::Crc64Fold`, the `clmul` feature) on its
//! own, whole and in the same pieces, at every length the input has.

use arbitrary::Arbitrary;
use bytes::BytesMut;
use crypto_offload::{CrcAlg, Error};
use crypto_offload_fallback as fb;

use crate::reference::{self, CrcRef};
use crate::{Harness, Subject, mismatch, scaled, seed};

/// Pieces a stream is cut into (one more than the cuts).
pub const PIECES: usize = 7;

/// One input.
#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// `CrcAlg::ALL[alg % 5]`.
    pub alg: u8,
    /// Cut points (`u16`, little-endian, modulo the length + 1, sorted).
    pub cuts: [[u8; 2]; PIECES - 1],
    /// Bit `i`: piece `i` goes in by `update_from_slice` (else `update`).
    pub borrowed: u8,
    /// Bit `i`: piece `i` is a `BytesMut` (else a `Vec<u8>`).
    pub bytes_mut: u8,
    /// Below `PIECES`: the session is reset after that piece.
    pub reset: u8,
    /// See [`crate::scaled`].
    pub scale: u8,
    /// The data.
    #[arbitrary(with = crate::seed::rest)]
    pub data: Vec<u8>,
}

/// The data and where it is cut.
struct Case {
    alg: CrcAlg,
    data: Vec<u8>,
    /// `PIECES + 1` sorted offsets, from 0 to the length.
    bounds: Vec<usize>,
}

impl Case {
    fn new(input: &Input) -> Self {
        let alg = CrcAlg::ALL[usize::from(input.alg) % CrcAlg::ALL.len()];
        let data = scaled(&input.data, input.scale);
        let len = data.len();
        let mut bounds: Vec<usize> = input
            .cuts
            .iter()
            .map(|c| {
                let c = usize::from(u16::from_le_bytes(*c));
                // Large inputs are cut at scaled positions, so all of them
                // are reachable from a u16.
                if len > 0xffff {
                    c * (len / 0xffff)
                } else {
                    c % (len + 1)
                }
            })
            .collect();
        bounds.push(0);
        bounds.push(len);
        bounds.sort_unstable();
        Case { alg, data, bounds }
    }
}

/// Checks one input on every subject of `h`, then CRC combination.
pub fn check(h: &Harness, input: &Input) {
    let case = Case::new(input);
    let want = expected(&case, input);
    for s in h
        .subjects
        .iter()
        .filter(|s| s.runs(case.alg, case.data.len()))
    {
        h.block_on(check_subject(s, &case, input, &want));
    }
    check_combine(&case);
    #[cfg(feature = "clmul")]
    check_fold(&case);
}

/// The fallback's CRC-64 fold called directly, whatever lengths the
/// measurement sends it: the whole input, then piece by piece, each piece
/// continuing the register the last left.
#[cfg(feature = "clmul")]
fn check_fold(case: &Case) {
    use crypto_offload_native::{Clmul, Crc64Fold};
    let Some(clmul) = Clmul::detect() else {
        return;
    };
    let fold = match case.alg {
        CrcAlg::Crc64Nvme => Crc64Fold::NVME,
        CrcAlg::Crc64Xz => Crc64Fold::XZ,
        CrcAlg::Crc64GoIso => Crc64Fold::GO_ISO,
        _ => return,
    };
    let want = reference::crc(case.alg, &case.data);
    let whole = !fold.update(clmul, !0, &case.data);
    let mut state = !0;
    for w in case.bounds.windows(2) {
        state = fold.update(clmul, state, &case.data[w[0]..w[1]]);
    }
    if whole != want || !state != want {
        mismatch(
            "Crc64Fold",
            case.alg.name(),
            "checksum",
            case.data.len(),
            format_args!(
                "whole {whole:#x}, in pieces {:#x} ({:?}), want {want:#x}",
                !state, case.bounds
            ),
        );
    }
}

/// The reference's running CRC and length after each piece (starting over
/// after the reset, if any), computed once for all subjects.
fn expected(case: &Case, input: &Input) -> Vec<(u64, usize)> {
    let mut want = CrcRef::new(case.alg);
    let mut fed = 0;
    let mut out = Vec::with_capacity(PIECES);
    for (i, w) in case.bounds.windows(2).enumerate() {
        want.update(&case.data[w[0]..w[1]]);
        fed += w[1] - w[0];
        out.push((want.value(), fed));
        if usize::from(input.reset) == i {
            want = CrcRef::new(case.alg);
            fed = 0;
        }
    }
    out
}

async fn check_subject(s: &Subject, case: &Case, input: &Input, want: &[(u64, usize)]) {
    let alg = case.alg;
    let mut session = match s.offload().crc(alg).await {
        Ok(session) => session,
        Err(e) => mismatch(
            &s.name,
            alg.name(),
            "checksum",
            0,
            format_args!("opening the session: {e}"),
        ),
    };
    for (i, w) in case.bounds.windows(2).enumerate() {
        let piece = &case.data[w[0]..w[1]];
        let how = if input.borrowed >> i & 1 == 1 {
            session.update_from_slice(piece);
            "update_from_slice"
        } else if input.bytes_mut >> i & 1 == 1 {
            let back = session.update(BytesMut::from(piece)).await;
            if !back.as_ref().is_ok_and(|b| &b[..] == piece) {
                mismatch(
                    &s.name,
                    alg.name(),
                    "checksum",
                    piece.len(),
                    format_args!(
                        "update(BytesMut) handed back {:?}",
                        back.map(|b| b.len()).map_err(|e| e.to_string())
                    ),
                );
            }
            "update(BytesMut)"
        } else {
            let back = session.update(piece.to_vec()).await;
            if !back.as_ref().is_ok_and(|b| b == piece) {
                mismatch(
                    &s.name,
                    alg.name(),
                    "checksum",
                    piece.len(),
                    format_args!(
                        "update(Vec) handed back {:?}",
                        back.map(|b| b.len()).map_err(|e| e.to_string())
                    ),
                );
            }
            "update(Vec)"
        };
        let (expected, fed) = want[i];
        let got = session.finalize();
        if got != expected || session.len() != fed as u64 {
            mismatch(
                &s.name,
                alg.name(),
                "checksum",
                fed,
                format_args!(
                    "after piece {i} ({} B by {how}): crc {got:#x} want {expected:#x}, len {} want {fed}",
                    piece.len(),
                    session.len()
                ),
            );
        }
        if usize::from(input.reset) == i {
            session.reset();
            if !session.is_empty() || session.finalize() != 0 {
                mismatch(
                    &s.name,
                    alg.name(),
                    "checksum",
                    0,
                    format_args!(
                        "after reset: crc {:#x}, len {}",
                        session.finalize(),
                        session.len()
                    ),
                );
            }
        }
    }
    // After a reset in the last piece the stream is empty: its CRC is 0.
    let (expected, fed) = match want.last() {
        Some(_) if usize::from(input.reset) == PIECES - 1 => (0, 0),
        Some(&w) => w,
        None => (0, 0),
    };
    if let Err(e) = session.verify(expected) {
        mismatch(
            &s.name,
            alg.name(),
            "checksum",
            fed,
            format_args!("verify({expected:#x}): {e}"),
        );
    }
    match session.verify(expected ^ 1) {
        Err(Error::ChecksumMismatch {
            expected: e,
            computed: c,
        }) if e == expected ^ 1 && c == expected => {}
        other => mismatch(
            &s.name,
            alg.name(),
            "checksum",
            fed,
            format_args!("verify of a wrong CRC: {other:?}"),
        ),
    }
}

/// Piece by piece: `crc_combine(crc(prefix), crc(piece), len(piece))` and
/// `Crc::resume(crc(prefix), len(prefix))` fed the piece both give
/// `crc(prefix ‖ piece)` (each piece's CRC computed alone by the
/// reference, each prefix's by the reference streaming).
fn check_combine(case: &Case) {
    let alg = case.alg;
    let mut prefix = CrcRef::new(alg);
    for w in case.bounds.windows(2) {
        let (head, piece) = (&case.data[..w[0]], &case.data[w[0]..w[1]]);
        let before = prefix.value();
        prefix.update(piece);
        let after = prefix.value();
        let alone = reference::crc(alg, piece);
        let got = crypto_offload::crc_combine(alg, before, alone, piece.len() as u64);
        if got != after {
            mismatch(
                "crc_combine",
                alg.name(),
                "combine",
                piece.len(),
                format_args!(
                    "{} B after {} B: {got:#x} want {after:#x}",
                    piece.len(),
                    head.len()
                ),
            );
        }
        let mut resumed = fb::Crc::resume(alg, before, head.len() as u64);
        resumed.update(piece);
        if resumed.finalize() != after || resumed.len() != w[1] as u64 {
            mismatch(
                "fallback Crc::resume",
                alg.name(),
                "combine",
                piece.len(),
                format_args!(
                    "{} B after {} B: {:#x} (len {}) want {after:#x}",
                    piece.len(),
                    head.len(),
                    resumed.finalize(),
                    resumed.len()
                ),
            );
        }
    }
}

/// Seeds from the CRC vector records: each input whole, and cut in
/// three.
pub fn seeds(records: &[crate::vectors::Record]) -> Vec<(String, Input)> {
    let mut out = Vec::new();
    for (n, r) in records.iter().enumerate() {
        let Some(index) = CrcAlg::ALL
            .iter()
            .position(|a| a.name().eq_ignore_ascii_case(r.alg()))
        else {
            continue;
        };
        let data = r.hex("input");
        let third = (data.len() / 3) as u16;
        for (k, (cuts, borrowed)) in [
            ([0u16; 6], 0u8),
            ([third, third * 2, 0, 0, 0, 0], 0b0101010),
        ]
        .into_iter()
        .enumerate()
        {
            out.push((
                format!(
                    "{}-{n}-{k}",
                    CrcAlg::ALL[index].name().to_lowercase().replace('/', "-")
                ),
                Input {
                    alg: index as u8,
                    cuts: cuts.map(u16::to_le_bytes),
                    borrowed,
                    bytes_mut: 0b1100,
                    reset: 0xff,
                    scale: 0,
                    data: data.clone(),
                },
            ));
        }
    }
    out
}

/// `input` in the layout the target decodes.
pub fn encode(input: &Input) -> Vec<u8> {
    let mut w = seed::Writer::default();
    w.u8(input.alg);
    for c in &input.cuts {
        w.bytes(c);
    }
    w.u8(input.borrowed)
        .u8(input.bytes_mut)
        .u8(input.reset)
        .u8(input.scale)
        .bytes(&input.data);
    w.0
}
