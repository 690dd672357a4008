//! A box whose contents are zeroed once they have been dropped.

use core::fmt;
use core::mem::MaybeUninit;
use core::ops::Deref;

use zeroize::Zeroize;

/// A heap-allocated `T`, dropped and then overwritten with zeros (through
/// `zeroize`'s volatile writes, which the compiler may not remove) before
/// its memory is freed. For values whose type has no `Zeroize`: foreign
/// key schedules. Read-only through `Deref`: nothing moves the value out
/// to leave an unwiped copy.
pub struct Wiped<T> {
    /// Always initialised until `drop` (which drops it in place first).
    slot: Box<MaybeUninit<T>>,
}

impl<T> Wiped<T> {
    /// Moves `value` onto the heap.
    pub fn new(value: T) -> Self {
        Wiped {
            slot: Box::new(MaybeUninit::new(value)),
        }
    }

    /// Moves `value` onto the heap and lets `fill` write it there before
    /// anything reads it: for a value that is built in place (a foreign
    /// key schedule that a C function expands into its memory), so that
    /// no copy of the finished value is ever left outside the box. When
    /// `fill` fails the box is wiped and freed.
    ///
    /// # Errors
    /// `fill`'s.
    pub fn new_with<E>(value: T, fill: impl FnOnce(&mut T) -> Result<(), E>) -> Result<Self, E> {
        let mut wiped = Wiped::new(value);
        // SAFETY: initialised by `new` just above; this is the only
        // reference (`wiped` is not shared yet), and it ends with `fill`.
        fill(unsafe { wiped.slot.assume_init_mut() })?;
        Ok(wiped)
    }
}

impl<T> Deref for Wiped<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: `slot` is initialised by `new` and stays so until `drop`
        // (nothing else writes it: `Wiped` hands out shared references
        // only), and `drop` cannot run while this borrow lives.
        unsafe { self.slot.assume_init_ref() }
    }
}

impl<T> Drop for Wiped<T> {
    fn drop(&mut self) {
        // SAFETY: initialised until now (see `deref`), and dropped exactly
        // once: after this the slot is only zeroed, never read as a `T`.
        unsafe { self.slot.assume_init_drop() };
        // The bytes the value occupied, zeroed with volatile writes; the
        // box then frees them.
        self.slot.zeroize();
    }
}

impl<T> fmt::Debug for Wiped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // It holds key material: never its contents.
        f.write_str("Wiped(..)")
    }
}
