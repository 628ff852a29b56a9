//! Small shared primitives every layer may use (layer 0): the poison-tolerant [`lock`],
//! [`read`] and [`write`], the one place a std lock is taken.
//!
//! It owns nothing but helpers over `std`; it must never import another module of the crate.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock a std mutex, recovering from poisoning: the data behind our locks stays consistent
/// across a panic in another holder because every critical section is a few field updates.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Take a std read-write lock shared, recovering from poisoning (as [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Take a std read-write lock exclusive, recovering from poisoning (as [`lock`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}
