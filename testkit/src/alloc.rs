//! Allocations counted per thread: a global allocator for test binaries that check how
//! much memory a step asks for, or how that grows with its input, without a clock.
//!
//! A test binary installs it with
//! `#[global_allocator] static ALLOC: graphc_testkit::alloc::Counting = graphc_testkit::alloc::Counting;`
//! and wraps the step in [`measure`]. Counts are per thread (the other tests of the
//! binary run beside it) and the same on every run of the same code, loaded machine or
//! not: a count of allocations and of bytes asked for is a measure of work, as a
//! count of steps is (`graphc_ir::work`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting what each thread asks of it.
pub struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

/// Record an allocation (or growth) of `grow` bytes and a change of `live` bytes.
fn record(grow: usize, live: i64) {
    // `try_with`: a thread being torn down has no counters left; its frees are not ours.
    let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|b| b.set(b.get().wrapping_add(grow as u64)));
    let _ = LIVE.try_with(|l| {
        let now = l.get().wrapping_add(live);
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the counters are
// const-initialized thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), layout.size() as i64);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), layout.size() as i64);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|l| l.set(l.get().wrapping_sub(layout.size() as i64)));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let delta = new_size as i64 - layout.size() as i64;
        record(new_size.saturating_sub(layout.size()), delta);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What a step asked of the allocator on its thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocs {
    /// Allocations (a growing `realloc` counts as one).
    pub count: u64,
    /// Bytes asked for, growth of reallocations included.
    pub bytes: u64,
    /// The most bytes the step held at once beyond what the thread held before it.
    pub peak_bytes: u64,
}

impl Allocs {
    /// How many times `self`'s bytes are `small`'s (at least 1 byte on each side).
    pub fn growth_over(&self, small: &Allocs) -> f64 {
        self.bytes.max(1) as f64 / small.bytes.max(1) as f64
    }
}

/// Run `f` and count what it allocated on this thread. Zeros unless the binary
/// installed [`Counting`] as its global allocator.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Allocs) {
    let count = COUNT.with(Cell::get);
    let bytes = BYTES.with(Cell::get);
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    let r = f();
    let allocs = Allocs {
        count: COUNT.with(Cell::get) - count,
        bytes: BYTES.with(Cell::get).wrapping_sub(bytes),
        peak_bytes: (PEAK.with(Cell::get) - live).max(0) as u64,
    };
    (r, allocs)
}
