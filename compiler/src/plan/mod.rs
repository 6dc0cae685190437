//! Memory planning: the schedule, liveness, in-place reuse and the offsets of every
//! intermediate in one arena.
//!
//! - `schedule.rs` — [`schedule`]: several valid kernel orders ([`Scheduler`]: program,
//!   three DFS variants, a list scheduler that frees big buffers first, BFS); the lowest
//!   peak of live bytes wins. The pipeline applies it ([`Schedule::apply`]) before
//!   planning.
//! - `offsets.rs` — the API, input validation and the driver: greedy best-fit in several
//!   orders (`greedy.rs`); if that is above `max(lower bound, capacity target)`, the
//!   exact search (`search.rs`) for that goal, then a bisection over targets between the
//!   goal and the best arena found; a local search over greedy orders (`greedy.rs`) as
//!   the last resort. All within `node_limit` visited states (the memory planner's: at
//!   most `SEARCH_WORK` / the buffer count, so its plans do not depend on the machine's
//!   speed) and `time_budget` (a safety stop).
//! - `search.rs` — the exact search, after MiniMalloc (Moffitt, ASPLOS 2023): canonical
//!   placements (each buffer at the lowest offset the buffers placed before it allow, in
//!   non-decreasing offset order), dominance and "hatless" pruning, per-section
//!   inference (floor + unplaced units within the target), dynamic ordering by minimum
//!   offset, decomposition into independent sub-problems where no unplaced buffer spans
//!   a time cut, a memo of failed states, and round-robin restarts over four static
//!   preorders. A complete search that finds nothing proves the target infeasible.
//! - `memory.rs` — [`plan_memory`]: a fused program's intermediates into one arena
//!   (liveness over the kernel order; in-place reuse; inputs, weights and outputs
//!   outside the arena; the budget), as a serde [`MemoryPlan`] with every kernel's
//!   arguments and where they live.
//! - `report/` — [`report::summary`], [`report::picture`] (terminal) and
//!   [`report::svg`] of a plan; [`report::diagnose`] (a serializable [`Diagnosis`]),
//!   [`over_budget_diagnosis`] / [`check_budget`]: why a plan does not fit and what would
//!   help; [`PlanJson`]: what `graphc plan --json` prints.
//! - `arch.rs` — [`Arch`], the `sm_XX` a plan is for.
//! - `verify.rs` — [`verify`] (a placement: alignment, no overlap in time and address,
//!   arena covers every buffer, at least the lower bound) and [`verify_plan`] (a
//!   [`MemoryPlan`] against its program).
//!
//! The offset core works in units of the alignment: sizes are rounded up to `align` and
//! offsets are multiples of it, so the arena is a multiple of `align` too.

mod arch;
mod greedy;
mod memory;
mod offsets;
pub mod report;
mod schedule;
mod search;
mod verify;

pub use arch::{Arch, ArchError};
pub use memory::{
    plan_memory, ArgAccess, Device, LiveTensor, MemoryOptions, MemoryPlan, Place, PlanArg, PlanStep, PlannedBuffer,
    PlannedScratch, StepKind, DEFAULT_BUDGET, GEMM_WORKSPACE_BYTES,
};
pub use offsets::{
    assign_offsets, greedy_arena, lower_bound, Interval, Placement, PlanError, PlanOptions, Strategy,
    EXACT_MAX_BUFFERS, SEARCH_WORK,
};
pub use report::{
    check_budget, check_budget_for, check_training_budget_for, diagnose, over_budget_diagnosis, Diagnosis, OverBudget,
    PlanJson, Remedy, Rerun,
};
pub(crate) use schedule::rename as rename_kernel;
pub use schedule::{apply_schedule, candidate_orders, live_bytes, schedule, stable_order, Schedule, Scheduler};
pub use verify::{verify, verify_plan};
