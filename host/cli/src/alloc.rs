//! The allocator's settings per subcommand.
//!
//! Every subcommand starts with jemalloc as the operator needs it
//! ([`kiln_operator::memory::JEMALLOC_CONF`], read before `main` runs): one arena and no
//! per-thread caches (freed memory is reused by whichever thread allocates next), and pages
//! freed for a second handed back to the OS by jemalloc's own background thread, so an idle
//! operator with a large heap shrinks without allocating. [`settle`] then keeps or drops, per
//! subcommand, what only the operator needs:
//!
//! - [`Profile::Operator`] keeps all of it;
//! - [`Profile::Small`] (the node agents: exporter, device plugin, GFD, validator; and the
//!   one-shot tools) keeps one arena and no thread caches, which hold their heaps smallest too,
//!   and stops the background thread: their heaps are a few MiB and they allocate on every
//!   request or interval, which is when jemalloc returns pages without that thread, so it would
//!   only be one more thread waking up.
//!
//! The figures behind the choice are in `docs/benchmarks.md` (allocator per subcommand).

use std::ffi::CStr;

/// What a subcommand needs of the allocator (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// A large, long-lived heap: jemalloc's background thread returns freed pages while idle.
    Operator,
    /// A small heap, allocating as it works: no background thread.
    Small,
}

/// jemalloc's `background_thread` control: whether its purging thread runs (`bool`).
const BACKGROUND_THREAD: &CStr = c"background_thread";

/// Applies `profile` to the running allocator. Fails with jemalloc's error number (an `errno`
/// value) when it refuses the setting.
pub fn settle(profile: Profile) -> Result<(), i32> {
    write_bool(BACKGROUND_THREAD, profile == Profile::Operator)
}

/// Whether jemalloc's background thread is on now; `None` when jemalloc does not say.
pub fn background_thread() -> Option<bool> {
    let mut value = false;
    let mut len = size_of::<bool>();
    // SAFETY: `BACKGROUND_THREAD` is NUL-terminated and names a `bool` control; jemalloc writes
    // at most `len` bytes (the size of a `bool`) to `value` and writes nothing through a null
    // new-value pointer.
    #[allow(unsafe_code)]
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            BACKGROUND_THREAD.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0 && len == size_of::<bool>()).then_some(value)
}

/// Writes the `bool` control `name`.
fn write_bool(name: &CStr, value: bool) -> Result<(), i32> {
    let mut value = value;
    // SAFETY: `name` is NUL-terminated and names a `bool` control; jemalloc reads `size_of::<bool>()`
    // bytes from `value` and reads back nothing (null old-value pointers).
    #[allow(unsafe_code)]
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut value).cast(),
            size_of::<bool>(),
        )
    };
    if rc == 0 { Ok(()) } else { Err(rc) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings reach the allocator this binary links (jemalloc, through
    /// `kiln_operator::global_allocator!`): the operator's profile runs the background thread,
    /// the small one stops it.
    #[test]
    fn each_profile_sets_the_background_thread() {
        settle(Profile::Small).unwrap();
        assert_eq!(background_thread(), Some(false));
        settle(Profile::Operator).unwrap();
        assert_eq!(background_thread(), Some(true));
        settle(Profile::Small).unwrap();
        assert_eq!(background_thread(), Some(false));
    }
}
