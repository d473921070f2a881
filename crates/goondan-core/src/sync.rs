//! Locking a `std::sync::Mutex` without the poisoning ceremony.
//!
//! A mutex is poisoned when a thread panics while holding its guard. Every
//! mutex in goondan-rs guards state that stays consistent across a panic
//! (each critical section is a single insert, remove, push or swap, never a
//! multi-step update left half done), and a panic is already reported where
//! it happens; refusing the lock afterwards would only turn one failure into
//! a cascade of them (a tool's panic taking the whole turn's bookkeeping
//! down). So poisoning is ignored, in one place, instead of
//! `.lock().unwrap_or_else(PoisonError::into_inner)` at every call site.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `lock_unpoisoned`: `Mutex::lock` that takes the guard even when a previous
/// holder panicked (see the module docs for why that is sound here).
pub trait LockUnpoisoned<T: ?Sized> {
    /// Blocks until the lock is held and returns its guard, poisoned or not.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockUnpoisoned<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::LockUnpoisoned;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_poisoned_mutex_still_gives_its_value() {
        let shared = Arc::new(Mutex::new(1));
        let holder = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut guard = holder.lock_unpoisoned();
            *guard = 2;
            panic!("while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.lock_unpoisoned(), 2);
    }
}
