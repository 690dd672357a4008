//! `AesEncryptBlock` / `AesDecryptBlock` against RustCrypto's `aes` with
//! every key size, on each of AWS-LC's AES code paths (each lays its key
//! schedule out its own way): AES-NI, AES-NI without AVX-512, vpaes
//! (AES-NI hidden) and the constant-time C code (SSSE3 hidden too), each
//! in a child process started with an `OPENSSL_ia32cap` mask.
#![cfg(feature = "aws-lc")]

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use crypto_offload_native::{AesDecryptBlock, AesEncryptBlock};
use std::process::Command;

fn run_child(envs: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_blocks",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("OPENSSL_ia32cap");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && so.contains("1 passed"),
        "{envs:?}\n{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{so}");
}

#[test]
#[ignore = "run by blocks_on_every_aes_path in a child process"]
fn child_blocks() {
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    };
    for klen in [16usize, 24, 32] {
        for _ in 0..200 {
            let key: Vec<u8> = (0..klen).map(|_| next()).collect();
            let block: [u8; 16] = core::array::from_fn(|_| next());
            let e = AesEncryptBlock::new(&key).unwrap();
            let d = AesDecryptBlock::new(&key).unwrap();
            let mut got = block;
            e.encrypt(&mut got);
            let mut want = aes::Block::from(block);
            match klen {
                16 => aes::Aes128::new_from_slice(&key)
                    .unwrap()
                    .encrypt_block(&mut want),
                24 => aes::Aes192::new_from_slice(&key)
                    .unwrap()
                    .encrypt_block(&mut want),
                _ => aes::Aes256::new_from_slice(&key)
                    .unwrap()
                    .encrypt_block(&mut want),
            }
            assert_eq!(&got[..], &want[..], "enc klen {klen}");
            let mut back = got;
            d.decrypt(&mut back);
            assert_eq!(back, block);
            let mut w = aes::Block::from(block);
            match klen {
                16 => aes::Aes128::new_from_slice(&key)
                    .unwrap()
                    .decrypt_block(&mut w),
                24 => aes::Aes192::new_from_slice(&key)
                    .unwrap()
                    .decrypt_block(&mut w),
                _ => aes::Aes256::new_from_slice(&key)
                    .unwrap()
                    .decrypt_block(&mut w),
            }
            let mut g = block;
            d.decrypt(&mut g);
            assert_eq!(&g[..], &w[..], "dec klen {klen}");
        }
    }
}

#[test]
fn blocks_on_every_aes_path() {
    run_child(&[]);
    run_child(&[("OPENSSL_ia32cap", "~0:~0x10000")]);
    run_child(&[("OPENSSL_ia32cap", "~0x0200000000000000")]);
    run_child(&[("OPENSSL_ia32cap", "~0x0200020000000000")]);
}
