//! Element stores in a stage's pass: when the stores need only the stages before some
//! stage's pass over the row, they are written in that pass (the last such), not in a
//! pass of their own. Cross-entropy's forward (a max, a sum of exponentials of the
//! shifted logits, the shifted logits stored) then passes over the logits twice, not
//! three times.
//!
//! A store may take the storage of an input in place (the memory plan does so when the
//! kernel is the input's last reader and every read of it is the store's own access).
//! Within the pass each thread reads its chunk before writing it, as in a pass of the
//! stores' own; but a later pass would read the stored values instead of the input's.
//! So no later pass over the row may read an input the stores could overwrite (row-level
//! values load theirs before the first pass); a later stage that picks one element
//! ([`super::pick`]) reads it before the pass (prefetched into registers), when the
//! index it picks at is known by then.

use super::RowFields;
use crate::codegen::{CodegenError, Ctx};
use crate::kernel::ExprId;

/// Where the element stores are written, when not in a pass of their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Ride {
    /// The stage whose pass writes them.
    pub pass: usize,
    /// The picked stages after it whose element inputs are read before that pass.
    pub prefetch: Vec<usize>,
}

/// What the choice reads of the plan: per expression the last stage it needs, each
/// stage's pass, each stage's picked index.
pub(super) struct Classified<'p> {
    pub stage_dep: &'p [Option<usize>],
    pub passes: &'p [Vec<ExprId>],
    pub picked: &'p [Option<ExprId>],
}

/// The pass the element stores ride along (see the module doc), if any.
pub(super) fn store_pass(cx: &Ctx, k: RowFields, c: &Classified) -> Result<Option<Ride>, CodegenError> {
    if k.stores.is_empty() {
        return Ok(None);
    }
    let dep = k.stores.iter().filter_map(|s| c.stage_dep[s.value.index()]).max();
    let Some(pass) = (0..k.stages.len())
        .rev()
        .find(|&i| c.picked[i].is_none() && dep.is_none_or(|d| i > d))
    else {
        return Ok(None);
    };
    // Inputs a store could be written in place of: its access exactly, its element size.
    let mut hazards = Vec::new();
    for (n, a) in k.inputs.iter().enumerate() {
        let size = cx.dtype(a.buffer)?.size_bytes();
        for s in k.stores {
            if s.access.offset == a.offset
                && s.access.strides == a.strides
                && cx.dtype(s.access.buffer)?.size_bytes() == size
            {
                hazards.push(n);
            }
        }
    }
    let reads_hazard = |ids: &[ExprId]| k.loads_of(ids).iter().any(|n| hazards.contains(n));
    let mut prefetch = Vec::new();
    for q in pass + 1..k.stages.len() {
        if !reads_hazard(&c.passes[q]) {
            continue;
        }
        match c.picked[q] {
            Some(r) if c.stage_dep[r.index()].is_none_or(|d| d < pass) => prefetch.push(q),
            _ => return Ok(None),
        }
    }
    // Row-level loads depend on no stage: they are read before the first pass.
    Ok(Some(Ride { pass, prefetch }))
}
