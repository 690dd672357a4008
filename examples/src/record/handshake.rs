//! The record server's key exchange: an ephemeral X25519 exchange per
//! HELLO, and HKDF-SHA256 from its shared secret (and a pre-shared key, if
//! both sides have one) to the connection's two AES-128-GCM keys.
//!
//! ```text
//! client HELLO body   client's X25519 public key (32) | random (16)
//! server HELLO body   server's X25519 public key (32) | confirmation (32)
//!
//! shared  = X25519(own ephemeral secret, peer's public key)    all zeros: refused
//! PRK     = HKDF-Extract(salt = client random, shared ‖ PSK)   PSK only with --psk-file
//! each    = HKDF-Expand(PRK, label ‖ client public ‖ server public)
//!   client → server key (16), server → client key (16), confirmation (32)
//! ```
//!
//! Both secrets are fresh for each HELLO and never leave the process; only
//! the public keys and the confirmation cross the wire. Every output
//! depends on both public keys and the client's random (the transcript),
//! so a changed HELLO changes every key. The client checks the server's
//! confirmation: a server that holds another PSK (or a man in the middle
//! who holds none) cannot produce it, and the client stops there.
//!
//! **What it protects against.** Without a PSK the exchange is
//! unauthenticated: it keeps the records secret from someone who only
//! listens, but a man in the middle can run one exchange with each side
//! and read and change every record. With the same PSK on both sides
//! (`--psk-file`) the keys depend on it too: a man in the middle without it
//! derives other keys, the client refuses the server's HELLO, and every
//! record it forges fails to open at the server. Only the client checks the
//! confirmation: the server learns of a wrong PSK from records that do not
//! open (counted as tampered).
//!
//! **Secrets.** The X25519 secrets and shared secret (`x25519-dalek`'s
//! `zeroize` feature), the HKDF state (`sha2`'s), the PSK and the derived
//! keys are wiped when dropped; none of them is printed by `Debug`.

use std::path::{Path, PathBuf};

use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use x25519_dalek::{EphemeralSecret, PublicKey, SharedSecret};
use zeroize::Zeroizing;

use super::protocol::KEY;

/// Bytes of an X25519 public key.
pub const PUBLIC: usize = 32;
/// Bytes of the client's random.
pub const RANDOM: usize = 16;
/// Bytes of the server's key confirmation.
pub const CONFIRM: usize = 32;
/// Bytes of a client's HELLO body.
pub const CLIENT_HELLO: usize = PUBLIC + RANDOM;
/// Bytes of a server's HELLO body.
pub const SERVER_HELLO: usize = PUBLIC + CONFIRM;
/// The fewest bytes a pre-shared key may have.
pub const MIN_PSK: usize = 16;

const TO_SERVER_LABEL: &[u8] = b"offload-examples record v2: client to server key";
const TO_CLIENT_LABEL: &[u8] = b"offload-examples record v2: server to client key";
const CONFIRM_LABEL: &[u8] = b"offload-examples record v2: server confirmation";

/// Why a key exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// A HELLO body of the wrong length.
    #[error("a HELLO body of {len} bytes, not {expected}")]
    Length {
        /// Its length.
        len: usize,
        /// The length it must have.
        expected: usize,
    },
    /// The peer's public key is a low-order point: the shared secret would
    /// be all zeros, a key anyone knows.
    #[error("the peer's public key gives an all-zero shared secret (a low-order point)")]
    LowOrder,
    /// The server's confirmation is not the one these keys give.
    #[error(
        "the server's HELLO does not confirm the keys: the two sides hold \
         different pre-shared keys (or only one holds one), or a man in the \
         middle changed the exchange"
    )]
    KeyMismatch,
    /// No randomness from the operating system.
    #[error("no randomness for the key exchange: {0}")]
    Random(String),
}

/// Why a pre-shared key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PskError {
    /// The file could not be read.
    #[error("cannot read the pre-shared key file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Too short to be a key.
    #[error(
        "a pre-shared key of {len} bytes: at least {MIN_PSK} random bytes \
         (`head -c 32 /dev/urandom > FILE`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
}

/// A pre-shared key both sides hold: wiped on drop, never printed.
#[derive(Clone)]
pub struct Psk(Zeroizing<Vec<u8>>);

impl core::fmt::Debug for Psk {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Psk(..)")
    }
}

impl Psk {
    /// A PSK of these bytes (at least [`MIN_PSK`]).
    ///
    /// # Errors
    /// [`PskError::TooShort`].
    pub fn new(bytes: Vec<u8>) -> Result<Self, PskError> {
        let bytes = Zeroizing::new(bytes);
        if bytes.len() < MIN_PSK {
            return Err(PskError::TooShort { len: bytes.len() });
        }
        Ok(Psk(bytes))
    }

    /// The PSK in `path`: the file's bytes, as they are.
    ///
    /// # Errors
    /// [`PskError::Read`], [`PskError::TooShort`].
    pub fn load(path: &Path) -> Result<Self, PskError> {
        let bytes = std::fs::read(path).map_err(|source| PskError::Read {
            path: path.to_owned(),
            source,
        })?;
        Psk::new(bytes)
    }
}

/// One direction's AES-128-GCM key.
type Key = Zeroizing<[u8; KEY]>;

/// What one exchange gives: a key per direction, and the confirmation the
/// server sends. Wiped on drop, never printed.
pub struct SessionKeys {
    to_server: Key,
    to_client: Key,
    confirm: Zeroizing<[u8; CONFIRM]>,
}

impl core::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

impl SessionKeys {
    /// The key of the records the client sends.
    pub fn to_server(&self) -> &[u8; KEY] {
        &self.to_server
    }

    /// The key of the records the server sends.
    pub fn to_client(&self) -> &[u8; KEY] {
        &self.to_client
    }
}

/// The key schedule (see the module docs), from the shared secret of the
/// exchange between the client whose HELLO body is `client_hello` and the
/// server whose public key is `server_public`.
///
/// # Errors
/// [`HandshakeError::LowOrder`] if the shared secret is all zeros.
pub fn derive(
    shared: &SharedSecret,
    client_hello: &[u8; CLIENT_HELLO],
    server_public: &[u8; PUBLIC],
    psk: Option<&Psk>,
) -> Result<SessionKeys, HandshakeError> {
    if !shared.was_contributory() {
        return Err(HandshakeError::LowOrder);
    }
    let (client_public, client_random) = client_hello.split_at(PUBLIC);
    let mut ikm = Zeroizing::new(Vec::with_capacity(PUBLIC + psk.map_or(0, |p| p.0.len())));
    ikm.extend_from_slice(shared.as_bytes());
    if let Some(psk) = psk {
        ikm.extend_from_slice(&psk.0);
    }
    let hkdf = Hkdf::<Sha256>::new(Some(client_random), &ikm);
    let expand = |label: &[u8], out: &mut [u8]| {
        hkdf.expand_multi_info(&[label, client_public, server_public], out)
            .expect("HKDF-SHA256 gives up to 8160 bytes; these are 16 and 32");
    };
    let mut keys = SessionKeys {
        to_server: Zeroizing::new([0; KEY]),
        to_client: Zeroizing::new([0; KEY]),
        confirm: Zeroizing::new([0; CONFIRM]),
    };
    expand(TO_SERVER_LABEL, &mut keys.to_server[..]);
    expand(TO_CLIENT_LABEL, &mut keys.to_client[..]);
    expand(CONFIRM_LABEL, &mut keys.confirm[..]);
    Ok(keys)
}

/// The client's side of one exchange: a fresh secret and its HELLO.
pub struct ClientHandshake {
    secret: EphemeralSecret,
    hello: [u8; CLIENT_HELLO],
}

impl core::fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ClientHandshake")
            .field("public", &&self.hello[..PUBLIC])
            .finish_non_exhaustive()
    }
}

impl ClientHandshake {
    /// A fresh ephemeral secret and random.
    ///
    /// # Errors
    /// [`HandshakeError::Random`].
    ///
    /// # Panics
    /// If the operating system has no randomness for the secret
    /// (`x25519-dalek` panics then; the random is drawn first, so it is
    /// this function's error that says so).
    pub fn new() -> Result<Self, HandshakeError> {
        let mut hello = [0u8; CLIENT_HELLO];
        getrandom::fill(&mut hello[PUBLIC..]).map_err(|e| HandshakeError::Random(e.to_string()))?;
        let secret = EphemeralSecret::random();
        hello[..PUBLIC].copy_from_slice(PublicKey::from(&secret).as_bytes());
        Ok(ClientHandshake { secret, hello })
    }

    /// The HELLO body to send.
    pub fn hello(&self) -> &[u8; CLIENT_HELLO] {
        &self.hello
    }

    /// The keys, from the server's HELLO body, once its confirmation checks
    /// out. The secret is used up (and wiped) either way.
    ///
    /// # Errors
    /// [`HandshakeError::Length`], [`HandshakeError::LowOrder`],
    /// [`HandshakeError::KeyMismatch`].
    pub fn finish(
        self,
        server_hello: &[u8],
        psk: Option<&Psk>,
    ) -> Result<SessionKeys, HandshakeError> {
        let server_hello: &[u8; SERVER_HELLO] =
            server_hello
                .try_into()
                .map_err(|_| HandshakeError::Length {
                    len: server_hello.len(),
                    expected: SERVER_HELLO,
                })?;
        let (public, confirm) = server_hello.split_at(PUBLIC);
        let public: [u8; PUBLIC] = public.try_into().unwrap_or([0; PUBLIC]);
        let shared = self.secret.diffie_hellman(&PublicKey::from(public));
        let keys = derive(&shared, &self.hello, &public, psk)?;
        if !bool::from(keys.confirm.ct_eq(confirm)) {
            return Err(HandshakeError::KeyMismatch);
        }
        Ok(keys)
    }
}

/// The server's side of one exchange: a fresh secret of its own for the
/// client's HELLO body. The server's HELLO body to send, and the keys.
///
/// # Errors
/// [`HandshakeError::Length`], [`HandshakeError::LowOrder`].
///
/// # Panics
/// If the operating system has no randomness (see [`ClientHandshake::new`]).
pub fn respond(
    client_hello: &[u8],
    psk: Option<&Psk>,
) -> Result<([u8; SERVER_HELLO], SessionKeys), HandshakeError> {
    let client_hello: &[u8; CLIENT_HELLO] =
        client_hello
            .try_into()
            .map_err(|_| HandshakeError::Length {
                len: client_hello.len(),
                expected: CLIENT_HELLO,
            })?;
    let client_public: [u8; PUBLIC] = client_hello[..PUBLIC].try_into().unwrap_or([0; PUBLIC]);
    let secret = EphemeralSecret::random();
    let public = PublicKey::from(&secret);
    let shared = secret.diffie_hellman(&PublicKey::from(client_public));
    let keys = derive(&shared, client_hello, public.as_bytes(), psk)?;
    let mut hello = [0u8; SERVER_HELLO];
    hello[..PUBLIC].copy_from_slice(public.as_bytes());
    hello[PUBLIC..].copy_from_slice(&keys.confirm[..]);
    Ok((hello, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psk(byte: u8) -> Psk {
        Psk::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn both_sides_derive_the_same_two_keys_and_the_client_checks_the_confirmation() {
        for key in [None, Some(psk(7))] {
            let client = ClientHandshake::new().unwrap();
            let (reply, server) = respond(client.hello(), key.as_ref()).unwrap();
            let keys = client.finish(&reply, key.as_ref()).unwrap();
            assert_eq!(keys.to_server(), server.to_server());
            assert_eq!(keys.to_client(), server.to_client());
            assert_ne!(keys.to_server(), keys.to_client());
        }
    }

    #[test]
    fn a_different_psk_or_none_on_one_side_is_a_key_mismatch() {
        for (client_psk, server_psk) in [
            (Some(psk(1)), Some(psk(2))),
            (None, Some(psk(2))),
            (Some(psk(1)), None),
        ] {
            let client = ClientHandshake::new().unwrap();
            let (reply, _) = respond(client.hello(), server_psk.as_ref()).unwrap();
            assert!(matches!(
                client.finish(&reply, client_psk.as_ref()),
                Err(HandshakeError::KeyMismatch)
            ));
        }
    }

    #[test]
    fn a_low_order_public_key_is_refused_on_both_sides() {
        // Points of order 2, 4 and 8 (u = 0, 1, and the one from
        // Bernstein's list): any clamped secret times one of them is zero.
        let mut order4 = [0u8; 32];
        order4[0] = 1;
        let order8 = [
            0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f,
            0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16,
            0x5f, 0x49, 0xb8, 0x00,
        ];
        for bad in [[0u8; 32], order4, order8] {
            let mut hello = [0u8; CLIENT_HELLO];
            hello[..PUBLIC].copy_from_slice(&bad);
            assert!(matches!(
                respond(&hello, None),
                Err(HandshakeError::LowOrder)
            ));
            let client = ClientHandshake::new().unwrap();
            let mut reply = [0u8; SERVER_HELLO];
            reply[..PUBLIC].copy_from_slice(&bad);
            assert!(matches!(
                client.finish(&reply, None),
                Err(HandshakeError::LowOrder)
            ));
        }
    }

    #[test]
    fn wrong_lengths_short_psks_and_debug_output_give_nothing_away() {
        assert!(matches!(
            respond(&[0; 47], None),
            Err(HandshakeError::Length { len: 47, .. })
        ));
        assert!(matches!(
            Psk::new(vec![1; MIN_PSK - 1]),
            Err(PskError::TooShort { len: 15 })
        ));
        let client = ClientHandshake::new().unwrap();
        let (_, keys) = respond(client.hello(), Some(&psk(3))).unwrap();
        assert!(format!("{client:?}").starts_with("ClientHandshake { public: ["));
        assert!(format!("{client:?}").ends_with(", .. }"));
        assert_eq!(format!("{keys:?}"), "SessionKeys(..)");
        assert_eq!(format!("{:?}", psk(3)), "Psk(..)");
    }
}
