//! The binary's allocator: mimalloc for everything below [`HUGE`] bytes, the system
//! allocator above.
//!
//! A compile allocates and frees millions of small objects (graph nodes, e-graph
//! classes, plan intervals), on two threads when `fit` probes two values at once.
//! Under glibc's malloc a third of a training plan's time was in `malloc`/`free`, and two
//! probes on two cores ran barely faster than one after the other; with mimalloc,
//! `graphc plan` of a 48-layer training step takes 0.62 s instead of 0.79 s and its
//! `fit --train` 1.4 s instead of 2.9 s.
//!
//! Huge allocations stay with the system allocator: a host-memory check that was
//! missed (a hostile model's absurd dims, an input too large for the host) must fail
//! at `try_reserve` with an error, as glibc's does when the request exceeds what the
//! host can back, not succeed as address space that the first writes cannot back
//! (mimalloc maps large blocks without reserving them), ending in the OOM killer.

use std::alloc::{GlobalAlloc, Layout, System};

use mimalloc::MiMalloc;

/// The size from which an allocation goes to the system allocator.
const HUGE: usize = 1 << 30;

pub struct Allocator;

// SAFETY: every block is allocated, reallocated and freed by the allocator its size
// selects (`Layout::size` is the same at its allocation and its deallocation); a
// reallocation across `HUGE` moves the block between the two.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= HUGE {
            System.alloc(layout)
        } else {
            MiMalloc.alloc(layout)
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= HUGE {
            System.alloc_zeroed(layout)
        } else {
            MiMalloc.alloc_zeroed(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= HUGE {
            System.dealloc(ptr, layout)
        } else {
            MiMalloc.dealloc(ptr, layout)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (layout.size() >= HUGE, new_size >= HUGE) {
            (true, true) => System.realloc(ptr, layout, new_size),
            (false, false) => MiMalloc.realloc(ptr, layout, new_size),
            _ => {
                // SAFETY: the caller guarantees `new_size`, rounded up to the
                // alignment, does not overflow `isize` (GlobalAlloc::realloc's contract).
                let new = Layout::from_size_align_unchecked(new_size, layout.align());
                let moved = self.alloc(new);
                if !moved.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                moved
            }
        }
    }
}
