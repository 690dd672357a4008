//! The virtio-crypto wire format (virtio 1.2 §5.9; `<linux/virtio_crypto.h>`):
//! what goes in the control and data requests this driver sends. All
//! fields little-endian; every request header is 72 bytes.

/// `VIRTIO_CRYPTO_SERVICE_CIPHER`.
pub const SERVICE_CIPHER: u32 = 0;

const fn opcode(service: u32, op: u32) -> u32 {
    (service << 8) | op
}

/// `VIRTIO_CRYPTO_CIPHER_CREATE_SESSION`.
pub const CIPHER_CREATE_SESSION: u32 = opcode(SERVICE_CIPHER, 2);
/// `VIRTIO_CRYPTO_CIPHER_DESTROY_SESSION`.
pub const CIPHER_DESTROY_SESSION: u32 = opcode(SERVICE_CIPHER, 3);
/// `VIRTIO_CRYPTO_CIPHER_ENCRYPT`.
pub const CIPHER_ENCRYPT: u32 = opcode(SERVICE_CIPHER, 0);
/// `VIRTIO_CRYPTO_CIPHER_DECRYPT`.
pub const CIPHER_DECRYPT: u32 = opcode(SERVICE_CIPHER, 1);

/// `VIRTIO_CRYPTO_OP_ENCRYPT` / `_DECRYPT` (a session's direction).
pub const OP_ENCRYPT: u32 = 1;
/// See [`OP_ENCRYPT`].
pub const OP_DECRYPT: u32 = 2;

/// `VIRTIO_CRYPTO_SYM_OP_CIPHER`.
pub const SYM_OP_CIPHER: u32 = 1;

/// `VIRTIO_CRYPTO_OK`.
pub const STATUS_OK: u8 = 0;

/// Bytes of a control or data request header.
pub const HEADER_LEN: usize = 72;
/// Bytes of `struct virtio_crypto_session_input`.
pub const SESSION_INPUT_LEN: usize = 16;

/// The AES modes QEMU's builtin backend accepts in cipher sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CipherAlgo {
    /// `VIRTIO_CRYPTO_CIPHER_AES_ECB`.
    AesEcb,
    /// `VIRTIO_CRYPTO_CIPHER_AES_CBC`.
    AesCbc,
    /// `VIRTIO_CRYPTO_CIPHER_AES_CTR`.
    AesCtr,
    /// `VIRTIO_CRYPTO_CIPHER_AES_XTS`.
    AesXts,
}

impl CipherAlgo {
    /// All of them.
    pub const ALL: [CipherAlgo; 4] = [
        CipherAlgo::AesEcb,
        CipherAlgo::AesCbc,
        CipherAlgo::AesCtr,
        CipherAlgo::AesXts,
    ];

    /// Its `VIRTIO_CRYPTO_CIPHER_*` number (also its bit in the device's
    /// `cipher_algo_l`).
    pub fn number(self) -> u32 {
        match self {
            CipherAlgo::AesEcb => 2,
            CipherAlgo::AesCbc => 3,
            CipherAlgo::AesCtr => 4,
            CipherAlgo::AesXts => 13,
        }
    }

    /// The IV (XTS: tweak) length.
    pub fn iv_len(self) -> usize {
        match self {
            CipherAlgo::AesEcb => 0,
            _ => 16,
        }
    }

    /// The key lengths it takes (XTS: two keys).
    pub fn key_lens(self) -> &'static [usize] {
        match self {
            CipherAlgo::AesXts => &[32, 64],
            _ => &[16, 24, 32],
        }
    }
}

fn put(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// `struct virtio_crypto_op_ctrl_req` creating a cipher session: header
/// (opcode, algo, flag, queue_id), then `sym_create_session` with the
/// cipher parameters (algo, keylen, op) and `op_type` at its end (offset
/// 16 + 48). The key follows in its own buffer.
pub fn create_session(algo: CipherAlgo, key_len: usize, encrypt: bool) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    put(&mut h, 0, CIPHER_CREATE_SESSION);
    put(&mut h, 4, algo.number());
    put(&mut h, 16, algo.number());
    put(&mut h, 20, key_len as u32);
    put(&mut h, 24, if encrypt { OP_ENCRYPT } else { OP_DECRYPT });
    put(&mut h, 16 + 48, SYM_OP_CIPHER);
    h
}

/// `struct virtio_crypto_op_ctrl_req` destroying session `id`.
pub fn destroy_session(algo: CipherAlgo, id: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    put(&mut h, 0, CIPHER_DESTROY_SESSION);
    put(&mut h, 4, algo.number());
    put64(&mut h, 16, id);
    h
}

/// `struct virtio_crypto_op_data_req` for a cipher request on session
/// `id`: header (opcode, algo, session_id, flag), then `sym_req` with the
/// cipher parameters (iv_len, src_data_len, dst_data_len) and `op_type` at
/// its end (offset 24 + 40).
pub fn cipher_request(algo: CipherAlgo, id: u64, encrypt: bool, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    put(
        &mut h,
        0,
        if encrypt {
            CIPHER_ENCRYPT
        } else {
            CIPHER_DECRYPT
        },
    );
    put(&mut h, 4, algo.number());
    put64(&mut h, 8, id);
    put(&mut h, 24, algo.iv_len() as u32);
    put(&mut h, 28, len as u32);
    put(&mut h, 32, len as u32);
    put(&mut h, 24 + 40, SYM_OP_CIPHER);
    h
}

/// `struct virtio_crypto_session_input`: the session id and status the
/// device wrote.
pub fn session_input(b: &[u8; SESSION_INPUT_LEN]) -> (u64, u32) {
    let id = u64::from_le_bytes(b[0..8].try_into().unwrap_or_default());
    let status = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
    (id, status)
}

/// The device configuration (`struct virtio_crypto_config`) fields this
/// driver uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceConfig {
    /// `VIRTIO_CRYPTO_S_HW_READY` and friends.
    pub status: u32,
    /// Data queues.
    pub max_dataqueues: u32,
    /// `1 << VIRTIO_CRYPTO_SERVICE_*`.
    pub crypto_services: u32,
    /// `1 << VIRTIO_CRYPTO_CIPHER_*` (the low word).
    pub cipher_algo_l: u32,
    /// The longest key.
    pub max_cipher_key_len: u32,
    /// The largest request content.
    pub max_size: u64,
}

impl DeviceConfig {
    /// Offsets of the fields in `struct virtio_crypto_config`.
    pub(crate) const STATUS: usize = 0;
    pub(crate) const MAX_DATAQUEUES: usize = 4;
    pub(crate) const CRYPTO_SERVICES: usize = 8;
    pub(crate) const CIPHER_ALGO_L: usize = 12;
    pub(crate) const MAX_CIPHER_KEY_LEN: usize = 36;
    pub(crate) const MAX_SIZE: usize = 48;

    /// Whether the device advertises `algo` (advertised is not accepted:
    /// sessions are probed).
    pub fn advertises(&self, algo: CipherAlgo) -> bool {
        self.crypto_services & (1 << SERVICE_CIPHER) != 0
            && self.cipher_algo_l & (1 << algo.number()) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn headers_put_fields_where_the_c_structures_have_them() {
        let c = create_session(CipherAlgo::AesXts, 64, false);
        assert_eq!((le(&c, 0), le(&c, 4)), (0x02, 13));
        assert_eq!((le(&c, 16), le(&c, 20), le(&c, 24)), (13, 64, OP_DECRYPT));
        assert_eq!(le(&c, 64), SYM_OP_CIPHER);
        let d = cipher_request(CipherAlgo::AesCbc, 0x1_0000_0002, true, 4096);
        assert_eq!(le(&d, 0), CIPHER_ENCRYPT);
        assert_eq!(
            u64::from_le_bytes(d[8..16].try_into().unwrap()),
            0x1_0000_0002
        );
        assert_eq!((le(&d, 24), le(&d, 28), le(&d, 32)), (16, 4096, 4096));
        assert_eq!(le(&d, 64), SYM_OP_CIPHER);
        let x = destroy_session(CipherAlgo::AesCbc, 9);
        assert_eq!((le(&x, 0), le(&x, 16)), (0x03, 9));
        let mut input = [0u8; 16];
        input[0] = 5;
        input[8] = 3;
        assert_eq!(session_input(&input), (5, 3));
        let cfg = DeviceConfig {
            crypto_services: 1,
            cipher_algo_l: 1 << 3,
            ..Default::default()
        };
        assert!(cfg.advertises(CipherAlgo::AesCbc));
        assert!(!cfg.advertises(CipherAlgo::AesXts));
    }
}
