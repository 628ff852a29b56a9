//! Small shared primitives every layer may use (layer 0): today the poison-tolerant [`lock`].
//!
//! It owns nothing but helpers over `std`; it must never import another module of the crate.

use std::sync::{Mutex, MutexGuard};

/// Lock a std mutex, recovering from poisoning: the data behind our locks stays consistent
/// across a panic in another holder because every critical section is a few field updates.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
