//! Memory planning: the offset-assignment core.
//!
//! Given buffers with lifetimes over a fixed schedule ([`Interval`]: live over
//! `[start, end)`, `size` bytes), [`assign_offsets`] places each one at an offset in a
//! single arena so that no two buffers live at the same time share an address, and tries
//! to make the arena as small as the live-bytes [`lower_bound`].
//!
//! - `offsets.rs` — the API, input validation and the driver: greedy best-fit in several
//!   orders (`greedy.rs`); if that is above `max(lower bound, capacity target)`, the
//!   exact search (`search.rs`) for that goal, then a bisection over targets between the
//!   goal and the best arena found; a local search over greedy orders (`greedy.rs`) as
//!   the last resort. All within `node_limit` visited states and `time_budget`.
//! - `search.rs` — the exact search, after MiniMalloc (Moffitt, ASPLOS 2023): canonical
//!   placements (each buffer at the lowest offset the buffers placed before it allow, in
//!   non-decreasing offset order), dominance and "hatless" pruning, per-section
//!   inference (floor + unplaced units within the target), dynamic ordering by minimum
//!   offset, decomposition into independent sub-problems where no unplaced buffer spans
//!   a time cut, a memo of failed states, and round-robin restarts over four static
//!   preorders. A complete search that finds nothing proves the target infeasible.
//! - `memory.rs` — [`plan_memory`]: a fused program's intermediates into one arena
//!   (liveness over the kernel order; inputs, weights and outputs outside the arena).
//! - `verify.rs` — [`verify`]: the plan checker (alignment, no overlap in time and
//!   address, arena covers every buffer and is at least the lower bound).
//!
//! Everything works in units of the alignment: sizes are rounded up to `align` and
//! offsets are multiples of it, so the arena is a multiple of `align` too.

mod greedy;
mod memory;
mod offsets;
mod search;
mod verify;

pub use memory::{plan_memory, MemoryOptions, MemoryPlan, PlannedBuffer, DEFAULT_BUDGET};
pub use offsets::{assign_offsets, greedy_arena, lower_bound, Interval, Placement, PlanError, PlanOptions};
pub use verify::verify;
