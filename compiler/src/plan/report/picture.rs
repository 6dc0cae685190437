//! The arena over time as a terminal picture ([`picture`]): kernel steps across, byte
//! offsets up, one character per buffer, with the peak, the lower bound and a legend.

use std::fmt::Write;

use super::{display_name, human_bytes, plural, producer, step_label, table};
use crate::plan::MemoryPlan;

/// The characters buffers are drawn with, cycling.
const SYMBOLS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn symbol(i: usize) -> char {
    SYMBOLS[i % SYMBOLS.len()] as char
}

/// How the plot's columns map to kernel steps and its rows to byte ranges.
struct Grid {
    nk: usize,
    /// With fewer steps than columns: columns per step (and `steps_per_col == 1`).
    cols_per_step: usize,
    /// With more: steps per column (and `cols_per_step == 1`).
    steps_per_col: usize,
    ncols: usize,
    height: usize,
    arena: u64,
}

impl Grid {
    fn new(nk: usize, width: usize, height: usize, arena: u64) -> Grid {
        let (cols_per_step, steps_per_col) = if nk <= width {
            (width / nk, 1)
        } else {
            (1, nk.div_ceil(width))
        };
        let ncols = if steps_per_col == 1 {
            nk * cols_per_step
        } else {
            nk.div_ceil(steps_per_col)
        };
        Grid {
            nk,
            cols_per_step,
            steps_per_col,
            ncols,
            height,
            arena,
        }
    }

    /// The steps `[s0, s1)` column `c` covers.
    fn steps_of(&self, c: usize) -> (u32, u32) {
        if self.steps_per_col == 1 {
            let s = (c / self.cols_per_step) as u32;
            (s, s + 1)
        } else {
            (
                (c * self.steps_per_col) as u32,
                ((c + 1) * self.steps_per_col).min(self.nk) as u32,
            )
        }
    }

    /// The first column of a step.
    fn col_of(&self, step: usize) -> usize {
        if self.steps_per_col == 1 {
            step * self.cols_per_step
        } else {
            step / self.steps_per_col
        }
    }

    /// The bytes `[lo, hi)` row `r` (0 = top) covers.
    fn rows_of(&self, r: usize) -> (u64, u64) {
        let (arena, h, r) = (u128::from(self.arena), self.height as u128, r as u128);
        ((arena * (h - 1 - r) / h) as u64, (arena * (h - r) / h) as u64)
    }
}

/// The arena over time: x = kernel steps, y = byte offsets (the top row ends at the
/// arena's end), each buffer drawn with a character (`A`-`Z`, `a`-`z`, `0`-`9`,
/// cycling in buffer order; free space `.`). `width` and `height` are the plot's
/// columns and rows: with fewer steps than columns each step gets the same whole number
/// of columns; with more, each column covers the same number of steps. A cell shows the
/// buffer covering most of its bytes (ties: the newer buffer). A legend lists the
/// largest buffers; `^` marks the peak step and `<` the row holding the lower bound.
pub fn picture(plan: &MemoryPlan, width: usize, height: usize) -> String {
    let mut out = String::new();
    let nk = plan.kernels;
    if plan.buffers.is_empty() || plan.arena_bytes == 0 || nk == 0 {
        let _ = writeln!(
            out,
            "arena empty: no intermediate lives in the arena ({})",
            plural(nk, "kernel", "kernels")
        );
        return out;
    }
    let grid = Grid::new(nk, width.max(1), height.max(1), plan.arena_bytes);
    let lw = human_bytes(plan.arena_bytes).len().max(1);
    plot(&mut out, plan, &grid, lw);
    axis(&mut out, plan, &grid, lw);
    legend(&mut out, plan);
    out
}

/// The character of the cell at column `c`, bytes `[lo, hi)`.
fn cell(plan: &MemoryPlan, grid: &Grid, c: usize, lo: u64, hi: u64) -> char {
    let (s0, s1) = grid.steps_of(c);
    let best = plan
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.start < s1 && b.end > s0)
        .filter_map(|(i, b)| {
            let ov = hi.min(b.offset + b.bytes).saturating_sub(lo.max(b.offset));
            (ov > 0).then_some((ov, b.start, i))
        })
        .max();
    // GEMM scratch (one step each) draws as `#` where it covers more.
    let scratch = plan
        .scratch
        .iter()
        .filter(|sc| sc.step >= s0 && sc.step < s1)
        .map(|sc| hi.min(sc.offset + sc.bytes).saturating_sub(lo.max(sc.offset)))
        .max()
        .unwrap_or(0);
    match best {
        Some((ov, _, i)) if ov >= scratch => symbol(i),
        _ if scratch > 0 => '#',
        _ => '.',
    }
}

/// The plot's rows, labelled, with the lower-bound marker, and the axis line.
fn plot(out: &mut String, plan: &MemoryPlan, grid: &Grid, lw: usize) {
    let height = grid.height;
    let lb_row = (0..height).find(|&r| {
        let (lo, hi) = grid.rows_of(r);
        plan.lower_bound_bytes > lo && plan.lower_bound_bytes <= hi
    });
    for r in 0..height {
        let (lo, hi) = grid.rows_of(r);
        let line: String = (0..grid.ncols).map(|c| cell(plan, grid, c, lo, hi)).collect();
        let label = if r == 0 {
            human_bytes(plan.arena_bytes)
        } else if r + 1 == height {
            "0".into()
        } else {
            String::new()
        };
        let marker = if lb_row == Some(r) {
            format!(" < lower bound {}", human_bytes(plan.lower_bound_bytes))
        } else {
            String::new()
        };
        let _ = writeln!(out, "{label:>lw$} |{line}|{marker}");
    }
    let _ = writeln!(out, "{:lw$} +{}+", "", "-".repeat(grid.ncols));
}

/// Step numbers under the axis (at a round interval leaving room for the labels), the
/// peak marker and what the axes mean.
fn axis(out: &mut String, plan: &MemoryPlan, grid: &Grid, lw: usize) {
    let nk = grid.nk;
    let digits = nk.to_string().len();
    let interval = [1usize, 2, 5]
        .iter()
        .cycle()
        .scan(1usize, |scale, &m| {
            let v = m * *scale;
            if m == 5 {
                *scale *= 10;
            }
            Some(v)
        })
        .find(|&i| i * grid.cols_per_step / grid.steps_per_col >= digits + 2)
        .unwrap_or(nk);
    let mut ticks = vec![' '; grid.ncols + digits + 1];
    let mut free = 0;
    for t in (0..nk).step_by(interval) {
        let c = grid.col_of(t);
        if c < free {
            continue;
        }
        for (i, ch) in t.to_string().chars().enumerate() {
            ticks[c + i] = ch;
        }
        free = c + digits + 1;
    }
    let ticks: String = ticks.into_iter().collect();
    let _ = writeln!(out, "{:lw$}  {}", "", ticks.trim_end());
    let peak_col = grid.col_of(plan.peak_step as usize);
    let peak = plan.steps.get(plan.peak_step as usize);
    let _ = writeln!(
        out,
        "{:lw$}  {}^ peak: step {}{}",
        "",
        " ".repeat(peak_col),
        plan.peak_step,
        peak.map_or(String::new(), |s| format!(" ({}, {})", s.kernel, s.kind))
    );
    let _ = writeln!(
        out,
        "{:lw$}  x: kernel steps 0..{} ({}); y: arena offset 0..{} ({} per row)",
        "",
        nk,
        if grid.steps_per_col == 1 {
            plural(grid.cols_per_step, "column per step", "columns per step")
        } else {
            format!("{} steps per column", grid.steps_per_col)
        },
        human_bytes(plan.arena_bytes),
        human_bytes(plan.arena_bytes.div_ceil(grid.height as u64))
    );
}

/// The legend: the largest buffers (the top 12, then a count), then the GEMM scratch.
fn legend(out: &mut String, plan: &MemoryPlan) {
    const LEGEND: usize = 12;
    let mut order: Vec<usize> = (0..plan.buffers.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(plan.buffers[i].bytes), plan.buffers[i].buffer));
    let mut rows = Vec::new();
    for &i in order.iter().take(LEGEND) {
        let b = &plan.buffers[i];
        rows.push(vec![
            symbol(i).to_string(),
            format!("b{}", b.buffer.0),
            display_name(&b.name).to_string(),
            human_bytes(b.bytes),
            format!("at {}", b.offset),
            format!("steps {}..{}", b.start, b.end),
            step_label(producer(plan, b)),
            b.reuses.map_or(String::new(), |r| format!("in place of b{}", r.0)),
        ]);
    }
    for sc in &plan.scratch {
        rows.push(vec![
            "#".into(),
            "-".into(),
            "(GEMM scratch)".into(),
            human_bytes(sc.bytes),
            format!("at {}", sc.offset),
            format!("steps {}..{}", sc.step, sc.step + 1),
            plan.steps
                .get(sc.step as usize)
                .map_or(String::new(), |st| format!("{} ({})", st.kernel, st.kind)),
            String::new(),
        ]);
    }
    out.push_str("legend (largest first):\n");
    out.push_str(&table(
        "  ",
        &rows,
        &[false, false, false, true, true, false, false, false],
    ));
    if let Some(rest) = order.get(LEGEND..).filter(|r| !r.is_empty()) {
        let _ = writeln!(
            out,
            "  and {} more totalling {}",
            rest.len(),
            human_bytes(rest.iter().map(|&i| plan.buffers[i].bytes).fold(0, u64::saturating_add))
        );
    }
}
