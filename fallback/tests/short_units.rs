//! XTS data units of 16–47 bytes, one at a time: the lengths where a lone
//! unit runs on AWS-LC's single-block AES (under 32 bytes, when small
//! requests go to AWS-LC) and its neighbours, with every key size, every
//! choice and ciphertext stealing, against `xts-mode`; and the unit
//! lengths that cannot run them, refused with the data untouched.
use aes::{Aes128, Aes192, Aes256};
use cipher::KeyInit;
use crypto_offload_fallback::choice::{Choice, Mode};
use crypto_offload_fallback::{Error, Xts};

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn xts_reference(key: &[u8], tweak: [u8; 16], data: &mut [u8], encrypt: bool) {
    let (k1, k2) = key.split_at(key.len() / 2);
    macro_rules! go {
        ($c:ty) => {{
            let x = xts_mode::Xts128::new(
                <$c>::new_from_slice(k1).unwrap(),
                <$c>::new_from_slice(k2).unwrap(),
            );
            if encrypt {
                x.encrypt_sector(data, tweak.into())
            } else {
                x.decrypt_sector(data, tweak.into())
            }
        }};
    }
    match k1.len() {
        16 => go!(Aes128),
        24 => go!(Aes192),
        32 => go!(Aes256),
        _ => unreachable!(),
    }
}

#[test]
fn every_short_lone_unit_every_key_size_every_choice() {
    // Which implementation a 16-31 byte request says it runs on follows the
    // small class (AWS-LC's single-block AES when it is AWS-LC's).
    let mut n = 0;
    for klen in [32usize, 48, 64] {
        for seed in 0..4u64 {
            let key = bytes(klen, 0x1234 + seed * 77 + klen as u64);
            // Each candidate alone, and every split of two.
            let candidates = Mode::Xts.candidates();
            let choices = candidates.iter().flat_map(|&small| {
                candidates.iter().map(move |&large| match small == large {
                    true => Choice::one(small),
                    false => Choice::split(small, large),
                })
            });
            for choice in choices {
                let xts = Xts::with_choice(&key, choice).unwrap();
                for len in [16, 31] {
                    assert_eq!(xts.implementation_for(len), choice.small, "{choice:?}");
                }
                for len in 16..=47usize {
                    for tweak in [
                        [0u8; 16],
                        [0xff; 16],
                        (u64::MAX as u128).to_le_bytes(),
                        bytes(16, seed ^ len as u64).try_into().unwrap(),
                    ] {
                        let pt = bytes(len, seed * 1000 + len as u64);
                        let mut want = pt.clone();
                        xts_reference(&key, tweak, &mut want, true);
                        let mut got = pt.clone();
                        xts.encrypt(&tweak, &mut got).unwrap();
                        assert_eq!(got, want, "enc klen {klen} len {len} {choice:?}");
                        let mut got2 = pt.clone();
                        xts.encrypt_units(&tweak, len, &mut got2).unwrap();
                        assert_eq!(got2, want);
                        xts.decrypt(&tweak, &mut got).unwrap();
                        assert_eq!(got, pt, "dec klen {klen} len {len} {choice:?}");
                        let mut c = want.clone();
                        xts.decrypt_units(&tweak, len, &mut c).unwrap();
                        assert_eq!(c, pt);
                        n += 1;
                    }
                }
            }
        }
    }
    let choices = Mode::Xts.candidates().len().pow(2);
    assert_eq!(n, 3 * 4 * choices * 32 * 4);
}

#[test]
fn short_lengths_with_other_unit_lens_are_refused_untouched() {
    for klen in [32usize, 48, 64] {
        let xts = Xts::new(&bytes(klen, 9)).unwrap();
        for len in 0..=47usize {
            for unit in [0usize, 1, 8, 15, 16, 17, 24, 31, 32, 33, 47, 48, usize::MAX] {
                let mut d = vec![0xa5u8; len];
                let r = xts.encrypt_units(&[3; 16], unit, &mut d);
                let valid = unit >= 16 && len % unit == 0;
                assert_eq!(r.is_ok(), valid, "len {len} unit {unit}");
                if !valid {
                    assert!(matches!(r, Err(Error::DataLength { .. })));
                    assert!(
                        d.iter().all(|&b| b == 0xa5),
                        "touched: len {len} unit {unit}"
                    );
                }
                let r = xts.decrypt_units(&[3; 16], unit, &mut d);
                assert_eq!(r.is_ok(), valid, "dec len {len} unit {unit}");
            }
        }
    }
}
