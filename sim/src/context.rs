//! The engine's keyed contexts. Each request goes through the model
//! ([`Shared::run`]); its real result is computed on completion by
//! `crypto-offload-fallback`, the CPU code crypto-offload's own CPU backend
//! runs.

use std::sync::Arc;

use crypto_offload::backend::async_trait;
use crypto_offload::backend::{
    AeadContext, BackendError, CipherContext, CipherParams, CrcContext, Failed, IoBuf, PowerRef,
};
use crypto_offload::cpu::CpuBackend;
use crypto_offload::{AeadAlg, Algorithm, CipherAlg, CipherMode, CrcAlg, Error};
use crypto_offload_fallback as fb;

use crate::engine::Shared;

/// A keyed cipher on the CPU, in one of the modes.
#[allow(clippy::large_enum_variant)]
enum Cipher {
    Cbc(fb::Cbc),
    Ctr(fb::Ctr),
    Xts(fb::Xts),
}

impl Cipher {
    /// The key schedule of `alg` for `key`, on each mode's fastest
    /// implementation.
    fn new(alg: CipherAlg, key: &[u8]) -> Result<Self, BackendError> {
        let map = |e| key_error(alg.into(), e);
        Ok(match alg.mode() {
            CipherMode::Cbc => Cipher::Cbc(fb::Cbc::new(key).map_err(map)?),
            CipherMode::Ctr => Cipher::Ctr(fb::Ctr::new(key).map_err(map)?),
            CipherMode::Xts => Cipher::Xts(fb::Xts::new(key).map_err(map)?),
            _ => return Err(BackendError::Unsupported(alg.name().to_owned())),
        })
    }

    fn run(&self, encrypt: bool, params: &CipherParams, data: &mut [u8]) -> Result<(), fb::Error> {
        match (self, encrypt) {
            (Cipher::Cbc(k), true) => k.encrypt(&params.iv, data),
            (Cipher::Cbc(k), false) => k.decrypt(&params.iv, data),
            (Cipher::Ctr(k), _) => k.apply_keystream(&params.iv, data),
            (Cipher::Xts(k), true) => k.encrypt_units(&params.iv, params.data_unit, data),
            (Cipher::Xts(k), false) => k.decrypt_units(&params.iv, params.data_unit, data),
        }
    }
}

/// A key the CPU code refused, as crypto-offload's CPU backend reports it.
/// (Sessions check keys before a backend sees them: not seen in practice.)
fn key_error(alg: Algorithm, e: fb::Error) -> BackendError {
    let error = match e {
        fb::Error::XtsWeakKey => Error::WeakKey { alg },
        fb::Error::KeyLength { len, .. } => Error::KeyLength {
            alg,
            len,
            expected: match alg {
                Algorithm::Cipher(a) => a.key_len(),
                Algorithm::Aead(a) => a.key_len(),
                _ => 0,
            },
        },
        other => Error::Backend {
            backend: CpuBackend::NAME.to_owned(),
            source: BackendError::Other(Box::new(other)),
        },
    };
    BackendError::Other(Box::new(error))
}

pub(crate) struct SimCipher {
    shared: Arc<Shared>,
    cpu: Arc<Cipher>,
    power: Option<PowerRef>,
}

impl SimCipher {
    pub(crate) async fn open(
        shared: &Arc<Shared>,
        alg: CipherAlg,
        key: &[u8],
    ) -> Result<Self, BackendError> {
        shared.check_open(alg.into())?;
        let cpu = Cipher::new(alg, key)?;
        Ok(SimCipher {
            shared: shared.clone(),
            cpu: Arc::new(cpu),
            power: shared.session_power().await?,
        })
    }
}

#[async_trait]
impl CipherContext for SimCipher {
    async fn encrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| cpu.run(true, &params, d))
            .await?;
        Ok(buf)
    }
    async fn decrypt(&self, params: CipherParams, buf: IoBuf) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| cpu.run(false, &params, d))
            .await?;
        Ok(buf)
    }
}

pub(crate) struct SimAead {
    shared: Arc<Shared>,
    cpu: fb::Gcm,
    power: Option<PowerRef>,
}

impl SimAead {
    pub(crate) async fn open(
        shared: &Arc<Shared>,
        alg: AeadAlg,
        key: &[u8],
    ) -> Result<Self, BackendError> {
        shared.check_open(alg.into())?;
        let cpu = fb::Gcm::new(key).map_err(|e| key_error(alg.into(), e))?;
        Ok(SimAead {
            shared: shared.clone(),
            cpu,
            power: shared.session_power().await?,
        })
    }
}

#[async_trait]
impl AeadContext for SimAead {
    async fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
    ) -> Result<(IoBuf, [u8; 16]), Failed> {
        let cpu = &self.cpu;
        self.shared
            .run(&self.power, buf, |d| {
                cpu.seal_in_place_detached(&nonce, aad, d)
            })
            .await
    }
    async fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        buf: IoBuf,
        tag: [u8; 16],
    ) -> Result<IoBuf, Failed> {
        let cpu = &self.cpu;
        let (buf, ()) = self
            .shared
            .run(&self.power, buf, |d| {
                cpu.open_in_place_detached(&nonce, aad, d, &tag)
            })
            .await?;
        Ok(buf)
    }
}

pub(crate) struct SimCrc {
    shared: Arc<Shared>,
    alg: CrcAlg,
    power: Option<PowerRef>,
}

impl SimCrc {
    pub(crate) async fn open(shared: &Arc<Shared>, alg: CrcAlg) -> Result<Self, BackendError> {
        shared.check_open(alg.into())?;
        Ok(SimCrc {
            shared: shared.clone(),
            alg,
            power: shared.session_power().await?,
        })
    }
}

#[async_trait]
impl CrcContext for SimCrc {
    async fn checksum(&self, buf: IoBuf) -> Result<(IoBuf, u64), Failed> {
        let alg = self.alg;
        self.shared
            .run(&self.power, buf, |d| Ok(fb::checksum(alg, d)))
            .await
    }
}
