//! Row kernels: stages of reductions over the inner dims of each row, then per-row and
//! per-element stores.
//!
//! Thread mapping ([`mode::Mode`]), chosen at codegen time from the static shapes:
//! - A row is handled by one warp when its inner extent is at most [`WARP_ROW_LIMIT`]
//!   (8 rows per 256-thread block), else by one block of 64..1024 threads (whole warps,
//!   about [`BLOCK_PER_THREAD`] elements per thread, evenly split where possible).
//! - When the reduced axis is strided but neighbouring rows are adjacent in memory
//!   (softmax over the channels of `[B, C, HW]`), the lanes of a warp take 32 adjacent
//!   rows and the warps of the block split each row, so every warp access is coalesced.
//!
//! Thread `t` takes chunks `t, t + T, t + 2T, ..` of the row, so warps read contiguous
//! runs. A chunk is one element, or (the vector path, see [`mode::vector_width`]) 16 bytes of
//! elements moved by one vector load or store when every access varying along the row
//! is contiguous along it, 16-byte aligned at every row start, and the row is whole
//! vectors. Each stage reduces in registers, then across the warp with shuffles, then
//! (block per row, or split rows) across warps through shared memory; the stages run in
//! order. Expressions that depend only on stages and row-level loads are computed once
//! per row. When the row fits in registers (at most [`MAX_CACHED_PER_THREAD`] elements
//! per thread, and a quarter of the registers `__launch_bounds__` leaves a thread) the inputs
//! read by more than one pass are loaded once into registers and reused by every stage
//! and the stores; otherwise each pass reads them again.
//!
//! The kernel is planned ([`plan`]: checks, classification, layout, thread mapping from
//! [`mode`]), then written stage by stage ([`emit`], with the reductions of [`reduce`]).

mod emit;
mod mode;
mod pick;
mod plan;
mod reduce;
mod ride;
mod xcache;

use super::{finish, CodegenError, Ctx, CudaKernel, GridSize, LaunchConfig};
use crate::kernel::{Access, Body, Stage, Store};
use emit::Emit;
use plan::Plan;

/// Rows with at most this many inner elements take one warp each.
pub const WARP_ROW_LIMIT: usize = 512;
/// Block-per-row kernels size the block for about this many elements per thread.
const BLOCK_PER_THREAD: usize = 16;
/// Split rows ([`Mode::Columns`]): about this many elements per thread along a row.
const COLUMN_PER_THREAD: usize = 16;
/// At most this many elements per thread are kept in registers.
const MAX_CACHED_PER_THREAD: usize = 32;
/// And at most this many registers for cached inputs in all.
const MAX_CACHE_REGS: usize = 64;

pub(crate) use crate::kernel::RowKernel;

/// The fields of a row kernel the generator reads, borrowed (built once in [`generate`]:
/// once `KernelKind::Row` holds a struct, this can be that struct, borrowed).
#[derive(Clone, Copy)]
struct RowFields<'a> {
    outer: &'a [usize],
    inner: &'a [usize],
    inputs: &'a [Access],
    body: &'a Body,
    stages: &'a [Stage],
    row_stores: &'a [Store],
    stores: &'a [Store],
}

pub(crate) fn generate(cx: &Ctx, k: &RowKernel) -> Result<CudaKernel, CodegenError> {
    let row = RowFields {
        outer: &k.outer,
        inner: &k.inner,
        inputs: &k.inputs,
        body: &k.body,
        stages: &k.stages,
        row_stores: &k.row_stores,
        stores: &k.stores,
    };
    let p = Plan::new(cx, row)?;
    let mut e = Emit::new(cx, &p);
    e.header();
    e.row_exprs(None)?;
    e.load_cache()?;
    for si in 0..row.stages.len() {
        e.stage(si)?;
    }
    e.row_stores()?;
    e.stores()?;
    e.w.close();
    e.w.close();

    let (source, entry) = finish("row", &e.h, &e.w.finish());
    // A block per row (group of rows), not a grid that fits the device: how many blocks
    // an SM holds depends on the registers ptxas gives the kernel, and a grid-stride
    // loop over a grid larger than what is resident leaves a tail running on part of the
    // device. `blocks_per_sm = max_blocks` gives `max_blocks` blocks on any device (the
    // loop still strides, for grids past the launch limit).
    let max_blocks = p.rows.div_ceil(p.rpb).min(i32::MAX as usize) as u32;
    Ok(CudaKernel {
        name: String::new(),
        source,
        entry,
        params: p.params.list,
        launch: LaunchConfig {
            block: p.block as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: max_blocks.max(1),
                max_blocks,
            },
            shared_mem_bytes: 0,
        },
        gemm: None,
    })
}
