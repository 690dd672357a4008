//! AEAD: AES-GCM (`gcm(aes)`), with associated data and a 16-byte tag.

use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

use tracing::Instrument;
use zeroize::Zeroize;

use crate::blocking::{self, RequestTimeout, Shared};
use crate::error::{Error, Failed};
use crate::skcipher::into_fresh;
use crate::socket::{Control, Op, Transform};

/// The tag length this binding asks for.
pub const TAG_LEN: usize = 16;

/// A keyed AES-GCM transform (96-bit nonces, 16-byte tags).
#[derive(Debug, Clone)]
pub struct Aead {
    shared: Arc<Shared>,
    timeout: Option<RequestTimeout>,
}

impl Aead {
    /// Binds `gcm(aes)` — or `driver` exactly — with a 16, 24 or 32-byte key
    /// and a 16-byte tag.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if AF_ALG, GCM or the driver is not on offer
    /// here; [`Error::Invalid`] for another key length.
    pub fn bind(driver: Option<&str>, key: &[u8]) -> Result<Aead, Error> {
        if ![16, 24, 32].contains(&key.len()) {
            return Err(Error::Invalid {
                what: "key length",
                detail: format!("{} bytes for gcm(aes)", key.len()),
            });
        }
        let tfm = Transform::bind("aead", driver.unwrap_or("gcm(aes)"), driver.is_some())?;
        tfm.set_key(key)?;
        tfm.set_tag_len(TAG_LEN)?;
        Ok(Aead {
            shared: Shared::new(tfm),
            timeout: None,
        })
    }

    blocking::bound_accessors!();

    /// Encrypts `buf` in place; returns it with the tag over `aad` and the
    /// ciphertext.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if `aad` and `buf` together exceed what one
    /// operation takes here; a failed system call. The buffer comes back
    /// unchanged.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the request: it completes on its
    /// thread, which owns `buf` until then and then frees it.
    pub async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: Vec<u8>,
    ) -> Result<(Vec<u8>, [u8; TAG_LEN]), Failed> {
        let shared = self.shared.clone();
        let aad = aad.to_vec();
        let span = tracing::trace_span!("af_alg.aead.seal", len = buf.len(), aad = aad.len());
        blocking::run(&self.shared.stuck, buf, self.timeout, move |data| {
            shared.with_op(|op| seal(op, &nonce, &aad, data))
        })
        .instrument(span)
        .await
    }

    /// Verifies `tag` and decrypts `buf` in place.
    ///
    /// # Errors
    /// [`Error::Authentication`] if the tag does not verify: the buffer
    /// comes back zeroed (no plaintext is released). Otherwise as for
    /// [`Aead::seal`], with the buffer unchanged.
    ///
    /// # Cancel safety
    /// As for [`Aead::seal`]; a dropped open that fails wipes the buffer
    /// before freeing it.
    pub async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: Vec<u8>,
        tag: [u8; TAG_LEN],
    ) -> Result<Vec<u8>, Failed> {
        let shared = self.shared.clone();
        let aad = aad.to_vec();
        let span = tracing::trace_span!("af_alg.aead.open", len = buf.len(), aad = aad.len());
        blocking::run(&self.shared.stuck, buf, self.timeout, move |data| {
            shared.with_op(|op| open(op, &nonce, &aad, data, &tag))
        })
        .instrument(span)
        .await
        .map(|(buf, ())| buf)
    }
}

fn check_fits(op: &Op, len: usize) -> Result<(), Error> {
    if len > op.limit() {
        return Err(Error::TooLarge {
            len,
            max: op.limit(),
        });
    }
    Ok(())
}

fn assoc_len(aad: &[u8]) -> Result<u32, Error> {
    u32::try_from(aad.len()).map_err(|_| Error::Invalid {
        what: "associated data length",
        detail: format!("{} bytes", aad.len()),
    })
}

fn seal(op: &Op, nonce: &[u8; 12], aad: &[u8], data: &mut Vec<u8>) -> Result<[u8; TAG_LEN], Error> {
    // The result of the AAD, the ciphertext and the tag must fit one read.
    check_fits(op, aad.len() + data.len() + TAG_LEN)?;
    let mut tag = [0u8; TAG_LEN];
    // The ciphertext goes to a fresh buffer: a seal that fails part-way
    // hands the caller's plaintext back unchanged.
    into_fresh(data, |input, output| {
        op.send(
            Control {
                encrypt: Some(true),
                iv: Some(nonce),
                assoc_len: Some(assoc_len(aad)?),
            },
            &[IoSlice::new(aad), IoSlice::new(input)],
        )?;
        // The result is the associated data again, the ciphertext, the tag.
        let mut aad_out = vec![0u8; aad.len()];
        let want = aad.len() + input.len() + TAG_LEN;
        let got = op.recv(&mut [
            IoSliceMut::new(&mut aad_out),
            IoSliceMut::new(output),
            IoSliceMut::new(&mut tag),
        ])?;
        if got != want {
            return Err(short_read(got, want));
        }
        Ok(())
    })?;
    Ok(tag)
}

fn open(
    op: &Op,
    nonce: &[u8; 12],
    aad: &[u8],
    data: &mut Vec<u8>,
    tag: &[u8; TAG_LEN],
) -> Result<(), Error> {
    check_fits(op, aad.len() + data.len() + TAG_LEN)?;
    // The plaintext goes to a fresh buffer (wiped unless all is well): the
    // kernel writes it before it checks the tag.
    let r = into_fresh(data, |input, output| {
        op.send(
            Control {
                encrypt: Some(false),
                iv: Some(nonce),
                assoc_len: Some(assoc_len(aad)?),
            },
            &[IoSlice::new(aad), IoSlice::new(input), IoSlice::new(tag)],
        )?;
        let mut aad_out = vec![0u8; aad.len()];
        let want = aad.len() + input.len();
        // With nothing to read back (no AAD, no ciphertext), a read of zero
        // bytes would return without the kernel running the operation — or
        // checking the tag — and leave the tag queued on the socket. A
        // spare block makes it run; nothing is written there.
        let mut spare = [0u8; 16];
        let spare_len = if want == 0 { spare.len() } else { 0 };
        let got = op.recv(&mut [
            IoSliceMut::new(&mut aad_out),
            IoSliceMut::new(output),
            IoSliceMut::new(&mut spare[..spare_len]),
        ])?;
        if got != want {
            return Err(short_read(got, want));
        }
        Ok(())
    });
    if matches!(r, Err(Error::Authentication)) {
        // The contract for a tag that does not verify: a zeroed buffer.
        data.as_mut_slice().zeroize();
    }
    r
}

fn short_read(got: usize, want: usize) -> Error {
    Error::Io {
        op: "read",
        source: std::io::Error::other(format!("read {got} of {want} bytes")),
    }
}
