//! The planned executor: a program run through ONE host arena at the offsets of a
//! [`MemoryPlan`], the same bytes the GPU would use.
//!
//! Every intermediate (a temp buffer that is not a graph output) lives in the arena at
//! its planned offset, so a plan that puts two live buffers on the same bytes gives
//! wrong numbers here, not only on a GPU. Inputs, weights and constants are read from
//! the caller's tensors; graph outputs get their own allocations.
//!
//! Each kernel decodes the arena buffers it reads (little-endian, the layout of the
//! device) into tensors, runs through the same validation and evaluation as
//! [`run_program`](super::run_program), and encodes what it writes back into the arena.
//! All of a kernel's reads are decoded before any write, so an output planned onto the
//! bytes of an input whose last reader is that kernel (in-place reuse) is correct.
//! The arena starts filled with [`POISON`], so reading bytes no kernel wrote shows up
//! (NaN for floats).

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::kernel::{BufferId, BufferKind, Program};
use graphc_compiler::plan::MemoryPlan;
use graphc_ir::{Tensor, TensorData};

use super::{bind, describe, exec_kernel, kernel_error, KernelError};

/// The byte the arena holds before any kernel writes it: all-ones bytes are NaN in
/// every float dtype, -1 in the signed integers, 255 in u8 and `true` as bool.
pub const POISON: u8 = 0xFF;

/// Where an arena buffer's bytes are: `len` is the tensor's exact size (the plan may
/// reserve more).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    pub offset: usize,
    pub len: usize,
    pub start: u32,
    pub end: u32,
}

/// Run `program` with every intermediate in one arena laid out by `plan`; returns the
/// named outputs in order.
///
/// Inputs, weights and constants are bound as by [`run_program`](super::run_program)
/// (same errors). The plan is checked against the program before anything runs (a
/// [`KernelError::Plan`] naming the buffer): it is for this program's kernel count;
/// every planned buffer exists, is a temp and not a graph output, has room for its
/// tensor at an offset that is a multiple of its element size and ends inside the
/// arena; every temp a kernel writes is planned or a graph output; and each planned
/// buffer is written at its lifetime's start and read only within it. Overlaps are
/// not checked here (that is the planner's verifier): an overlap of live buffers
/// shows as wrong outputs.
pub fn run_planned(
    program: &Program,
    plan: &MemoryPlan,
    weights: &BTreeMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let places = validate(program, plan)?;
    let mut slots = bind(program, weights, inputs)?;
    let mut arena = alloc_arena(plan.arena_bytes)?;

    let mut written = vec![false; program.buffers.len()];
    let mut local: Vec<(BufferId, Tensor)> = Vec::new();
    for (index, kernel) in program.kernels.iter().enumerate() {
        // Decode every arena buffer the kernel reads before it writes anything.
        local.clear();
        for b in kernel.reads() {
            let i = b.index();
            let Some(Some(place)) = places.get(i) else { continue };
            if !written[i] || local.iter().any(|(id, _)| *id == b) {
                continue; // not written yet: the kernel's validation names it
            }
            let ty = &program.buffers[i].ty;
            let bytes = &arena[place.offset..place.offset + place.len];
            let t = TensorData::from_le_bytes(ty.dtype, bytes, ty.numel())
                .and_then(|data| Tensor::new(ty.shape.clone(), data).ok())
                .ok_or_else(|| {
                    kernel_error(
                        program,
                        index,
                        format!(
                            "internal error: cannot decode buffer {}",
                            describe(b, &program.buffers[i])
                        ),
                    )
                })?;
            local.push((b, t));
        }
        let writes = exec_kernel(program, index, &|id| {
            local
                .iter()
                .find(|(b, _)| *b == id)
                .map(|(_, t)| t)
                .or_else(|| slots.get(id.index()).and_then(|s| s.as_deref()))
        })?;
        for (id, t) in writes {
            let i = id.index();
            if written[i] {
                return Err(kernel_error(
                    program,
                    index,
                    format!("writes buffer b{} which an earlier kernel already wrote", id.0),
                ));
            }
            written[i] = true;
            match places[i] {
                Some(place) => encode(t.data(), &mut arena[place.offset..place.offset + place.len]),
                None => slots[i] = Some(std::borrow::Cow::Owned(t)),
            }
        }
    }

    super::collect_outputs(program, |id| slots[id.index()].as_deref())
}

/// Check `plan` against `program` (see [`run_planned`]); the arena place of every
/// buffer, `None` for buffers outside the arena.
pub(crate) fn validate(program: &Program, plan: &MemoryPlan) -> Result<Vec<Option<Place>>, KernelError> {
    let err = |m: String| Err(KernelError::Plan(m));
    let kernels = program.kernels.len();
    if plan.kernels != kernels {
        return err(format!(
            "the plan is for {} kernels but the program has {kernels}",
            plan.kernels
        ));
    }
    let n = program.buffers.len();
    let mut is_output = vec![false; n];
    for (_, id) in &program.outputs {
        if let Some(o) = is_output.get_mut(id.index()) {
            *o = true;
        }
    }

    let mut places: Vec<Option<Place>> = vec![None; n];
    for pb in &plan.buffers {
        let id = pb.buffer;
        let Some(buf) = program.buffers.get(id.index()) else {
            return err(format!("planned buffer b{} does not exist ({n} buffers)", id.0));
        };
        let what = describe(id, buf);
        if !matches!(buf.kind, BufferKind::Temp) {
            return err(format!(
                "{what} is planned into the arena, but only temps live there (inputs, weights and constants do not)"
            ));
        }
        if is_output[id.index()] {
            return err(format!(
                "{what} is planned into the arena, but it is a graph output, which has its own allocation"
            ));
        }
        if places[id.index()].is_some() {
            return err(format!("{what} is planned twice"));
        }
        let elem = buf.ty.dtype.size_bytes();
        let size = buf
            .ty
            .shape
            .checked_numel()
            .and_then(|e| e.checked_mul(elem))
            .ok_or_else(|| KernelError::Plan(format!("{what}: {} is too large", buf.ty)))?;
        if pb.bytes < size as u64 {
            return err(format!(
                "{what} is {} ({size} bytes) but is planned with {} bytes",
                buf.ty, pb.bytes
            ));
        }
        match pb.offset.checked_add(pb.bytes) {
            Some(top) if top <= plan.arena_bytes => {}
            _ => {
                return err(format!(
                    "{what} at offset {} with {} bytes lies past the end of the {}-byte arena",
                    pb.offset, pb.bytes, plan.arena_bytes
                ))
            }
        }
        if pb.offset % elem as u64 != 0 {
            return err(format!(
                "{what} is at offset {}, which is not a multiple of its element size {elem}",
                pb.offset
            ));
        }
        if plan.align > 0 && pb.offset % plan.align != 0 {
            return err(format!(
                "{what} is at offset {}, which is not a multiple of the plan's alignment {}",
                pb.offset, plan.align
            ));
        }
        if pb.start >= pb.end || pb.end as usize > kernels {
            return err(format!(
                "{what} has lifetime [{}, {}), which is empty or past the program's {kernels} kernels",
                pb.start, pb.end
            ));
        }
        let offset = usize::try_from(pb.offset)
            .map_err(|_| KernelError::Plan(format!("{what}: offset {} does not fit in memory", pb.offset)))?;
        places[id.index()] = Some(Place {
            offset,
            len: size,
            start: pb.start,
            end: pb.end,
        });
    }

    // Every temp a kernel touches is in the arena (within its lifetime) or an output.
    // Buffers that do not exist or are not temps are left to the kernel's own checks.
    let kernel_name = |k: usize| format!("kernel {k} ({})", program.kernels[k].name);
    for (k, kernel) in program.kernels.iter().enumerate() {
        let temp = |b: BufferId| {
            program
                .buffers
                .get(b.index())
                .filter(|buf| matches!(buf.kind, BufferKind::Temp) && !is_output[b.index()])
        };
        for b in kernel.writes() {
            let Some(buf) = temp(b) else { continue };
            match places[b.index()] {
                None => {
                    return err(format!(
                        "{} is written by {} but is neither planned nor a graph output",
                        describe(b, buf),
                        kernel_name(k)
                    ))
                }
                Some(p) if p.start as usize != k => {
                    return err(format!(
                        "{} is written by {} but its planned lifetime [{}, {}) starts at kernel {}",
                        describe(b, buf),
                        kernel_name(k),
                        p.start,
                        p.end,
                        p.start
                    ))
                }
                Some(_) => {}
            }
        }
        for b in kernel.reads() {
            let Some(buf) = temp(b) else { continue };
            // An unplanned temp no kernel writes: the kernel reports reading it unwritten.
            if let Some(p) = places[b.index()] {
                if !(p.start as usize <= k && k < p.end as usize) {
                    return err(format!(
                        "{} is read by {} outside its planned lifetime [{}, {})",
                        describe(b, buf),
                        kernel_name(k),
                        p.start,
                        p.end
                    ));
                }
            }
        }
    }
    Ok(places)
}

/// The arena: `bytes` of [`POISON`], or an error when it cannot be allocated.
fn alloc_arena(bytes: u64) -> Result<Vec<u8>, KernelError> {
    let fail = |why: String| KernelError::Plan(format!("cannot allocate the {bytes}-byte arena: {why}"));
    let len = usize::try_from(bytes).map_err(|_| fail("too large for this machine".into()))?;
    let mut arena = Vec::new();
    arena.try_reserve_exact(len).map_err(|e| fail(e.to_string()))?;
    arena.resize(len, POISON);
    Ok(arena)
}

/// Write `data` little-endian into `dst` (exactly its size).
pub(crate) fn encode(data: &TensorData, dst: &mut [u8]) {
    macro_rules! put {
        ($v:expr, $n:literal) => {
            for (d, x) in dst.chunks_exact_mut($n).zip($v.iter()) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        };
    }
    debug_assert_eq!(dst.len(), data.len() * data.dtype().size_bytes());
    match data {
        TensorData::F32(v) => put!(v, 4),
        TensorData::F16(v) => put!(v, 2),
        TensorData::BF16(v) => put!(v, 2),
        TensorData::F64(v) => put!(v, 8),
        TensorData::I64(v) => put!(v, 8),
        TensorData::I32(v) => put!(v, 4),
        TensorData::I8(v) => put!(v, 1),
        TensorData::U8(v) => dst.copy_from_slice(v),
        TensorData::Bool(v) => {
            for (d, &x) in dst.iter_mut().zip(v) {
                *d = x as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphc_ir::DType;

    #[test]
    fn encode_matches_to_le_bytes_for_every_dtype() {
        for dtype in DType::ALL {
            let t = Tensor::random(&graphc_ir::TensorType::new(dtype, [3, 5]), 7);
            let want = t.data().to_le_bytes();
            let mut got = vec![POISON; want.len()];
            encode(t.data(), &mut got);
            assert_eq!(got, want, "{dtype}");
            assert_eq!(TensorData::from_le_bytes(dtype, &got, 15).as_ref(), Some(t.data()));
        }
    }
}
