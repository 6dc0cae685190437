//! The thread mapping of a row kernel ([`Mode`]) and its vector width, chosen from the
//! static shapes and strides.

use graphc_ir::DType;

use super::{BLOCK_PER_THREAD, COLUMN_PER_THREAD, WARP_ROW_LIMIT};
use crate::codegen::layout;

/// How threads map to rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// `lanes` lanes per row (a power of two up to 32: rows of few chunks share a
    /// warp), 256-thread blocks.
    Warp { lanes: usize },
    /// A block of this many threads (a multiple of 32) per row.
    Block(usize),
    /// `cols` adjacent rows per block (the reduced axis is strided, the rows' elements
    /// adjacent: coalesced), lane `l` on row `l % cols` (the `32 / cols` lanes of a warp
    /// with one row split it), and `ws` warps splitting each row.
    Columns { cols: usize, ws: usize },
}

impl Mode {
    /// Threads per row, threads per block, rows per block.
    pub fn shape(self) -> (usize, usize, usize) {
        match self {
            Mode::Warp { lanes } => (lanes, 256, 8 * (32 / lanes)),
            Mode::Block(b) => (b, b, 1),
            Mode::Columns { cols, ws } => (ws * (32 / cols), ws * 32, cols),
        }
    }
}

/// The thread mapping for `rows` rows of `n_inner` elements moved `vw` at a time
/// ([`vector_width`]; the split-row mode is never vectorized). `elem` lists the accesses
/// varying along the row as `(dtype, offset, outer position, inner position)`.
pub(super) fn choose_mode(
    rows: usize,
    n_inner: usize,
    vw: usize,
    elem: &[(DType, i64, usize, usize)],
    oc: &layout::Collapsed,
    ic: &layout::Collapsed,
) -> Mode {
    // Columns: the innermost outer dim steps every access by 0 or 1 element (some
    // varying access by 1), while no varying access is contiguous along the row.
    let columns = match oc.dims.len().checked_sub(1) {
        Some(l) if rows.is_multiple_of(32) && n_inner > 1 && oc.dims[l] >= 32 && !elem.is_empty() => {
            oc.strides.iter().all(|s| s[l] == 0 || s[l] == 1)
                && elem.iter().any(|&(_, _, po, _)| oc.strides[po][l] == 1)
                && elem
                    .iter()
                    .all(|&(_, _, _, pi)| ic.strides[pi].last().is_some_and(|s| s.unsigned_abs() != 1))
        }
        _ => false,
    };
    if columns {
        // 32 rows a block; or, when that leaves fewer than 128 blocks (768 LayerNorm
        // weight gradients over 2048 tokens: 24), as few as one 32-byte sector of the
        // widest access holds, so more blocks share the rows.
        let widest = elem.iter().map(|e| e.0.size_bytes()).max().unwrap_or(4).max(1);
        let cols = if rows / 32 >= 128 {
            32
        } else {
            (32 / widest).clamp(8, 32)
        };
        let per_warp = 32 / cols;
        Mode::Columns {
            cols,
            ws: n_inner
                .div_ceil(COLUMN_PER_THREAD * per_warp)
                .next_power_of_two()
                .clamp(1, 16),
        }
    } else if n_inner <= WARP_ROW_LIMIT {
        // Rows of fewer chunks than lanes share a warp (attention's per-row sums over a
        // 64-wide head: 8 chunks of 8), when the rows fill whole warps (the lanes of a
        // warp then leave the loop over rows together, as its shuffles need).
        let lanes = (n_inner / vw).next_power_of_two().clamp(1, 32);
        let lanes = if rows.is_multiple_of(32 / lanes) { lanes } else { 32 };
        Mode::Warp { lanes }
    } else {
        // About BLOCK_PER_THREAD elements per thread, then as few threads as give each
        // the same number of chunks (in whole warps), so few threads idle.
        let n_chunks = n_inner / vw;
        let target = (BLOCK_PER_THREAD / vw).max(1);
        let threads = n_chunks.div_ceil(target).next_multiple_of(32).clamp(64, 1024);
        let cpt = n_chunks.div_ceil(threads);
        Mode::Block(n_chunks.div_ceil(cpt).next_multiple_of(32).clamp(64, 1024))
    }
}

/// Elements per vector access over rows that start anywhere (16 bytes of the widest type),
/// or 1: one inner dim, every access varying along the row a contiguous run of it, all
/// of them the same distance past a multiple of the width at every row start (offsets
/// and outer strides congruent), and rows of at least 4 vectors. A row's first
/// elements up to that multiple, and its last past whole vectors, go element by
/// element ([`super::plan::Plan::shift`]).
pub(super) fn shifted_width(
    elem: &[(DType, i64, usize, usize)],
    n_inner: usize,
    outer: &[Vec<i64>],
    ic: &layout::Collapsed,
) -> usize {
    let (Some(max_size), Some(first)) = (elem.iter().map(|e| e.0.size_bytes()).max(), elem.first()) else {
        return 1;
    };
    let v = (16 / max_size.clamp(1, 16)) as i64;
    let congruent = |a: i64, b: i64| (a - b).rem_euclid(v) == 0;
    let ok = v > 1
        && ic.dims.len() == 1
        && n_inner >= 4 * v as usize
        && elem.iter().all(|&(_, off, po, pi)| {
            ic.strides[pi] == [1]
                && congruent(off, first.1)
                && outer[po].len() == outer[first.2].len()
                && outer[po].iter().zip(&outer[first.2]).all(|(&a, &b)| congruent(a, b))
        });
    if ok {
        v as usize
    } else {
        1
    }
}

/// Elements per vector access (16 bytes of the widest type), or 1: every access varying
/// along the row must read it as one contiguous run (stride 1), start every row at a
/// multiple of the width (offset and outer strides), and the row must be whole vectors.
pub(super) fn vector_width(
    elem: &[(DType, i64, usize, usize)],
    n_inner: usize,
    outer: &[Vec<i64>],
    ic: &layout::Collapsed,
) -> usize {
    let Some(max_size) = elem.iter().map(|e| e.0.size_bytes()).max() else {
        return 1;
    };
    let v = 16 / max_size.clamp(1, 16);
    let ok = v > 1
        && ic.dims.len() == 1
        && n_inner >= v
        && n_inner.is_multiple_of(v)
        && elem.iter().all(|&(_, off, po, pi)| {
            ic.strides[pi] == [1]
                && off.rem_euclid(v as i64) == 0
                && outer[po].iter().all(|s| s.rem_euclid(v as i64) == 0)
        });
    if ok {
        v
    } else {
        1
    }
}
