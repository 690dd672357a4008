//! The first CRC-32 one-shots on crc32fast in a process race to make the
//! `Hasher` they all clone (`crc_plan::crc32fast_once`): a file of its own,
//! so that no other test has made it first.

use std::sync::{Arc, Barrier};

use crypto_offload_fallback::choice::Choice;
use crypto_offload_fallback::{CrcAlg, Implementation, checksum_with};

#[test]
fn the_first_crc32fast_one_shots_race_and_agree() {
    let reference = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
    let data: Arc<Vec<u8>> = Arc::new((0..5_000u32).map(|i| (i * 131 + 7) as u8).collect());
    // Every length on crc32fast.
    let choice = Choice::one(Implementation::Crc32Fast);
    let lens = [
        0, 1, 15, 16, 127, 128, 255, 256, 2047, 2048, 2175, 2176, 5000,
    ];
    let go = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (data, go) = (data.clone(), go.clone());
            std::thread::spawn(move || {
                let len = lens[t % lens.len()];
                go.wait();
                (
                    len,
                    checksum_with(CrcAlg::Crc32IsoHdlc, choice, &data[..len]),
                )
            })
        })
        .collect();
    for t in threads {
        let (len, got) = t.join().expect("a CRC thread");
        assert_eq!(got, u64::from(reference.checksum(&data[..len])), "{len} B");
    }
}
