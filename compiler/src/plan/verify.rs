//! The plan verifier.

use super::offsets::{lower_bound, units, Interval, Placement};

/// Checks a placement of `bufs` at alignment `align`:
/// - one offset per buffer, each a multiple of `align`;
/// - no two buffers live at the same time (their `[start, end)` intersect) overlap in
///   address, each taking its size rounded up to `align` (what the planner reserves);
///   buffers of size 0 occupy nothing;
/// - the arena covers every buffer (`offset + rounded size <= arena`);
/// - `lower_bound` is [`lower_bound`]`(bufs, align)` and the arena is at least it.
///
/// Errors name the buffers by index.
pub fn verify(bufs: &[Interval], p: &Placement, align: u64) -> Result<(), String> {
    if align == 0 {
        return Err("alignment must be positive".into());
    }
    if p.offsets.len() != bufs.len() {
        return Err(format!("{} offsets for {} buffers", p.offsets.len(), bufs.len()));
    }
    let mut spans = Vec::with_capacity(bufs.len());
    for (i, (b, &o)) in bufs.iter().zip(&p.offsets).enumerate() {
        if b.end <= b.start {
            return Err(format!("buffer {i}: lifetime [{}, {}) is empty", b.start, b.end));
        }
        if o % align != 0 {
            return Err(format!("buffer {i}: offset {o} is not a multiple of {align}"));
        }
        let size = units(b.size, align)
            .checked_mul(align)
            .ok_or_else(|| format!("buffer {i}: size overflows"))?;
        let top = o
            .checked_add(size)
            .ok_or_else(|| format!("buffer {i}: offset {o} + size {size} overflows"))?;
        if size > 0 && top > p.arena {
            return Err(format!(
                "buffer {i}: [{o}, {top}) ends past the arena ({} bytes)",
                p.arena
            ));
        }
        if size > 0 {
            spans.push((b.start, b.end, o, top, i));
        }
    }
    // Sweep over time: a buffer is checked against those still live when it starts.
    spans.sort_unstable();
    let mut live: Vec<(u32, u64, u64, usize)> = Vec::new(); // (end, lo, hi, index)
    for &(start, end, lo, hi, i) in &spans {
        live.retain(|&(e, ..)| e > start);
        for &(_, olo, ohi, j) in &live {
            if lo < ohi && olo < hi {
                let (a, b) = (i.min(j), i.max(j));
                let (ba, bb) = (&bufs[a], &bufs[b]);
                return Err(format!(
                    "buffers {a} and {b} overlap: both live over [{}, {}) and at addresses [{}, {})",
                    ba.start.max(bb.start),
                    ba.end.min(bb.end),
                    lo.max(olo),
                    hi.min(ohi)
                ));
            }
        }
        live.push((end, lo, hi, i));
    }
    let lb = lower_bound(bufs, align);
    if p.lower_bound != lb {
        return Err(format!(
            "lower bound is {lb} bytes, the placement says {}",
            p.lower_bound
        ));
    }
    if p.arena < lb {
        return Err(format!("arena {} is below the lower bound {lb}", p.arena));
    }
    Ok(())
}
