//! What the allocator gets back from a dropped `Wiped`: zeros only. A
//! plain `Box` of the same bytes hands them back as they were (the
//! control: the check sees memory at the moment it is freed).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use crypto_offload_native::Wiped;

/// Sizes no other allocation of the test has.
const WIPED: usize = 4093;
const PLAIN: usize = 4091;

/// Frees of a watched size: all zero, and with the pattern still in them.
static ZEROED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static KEPT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

struct Watching;

// SAFETY: every call is passed to `System` unchanged; `dealloc` reads the
// block it is given (valid for `layout.size()` bytes until freed) first.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let watched = match layout.size() {
            WIPED => Some(0),
            PLAIN => Some(1),
            _ => None,
        };
        if let Some(i) = watched {
            // SAFETY: `ptr` is a live block of `layout.size()` bytes (the
            // caller frees it below, not before).
            let bytes = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            if bytes.iter().all(|&b| b == 0) {
                ZEROED[i].fetch_add(1, Ordering::SeqCst);
            }
            if bytes.iter().all(|&b| b == 0xa5) {
                KEPT[i].fetch_add(1, Ordering::SeqCst);
            }
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Watching = Watching;

/// A value with its own `Drop`, as a key schedule may have: it runs first
/// (and sees its bytes intact), then the bytes are zeroed.
struct Key {
    bytes: [u8; WIPED],
}

static DROPPED_INTACT: AtomicUsize = AtomicUsize::new(0);

impl Drop for Key {
    fn drop(&mut self) {
        if self.bytes.iter().all(|&b| b == 0xa5) {
            DROPPED_INTACT.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[test]
fn a_dropped_value_goes_back_to_the_allocator_zeroed() {
    let wiped = Wiped::new(Key {
        bytes: [0xa5; WIPED],
    });
    assert_eq!(wiped.bytes[17], 0xa5);
    assert_eq!(format!("{wiped:?}"), "Wiped(..)");
    drop(wiped);
    assert_eq!(
        DROPPED_INTACT.load(Ordering::SeqCst),
        1,
        "its Drop ran once"
    );
    assert_eq!(ZEROED[0].load(Ordering::SeqCst), 1);
    assert_eq!(KEPT[0].load(Ordering::SeqCst), 0);

    let plain = Box::new([0xa5u8; PLAIN]);
    std::hint::black_box(&plain);
    drop(plain);
    assert_eq!(
        KEPT[1].load(Ordering::SeqCst),
        1,
        "the control kept its bytes"
    );
    assert_eq!(ZEROED[1].load(Ordering::SeqCst), 0);
}

mod new_with {
    use crypto_offload_native::Wiped;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DROPS: AtomicUsize = AtomicUsize::new(0);

    struct D(u64);

    impl Drop for D {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A value filled in its box is dropped exactly once: when the fill
    /// fails, when it panics, and when the box is dropped after a fill
    /// that worked (whose writes it keeps).
    #[test]
    fn the_value_is_dropped_once_whether_the_fill_fails_panics_or_works() {
        let r = Wiped::new_with(D(1), |d| {
            d.0 = 5;
            Err::<(), _>("no")
        });
        assert!(r.is_err());
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
        let p = std::panic::catch_unwind(|| {
            let _ = Wiped::new_with(D(2), |_| -> Result<(), ()> { panic!("fill") });
        });
        assert!(p.is_err());
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
        let w = Wiped::new_with(D(3), |d| {
            d.0 = 9;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(w.0, 9);
        drop(w);
        assert_eq!(DROPS.load(Ordering::SeqCst), 3);
    }
}
