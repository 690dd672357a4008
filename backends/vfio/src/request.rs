//! A data request's layout in its DMA buffer (header, IV, status, input,
//! output), its descriptor chain, and [`DmaRequest`], a request prepared in
//! DMA memory for the zero-copy burst path.

use crate::dma::DmaBuf;
use crate::error::Error;
use crate::protocol::{self, CipherAlgo, HEADER_LEN};
use crate::virtqueue::Segment;

/// Where a data request's parts sit in its DMA buffer: the header at 0,
/// the IV, the status byte, the chain again as an indirect descriptor
/// table (at most five descriptors), then the input and the output.
pub(crate) const HEADER_AT: usize = 0;
pub(crate) const IV_AT: usize = 80;
pub(crate) const STATUS_AT: usize = 96;
pub(crate) const TABLE_AT: usize = 128;
pub(crate) const DATA_AT: usize = 256;

/// Where a data request's input and output sit in its DMA buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// The caller's length.
    pub(crate) len: usize,
    /// The length the device gets: QEMU's builtin backend refuses a CTR
    /// request that ends in a partial block (status ERR, measured); CTR
    /// being a stream, the input padded to whole blocks gives the same
    /// first `len` bytes.
    pub(crate) padded: usize,
    /// Where the device writes the output: over the input (the device
    /// reads a request's whole input before it writes any output), so a
    /// request takes half the memory and the device's copies stay in the
    /// same cache lines — as DPDK's in-place operations do.
    pub(crate) out_at: usize,
}

impl Layout {
    pub(crate) fn new(algo: CipherAlgo, len: usize) -> Layout {
        let padded = match algo {
            CipherAlgo::AesCtr => len.next_multiple_of(16),
            _ => len,
        };
        Layout {
            len,
            padded,
            out_at: DATA_AT,
        }
    }

    /// The DMA memory a request takes.
    pub(crate) fn bytes(&self) -> usize {
        self.out_at + self.padded
    }

    /// Writes `data` (`len` bytes) as the input, padded with zeros.
    pub(crate) fn write_input(&self, dma: &DmaBuf, data: &[u8]) -> Result<(), Error> {
        if data.len() != self.len {
            return Err(Error::Invalid {
                what: "length",
                detail: format!("{} bytes for a {}-byte request", data.len(), self.len),
            });
        }
        dma.write(DATA_AT, data)?;
        dma.write(DATA_AT + data.len(), &[0u8; 16][..self.padded - self.len])
    }

    /// The descriptor chain: header, IV (if any), input, output, status;
    /// also written into `dma` as its indirect table (at [`TABLE_AT`]).
    pub(crate) fn write_chain(&self, dma: &DmaBuf, iv_len: usize) -> Result<Chain, Error> {
        let chain = self.chain(dma, iv_len);
        crate::virtqueue::write_table(dma, TABLE_AT, chain.segments())?;
        Ok(chain)
    }

    /// The descriptor chain: header, IV (if any), input, output, status.
    pub(crate) fn chain(&self, dma: &DmaBuf, iv_len: usize) -> Chain {
        let mut chain = Chain::empty();
        chain.add(dma.segment(0, HEADER_LEN, false));
        if iv_len > 0 {
            chain.add(dma.segment(IV_AT, iv_len, false));
        }
        chain.add(dma.segment(DATA_AT, self.padded, false));
        chain.add(dma.segment(self.out_at, self.padded, true));
        chain.add(dma.segment(STATUS_AT, 1, true));
        chain
    }
}

/// A descriptor chain of at most five segments, kept inline (one is built
/// for every request).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chain {
    pub(crate) segs: [Segment; 5],
    pub(crate) n: usize,
}

impl Chain {
    pub(crate) fn empty() -> Chain {
        let none = Segment {
            iova: 0,
            len: 0,
            device_writes: false,
        };
        Chain {
            segs: [none; 5],
            n: 0,
        }
    }

    pub(crate) fn new(segments: &[Segment]) -> Result<Chain, Error> {
        let mut chain = Chain::empty();
        if segments.len() > chain.segs.len() {
            return Err(Error::Invalid {
                what: "descriptor chain",
                detail: format!("{} segments", segments.len()),
            });
        }
        segments.iter().for_each(|s| chain.add(*s));
        Ok(chain)
    }

    pub(crate) fn add(&mut self, segment: Segment) {
        if let Some(slot) = self.segs.get_mut(self.n) {
            *slot = segment;
            self.n += 1;
        }
    }

    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segs[..self.n]
    }
}

/// A cipher request written into the device's DMA memory by
/// [`CipherSession::prepare`](crate::CipherSession::prepare), sent (any number of times) by
/// [`CipherSession::run_burst`](crate::CipherSession::run_burst): the zero-copy path, as DPDK's mbufs are
/// filled in place. Its memory is wiped when it is dropped.
pub struct DmaRequest {
    pub(crate) dma: DmaBuf,
    pub(crate) chain: Chain,
    pub(crate) session: u64,
    pub(crate) encrypt: bool,
    pub(crate) layout: Layout,
    pub(crate) iv_len: usize,
    /// The device's status from the last run.
    pub(crate) status: Option<u8>,
}

impl std::fmt::Debug for DmaRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRequest")
            .field("len", &self.layout.len)
            .field("encrypt", &self.encrypt)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl DmaRequest {
    /// Its input's length.
    pub fn len(&self) -> usize {
        self.layout.len
    }

    /// Whether its input is empty (never: empty requests are not sent).
    pub fn is_empty(&self) -> bool {
        self.layout.len == 0
    }

    /// Whether it encrypts (else decrypts).
    pub fn encrypts(&self) -> bool {
        self.encrypt
    }

    /// Replaces its IV (or XTS tweak) for the next run.
    ///
    /// # Errors
    /// [`Error::Invalid`] for another length than the session's IV.
    pub fn set_iv(&mut self, iv: &[u8]) -> Result<(), Error> {
        if iv.len() != self.iv_len {
            return Err(Error::Invalid {
                what: "IV length",
                detail: format!("{} bytes, the request takes {}", iv.len(), self.iv_len),
            });
        }
        self.status = None;
        self.dma.write(IV_AT, iv)
    }

    /// Replaces its input for the next run.
    ///
    /// # Errors
    /// [`Error::Invalid`] for another length than the request's.
    pub fn set_input(&mut self, data: &[u8]) -> Result<(), Error> {
        self.layout.write_input(&self.dma, data)?;
        self.status = None;
        Ok(())
    }

    /// The last run's result.
    ///
    /// # Errors
    /// [`Error::Status`] if the device refused it; [`Error::Invalid`] if it
    /// has not run since it was prepared or changed.
    pub fn result(&self) -> Result<(), Error> {
        match self.status {
            Some(protocol::STATUS_OK) => Ok(()),
            Some(status) => Err(Error::Status { status }),
            None => Err(Error::Invalid {
                what: "request",
                detail: "not run since it was prepared or changed".into(),
            }),
        }
    }

    /// Copies the last run's output into `out` (the request's length).
    ///
    /// # Errors
    /// As [`DmaRequest::result`]; [`Error::Invalid`] for another length.
    pub fn output(&self, out: &mut [u8]) -> Result<(), Error> {
        self.result()?;
        if out.len() != self.layout.len {
            return Err(Error::Invalid {
                what: "length",
                detail: format!("{} bytes for a {}-byte result", out.len(), self.layout.len),
            });
        }
        self.dma.read(self.layout.out_at, out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dma::DmaPool;

    #[test]
    fn ctr_is_padded_to_blocks_and_the_output_overwrites_the_input() {
        let ctr = Layout::new(CipherAlgo::AesCtr, 20);
        assert_eq!((ctr.len, ctr.padded, ctr.out_at), (20, 32, DATA_AT));
        let cbc = Layout::new(CipherAlgo::AesCbc, 48);
        assert_eq!(
            (cbc.padded, cbc.out_at, cbc.bytes()),
            (48, DATA_AT, DATA_AT + 48)
        );
    }

    #[test]
    fn the_chain_is_header_iv_input_output_status() {
        let pool = Arc::new(DmaPool::unmapped(1 << 16).unwrap());
        let dma = pool.try_alloc(1024).unwrap().unwrap();
        let layout = Layout::new(CipherAlgo::AesCtr, 20);
        let chain = layout.chain(&dma, 16);
        let shape: Vec<(u64, u32, bool)> = chain
            .segments()
            .iter()
            .map(|s| (s.iova - dma.iova(0), s.len, s.device_writes))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, HEADER_LEN as u32, false),
                (IV_AT as u64, 16, false),
                (DATA_AT as u64, 32, false),
                (layout.out_at as u64, 32, true),
                (STATUS_AT as u64, 1, true),
            ]
        );
        // ECB: no IV segment.
        assert_eq!(
            Layout::new(CipherAlgo::AesEcb, 16)
                .chain(&dma, 0)
                .segments()
                .len(),
            4
        );
        // The input is written padded with zeros, and only at its length.
        dma.write(DATA_AT, &[0xee; 32]).unwrap();
        layout.write_input(&dma, &[1; 20]).unwrap();
        let mut back = [0u8; 32];
        dma.read(DATA_AT, &mut back).unwrap();
        assert_eq!(back[..20], [1; 20]);
        assert_eq!(back[20..], [0; 12]);
        assert!(matches!(
            layout.write_input(&dma, &[1; 21]),
            Err(Error::Invalid { .. })
        ));
    }

    #[test]
    fn a_chain_holds_at_most_five_segments() {
        let seg = Segment {
            iova: 0,
            len: 1,
            device_writes: false,
        };
        assert_eq!(Chain::new(&[seg; 5]).unwrap().segments().len(), 5);
        assert!(matches!(Chain::new(&[seg; 6]), Err(Error::Invalid { .. })));
    }
}
