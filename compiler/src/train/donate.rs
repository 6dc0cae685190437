//! Which state outputs take over their input's storage ([`Donation`]): a step then
//! updates parameters and moments in place instead of holding two copies.
//!
//! An output is donated to the state input of the same name when its one writer is an
//! elementwise or row kernel that stores it per element and reads the input (if at
//! all) only at the element it stores, no kernel reads the output, and both have one
//! element type and count. The scheduler then runs that writer after every other
//! reader of the input ([`crate::plan::schedule`]), and [`check`] verifies it.

use std::collections::HashMap;

use crate::kernel::{strides_equal, BufferKind, Donation, KernelKind, Program};

use super::State;

/// The donations of `program`'s state outputs.
pub fn donations(program: &Program, state: &State) -> Vec<Donation> {
    let inputs: HashMap<&str, usize> = program
        .buffers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match &b.kind {
            BufferKind::Input { name } => Some((name.as_str(), i)),
            _ => None,
        })
        .collect();
    let mut readers = vec![0usize; program.buffers.len()];
    let mut writer: Vec<Option<usize>> = vec![None; program.buffers.len()];
    for (k, kernel) in program.kernels.iter().enumerate() {
        for b in kernel.reads() {
            if let Some(r) = readers.get_mut(b.index()) {
                *r += 1;
            }
        }
        for b in kernel.writes() {
            if let Some(w) = writer.get_mut(b.index()) {
                *w = Some(k);
            }
        }
    }
    let mut out = Vec::new();
    for slot in &state.slots {
        let Some(&input) = inputs.get(slot.name.as_str()) else {
            continue;
        };
        let mut named = program.outputs.iter().filter(|(n, _)| n == &slot.name);
        let Some(&(_, output)) = named.next() else { continue };
        let o = output.index();
        let shared = program.outputs.iter().filter(|(_, b)| *b == output).count() > 1;
        let (Some(ob), Some(ib)) = (program.buffers.get(o), program.buffers.get(input)) else {
            continue;
        };
        if shared
            || !matches!(ob.kind, BufferKind::Temp)
            || readers.get(o).copied().unwrap_or(0) > 0
            || ob.ty.dtype != ib.ty.dtype
            || ob.ty.numel() != ib.ty.numel()
        {
            continue;
        }
        let Some(k) = writer.get(o).copied().flatten() else {
            continue;
        };
        if same_element(program, k, input, o) {
            out.push(Donation {
                output,
                input: crate::kernel::BufferId(input as u32),
            });
        }
    }
    out
}

/// Whether kernel `k` stores buffer `out` per element of its space and reads buffer
/// `input` only through that store's access.
fn same_element(program: &Program, k: usize, input: usize, out: usize) -> bool {
    let Some(kernel) = program.kernels.get(k) else {
        return false;
    };
    let (space, reads, stores) = match &kernel.kind {
        KernelKind::Elementwise(e) => (e.space.clone(), &e.inputs, &e.stores),
        KernelKind::Row(r) => {
            if r.row_stores.iter().any(|s| s.access.buffer.index() == out) {
                return false;
            }
            (r.space(), &r.inputs, &r.stores)
        }
        // The part that stores it; the other parts run at the same time, so none may
        // read the input.
        KernelKind::MultiTensor(m) => {
            let stores_out =
                |p: &crate::kernel::ElementwiseKernel| p.stores.iter().any(|s| s.access.buffer.index() == out);
            let Some(part) = m.parts.iter().find(|p| stores_out(p)) else {
                return false;
            };
            let others_read = m
                .parts
                .iter()
                .filter(|p| !stores_out(p))
                .any(|p| p.inputs.iter().any(|a| a.buffer.index() == input));
            if others_read {
                return false;
            }
            (part.space.clone(), &part.inputs, &part.stores)
        }
        _ => return false,
    };
    let Some(store) = stores.iter().find(|s| s.access.buffer.index() == out) else {
        return false;
    };
    reads
        .iter()
        .filter(|a| a.buffer.index() == input)
        .all(|a| a.offset == store.access.offset && strides_equal(&a.strides, &store.access.strides, &space))
}

/// A donation holds in `program`'s kernel order: the writer of the output runs after
/// every other reader of the input, and reads it only at the element it stores.
pub fn check(program: &Program) -> Result<(), String> {
    for d in &program.donated {
        let writers: Vec<usize> = (0..program.kernels.len())
            .filter(|&k| program.kernels[k].writes().contains(&d.output))
            .collect();
        let [w] = writers[..] else {
            return Err(format!("donated output b{} has {} writers", d.output.0, writers.len()));
        };
        if !same_element(program, w, d.input.index(), d.output.index()) {
            return Err(format!(
                "kernel {w} writes donated b{} but does not read b{} only at the elements it stores",
                d.output.0, d.input.0
            ));
        }
        if let Some(r) = (w + 1..program.kernels.len()).find(|&r| program.kernels[r].reads().contains(&d.input)) {
            return Err(format!(
                "kernel {r} reads b{} after kernel {w} wrote the donated b{} over it",
                d.input.0, d.output.0
            ));
        }
        if program.kernels.iter().any(|k| k.reads().contains(&d.output)) {
            return Err(format!("donated output b{} is read by a kernel", d.output.0));
        }
    }
    Ok(())
}
