//! IVs, tweaks and nonces, taken by value.

/// A fixed-length request parameter: an IV, CTR counter block or XTS tweak
/// (`N = 16`), or a GCM nonce (`N = 12`).
///
/// Given as `[u8; N]`, `&[u8; N]`, or any `&[u8]` / `&Vec<u8>` (a slice of
/// another length is refused with [`Error::IvLength`](crate::Error::IvLength)
/// when the request runs, the buffer handed back untouched). It is copied
/// into the request, so the request borrows only its session, and a
/// temporary does:
///
/// ```
/// # futures::executor::block_on(async {
/// use crypto_offload::{CipherAlg, Offload};
/// use futures::future::join_all;
///
/// let offload = Offload::builder().build()?;
/// let key: Vec<u8> = (0..64).collect();
/// let disk = offload.cipher(CipherAlg::Aes256Xts, &key).await?;
/// let sectors = vec![vec![0u8; 512]; 4];
/// // The tweak of sector i, made in the closure and dropped before the
/// // request runs.
/// let requests = sectors
///     .into_iter()
///     .enumerate()
///     .map(|(i, s)| disk.encrypt((i as u128).to_le_bytes(), s));
/// for sector in join_all(requests).await {
///     assert_eq!(sector?.len(), 512);
/// }
/// # Ok::<(), crypto_offload::Error>(()) }).unwrap();
/// ```
pub trait IvInput<const N: usize>: sealed::Sealed<N> {
    /// The bytes, or the length given if it is not `N` (a `u32`, saturated:
    /// it keeps the request futures, which hold it, at their size before
    /// IVs were taken by value).
    #[doc(hidden)]
    fn into_block(self) -> Result<[u8; N], u32>;
}

impl<const N: usize> IvInput<N> for [u8; N] {
    #[inline]
    fn into_block(self) -> Result<[u8; N], u32> {
        Ok(self)
    }
}

impl<const N: usize, T: AsRef<[u8]> + ?Sized> IvInput<N> for &T {
    #[inline]
    fn into_block(self) -> Result<[u8; N], u32> {
        let bytes = self.as_ref();
        <[u8; N]>::try_from(bytes).map_err(|_| u32::try_from(bytes.len()).unwrap_or(u32::MAX))
    }
}

mod sealed {
    pub trait Sealed<const N: usize> {}
    impl<const N: usize> Sealed<N> for [u8; N] {}
    impl<const N: usize, T: AsRef<[u8]> + ?Sized> Sealed<N> for &T {}
}
