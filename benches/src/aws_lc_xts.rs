//! AES-256-XTS through AWS-LC's EVP interface (aws-lc-rs does not expose XTS).

use core::ptr;

use aws_lc_sys::{
    EVP_CIPHER_CTX, EVP_CIPHER_CTX_free, EVP_CIPHER_CTX_new, EVP_DecryptInit_ex, EVP_DecryptUpdate,
    EVP_EncryptInit_ex, EVP_EncryptUpdate, EVP_aes_256_xts,
};

/// An AES-256-XTS key on AWS-LC (one context per direction).
pub struct AwsLcXts {
    enc: *mut EVP_CIPHER_CTX,
    dec: *mut EVP_CIPHER_CTX,
}

impl AwsLcXts {
    /// A 64-byte key (Key1 ‖ Key2). Panics on failure: bench set-up only.
    pub fn new(key: &[u8; 64]) -> Self {
        // SAFETY: EVP_CIPHER_CTX_new has no preconditions; it returns an owned
        // context or null, which is checked.
        let (enc, dec) = unsafe { (EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_new()) };
        assert!(!enc.is_null() && !dec.is_null());
        // SAFETY: both contexts are valid and owned; the key pointer is valid
        // for the 64 bytes XTS-256 reads; a null IV leaves it to the per-unit
        // init below.
        let ok = unsafe {
            EVP_EncryptInit_ex(
                enc,
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
            ) & EVP_DecryptInit_ex(
                dec,
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
            )
        };
        assert_eq!(ok, 1, "EVP init");
        AwsLcXts { enc, dec }
    }

    /// Encrypts (or decrypts) `data` as units of `unit` bytes, the first with
    /// tweak `first` (little-endian sector number), as dm-crypt does.
    pub fn run(&mut self, first: u128, unit: usize, data: &mut [u8], encrypt: bool) {
        let mut sector = first;
        for chunk in data.chunks_mut(unit) {
            let iv = sector.to_le_bytes();
            let mut outl = 0;
            let len = i32::try_from(chunk.len()).expect("unit fits in i32");
            // SAFETY: the contexts are valid and keyed (new); `iv` is 16
            // bytes; AWS-LC permits in == out for XTS; `chunk` is valid for
            // reads and writes of `len` bytes and `outl` is a valid out-pointer.
            let ok = unsafe {
                if encrypt {
                    EVP_EncryptInit_ex(
                        self.enc,
                        ptr::null(),
                        ptr::null_mut(),
                        ptr::null(),
                        iv.as_ptr(),
                    ) & EVP_EncryptUpdate(
                        self.enc,
                        chunk.as_mut_ptr(),
                        &mut outl,
                        chunk.as_ptr(),
                        len,
                    )
                } else {
                    EVP_DecryptInit_ex(
                        self.dec,
                        ptr::null(),
                        ptr::null_mut(),
                        ptr::null(),
                        iv.as_ptr(),
                    ) & EVP_DecryptUpdate(
                        self.dec,
                        chunk.as_mut_ptr(),
                        &mut outl,
                        chunk.as_ptr(),
                        len,
                    )
                }
            };
            assert_eq!(ok, 1, "EVP update");
            sector = sector.wrapping_add(1);
        }
    }
}

impl Drop for AwsLcXts {
    fn drop(&mut self) {
        // SAFETY: both contexts were created by EVP_CIPHER_CTX_new and are
        // freed exactly once, here.
        unsafe {
            EVP_CIPHER_CTX_free(self.enc);
            EVP_CIPHER_CTX_free(self.dec);
        }
    }
}
