//! Reports of a [`MemoryPlan`], for people: a static `torch.cuda.memory_summary`
//! ([`summary`]), the arena over time as a terminal picture ([`picture`]) and as an SVG
//! ([`svg`]), and the diagnosis of a plan over its budget ([`over_budget_diagnosis`],
//! [`check_budget`] / [`OverBudget`]).
//!
//! Everything here is computed from the plan and its program, deterministically (no
//! times), so the text can be snapshot-tested.

use std::collections::HashMap;
use std::fmt::Write;

use graphc_ir::DType;

use super::{ArgAccess, MemoryPlan, PlannedBuffer};
use crate::kernel::{BufferKind, Program};

/// `1536` -> `1.50 KiB`; below 1 KiB, exact bytes (`512 B`). Two decimals below 10 of
/// a unit, one above.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        format!("{v:.2} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A size as `--budget` accepts it: `24GiB`, `1MiB`, or plain bytes.
pub fn budget_arg(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b > 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What the program holds outside the arena, by kind.
struct Outside {
    weights: usize,
    inputs: usize,
    outputs: usize,
}

fn outside(program: &Program) -> Outside {
    let mut out = Outside {
        weights: 0,
        inputs: 0,
        outputs: 0,
    };
    for b in &program.buffers {
        match b.kind {
            BufferKind::Weight { .. } | BufferKind::Constant { .. } => out.weights += 1,
            BufferKind::Input { .. } => out.inputs += 1,
            BufferKind::Temp => {}
        }
    }
    let mut outs: Vec<u32> = program.outputs.iter().map(|(_, b)| b.0).collect();
    outs.sort_unstable();
    outs.dedup();
    out.outputs = outs.len();
    out
}

/// The kernel that writes a planned buffer, and its kind.
fn producer<'a>(plan: &'a MemoryPlan, b: &PlannedBuffer) -> (&'a str, &'a str) {
    plan.steps
        .get(b.start as usize)
        .map_or(("?", "?"), |s| (s.kernel.as_str(), s.kind.as_str()))
}

fn display_name(name: &Option<String>) -> &str {
    name.as_deref().unwrap_or("-")
}

/// Rows of text in columns: each column as wide as its widest cell; `right` says which
/// columns are right-aligned. Every line starts with `indent`.
fn table(indent: &str, rows: &[Vec<String>], right: &[bool]) -> String {
    let ncol = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; ncol];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_string();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if right.get(i).copied().unwrap_or(false) {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A size row: label, human size, exact bytes, note.
fn size_row(label: &str, bytes: u64, note: String) -> Vec<String> {
    vec![label.to_string(), human_bytes(bytes), format!("{bytes} B"), note]
}

/// Bytes of the tensors live at the peak step (aligned slots are what the lower bound
/// counts; this is the tensors' own bytes).
fn peak_bytes(plan: &MemoryPlan) -> u64 {
    plan.peak_live
        .iter()
        .map(|t| t.bytes)
        .fold(plan.peak_scratch_bytes, u64::saturating_add)
}

/// The memory summary: where the bytes go, how good the placement is, the schedule, the
/// peak step and the tensors live there, total vs budget.
pub fn summary(program: &Program, plan: &MemoryPlan) -> String {
    let counts = outside(program);
    let mut out = String::new();
    let fits = if plan.fits() {
        format!(
            "fits, headroom {} ({} B)",
            human_bytes(plan.budget_bytes - plan.total_bytes),
            plan.budget_bytes - plan.total_bytes
        )
    } else {
        format!(
            "OVER BUDGET by {} ({} B)",
            human_bytes(plan.total_bytes - plan.budget_bytes),
            plan.total_bytes - plan.budget_bytes
        )
    };
    let rows = vec![
        size_row(
            "weights",
            plan.weights_bytes,
            plural(
                counts.weights,
                "tensor (weights, constants)",
                "tensors (weights, constants)",
            ),
        ),
        size_row("inputs", plan.inputs_bytes, plural(counts.inputs, "tensor", "tensors")),
        size_row(
            "outputs",
            plan.outputs_bytes,
            plural(counts.outputs, "tensor", "tensors"),
        ),
        size_row(
            "workspace",
            plan.workspace_bytes,
            if plan.workspace_bytes > 0 {
                "cuBLASLt (the program has GEMMs)".into()
            } else {
                "none (no GEMMs)".into()
            },
        ),
        size_row(
            "arena",
            plan.arena_bytes,
            format!(
                "{}{}, offsets by {}",
                plural(plan.buffers.len(), "intermediate", "intermediates"),
                if plan.scratch.is_empty() {
                    String::new()
                } else {
                    format!(
                        " + {}",
                        plural(plan.scratch.len(), "GEMM scratch area", "GEMM scratch areas")
                    )
                },
                plan.strategy
            ),
        ),
        size_row(
            "lower bound",
            plan.lower_bound_bytes,
            "most arena bytes live at once".into(),
        ),
        size_row(
            "total",
            plan.total_bytes,
            format!("{} of the budget", percent(plan.total_bytes, plan.budget_bytes)),
        ),
        size_row("budget", plan.budget_bytes, fits),
    ];
    out.push_str(&table("", &rows, &[false, true, true, false]));
    out.push('\n');

    let fragmentation = if plan.arena_bytes == 0 {
        0.0
    } else {
        1.0 - plan.lower_bound_bytes as f64 / plan.arena_bytes as f64
    };
    let greedy_ratio = if plan.lower_bound_bytes == 0 {
        1.0
    } else {
        plan.greedy_arena_bytes as f64 / plan.lower_bound_bytes as f64
    };
    let peak = match plan.steps.get(plan.peak_step as usize) {
        Some(step) if !plan.buffers.is_empty() => format!(
            "step {} of {}: {} ({}), {} live, {}",
            plan.peak_step,
            plan.kernels,
            step.kernel,
            step.kind,
            plural(plan.peak_live.len(), "tensor", "tensors"),
            human_bytes(peak_bytes(plan))
        ),
        _ => "none (the arena is empty)".into(),
    };
    let rows = vec![
        vec!["kernels".into(), format!("{} (target {})", plan.kernels, plan.arch)],
        vec!["schedule".into(), plan.schedule.clone()],
        vec!["arena / bound".into(), format!("{:.3}x", plan.ratio())],
        vec![
            "fragmentation".into(),
            format!(
                "{:.1}% (1 - lower bound / arena); best greedy arena {} ({:.3}x)",
                fragmentation * 100.0,
                human_bytes(plan.greedy_arena_bytes),
                greedy_ratio
            ),
        ],
        vec![
            "in place".into(),
            plural(
                plan.in_place,
                "buffer takes over an input's storage",
                "buffers take over an input's storage",
            ),
        ],
        vec![
            "views".into(),
            plural(
                plan.aliases,
                "read through a view (no buffer)",
                "reads through views (no buffer)",
            ),
        ],
        vec!["alignment".into(), format!("{} B", plan.align)],
        vec!["peak".into(), peak],
    ];
    out.push_str(&table("", &rows, &[false, false]));

    if !plan.peak_live.is_empty() {
        out.push('\n');
        out.push_str("tensors live at the peak, largest first:\n");
        let mut rows = vec![vec![
            "buffer".into(),
            "name".into(),
            "written by".into(),
            "op".into(),
            "size".into(),
            "bytes".into(),
            "of arena".into(),
        ]];
        const TOP: usize = 10;
        for t in plan.peak_live.iter().take(TOP) {
            rows.push(vec![
                format!("b{}", t.buffer),
                display_name(&t.name).to_string(),
                t.kernel.clone(),
                t.op.clone(),
                human_bytes(t.bytes),
                t.bytes.to_string(),
                percent(t.bytes, plan.arena_bytes),
            ]);
        }
        for sc in plan.scratch.iter().filter(|sc| sc.step == plan.peak_step) {
            let step = plan.steps.get(sc.step as usize);
            rows.push(vec![
                "-".into(),
                "(GEMM scratch)".into(),
                step.map_or(String::new(), |st| st.kernel.clone()),
                step.map_or(String::new(), |st| st.kind.clone()),
                human_bytes(sc.bytes),
                sc.bytes.to_string(),
                percent(sc.bytes, plan.arena_bytes),
            ]);
        }
        out.push_str(&table("  ", &rows, &[false, false, false, false, true, true, true]));
        if plan.peak_live.len() > TOP {
            let rest = &plan.peak_live[TOP..];
            let _ = writeln!(
                out,
                "  and {} more totalling {}",
                rest.len(),
                human_bytes(rest.iter().map(|t| t.bytes).fold(0, u64::saturating_add))
            );
        }
    }
    out
}

/// The characters buffers are drawn with, cycling.
const SYMBOLS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn symbol(i: usize) -> char {
    SYMBOLS[i % SYMBOLS.len()] as char
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
    let (width, height) = (width.max(1), height.max(1));
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
    let steps_of = |c: usize| -> (u32, u32) {
        if steps_per_col == 1 {
            let s = (c / cols_per_step) as u32;
            (s, s + 1)
        } else {
            ((c * steps_per_col) as u32, ((c + 1) * steps_per_col).min(nk) as u32)
        }
    };
    let col_of = |step: usize| -> usize {
        if steps_per_col == 1 {
            step * cols_per_step
        } else {
            step / steps_per_col
        }
    };
    let arena = u128::from(plan.arena_bytes);
    let h = height as u128;
    // Row r (0 = top) covers bytes [lo, hi).
    let rows_of = |r: usize| -> (u64, u64) {
        let r = r as u128;
        ((arena * (h - 1 - r) / h) as u64, (arena * (h - r) / h) as u64)
    };

    let top_label = human_bytes(plan.arena_bytes);
    let lw = top_label.len().max(1);
    let lb_row = (0..height).find(|&r| {
        let (lo, hi) = rows_of(r);
        plan.lower_bound_bytes > lo && plan.lower_bound_bytes <= hi
    });
    for r in 0..height {
        let (lo, hi) = rows_of(r);
        let mut line = String::with_capacity(ncols);
        for c in 0..ncols {
            let (s0, s1) = steps_of(c);
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
            line.push(match best {
                Some((ov, _, _)) if ov >= scratch => best.map_or('.', |(_, _, i)| symbol(i)),
                _ if scratch > 0 => '#',
                _ => '.',
            });
        }
        let label = if r == 0 {
            top_label.clone()
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
    let _ = writeln!(out, "{:lw$} +{}+", "", "-".repeat(ncols));

    // Step numbers under the axis, at a round interval leaving room for the labels.
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
        .find(|&i| i * cols_per_step / steps_per_col >= digits + 2)
        .unwrap_or(nk);
    let mut ticks = vec![' '; ncols + digits + 1];
    let mut free = 0;
    for t in (0..nk).step_by(interval) {
        let c = col_of(t);
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
    let peak_col = col_of(plan.peak_step as usize);
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
        if steps_per_col == 1 {
            plural(cols_per_step, "column per step", "columns per step")
        } else {
            format!("{steps_per_col} steps per column")
        },
        human_bytes(plan.arena_bytes),
        human_bytes(plan.arena_bytes.div_ceil(height as u64))
    );

    // Legend: the largest buffers.
    const LEGEND: usize = 12;
    let mut order: Vec<usize> = (0..plan.buffers.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(plan.buffers[i].bytes), plan.buffers[i].buffer));
    let mut rows = Vec::new();
    for &i in order.iter().take(LEGEND) {
        let b = &plan.buffers[i];
        let (kernel, kind) = producer(plan, b);
        rows.push(vec![
            symbol(i).to_string(),
            format!("b{}", b.buffer),
            display_name(&b.name).to_string(),
            human_bytes(b.bytes),
            format!("at {}", b.offset),
            format!("steps {}..{}", b.start, b.end),
            format!("{kernel} ({kind})"),
            b.reuses.map_or(String::new(), |r| format!("in place of b{r}")),
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
    if plan.buffers.len() > LEGEND {
        let rest = &order[LEGEND..];
        let _ = writeln!(
            out,
            "  and {} more totalling {}",
            rest.len(),
            human_bytes(rest.iter().map(|&i| plan.buffers[i].bytes).fold(0, u64::saturating_add))
        );
    }
    out
}

/// Escape text for XML content and attribute values.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\t') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The fill color of a buffer written by a kernel of this kind.
fn kind_color(kind: &str) -> &'static str {
    match kind {
        "elementwise" => "#4e79a7",
        "row" => "#f28e2b",
        "matmul" => "#e15759",
        _ => "#76b7b2",
    }
}

/// The picture of [`picture`] as a standalone SVG: one `<rect class="buffer">` per
/// arena buffer (x = its steps `[start, end)`, y = `[offset, offset + bytes)`, offset 0
/// at the bottom), filled by the kind of the kernel that writes it, with a `<title>`
/// tooltip; axes with ticks; a dashed line at the lower bound and a dotted one at the
/// peak step.
pub fn svg(program: &Program, plan: &MemoryPlan) -> String {
    const W: f64 = 960.0;
    const H: f64 = 540.0;
    const ML: f64 = 96.0;
    const MR: f64 = 150.0;
    const MT: f64 = 48.0;
    const MB: f64 = 56.0;
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let nk = plan.kernels.max(1) as f64;
    let arena = plan.arena_bytes.max(1) as f64;
    let x = |step: f64| ML + step / nk * pw;
    let y = |bytes: f64| MT + ph - bytes / arena * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        s,
        "<title>{}</title>",
        xml_escape(&format!(
            "memory plan: {} kernels, arena {}, lower bound {}",
            plan.kernels,
            human_bytes(plan.arena_bytes),
            human_bytes(plan.lower_bound_bytes)
        ))
    );
    let _ = writeln!(
        s,
        r##"<rect class="background" x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{ML}" y="20" font-size="13">{}</text>"#,
        xml_escape(&format!(
            "arena {} ({} B), lower bound {} ({:.3}x), {} buffers, schedule {}, offsets by {}",
            human_bytes(plan.arena_bytes),
            plan.arena_bytes,
            human_bytes(plan.lower_bound_bytes),
            plan.ratio(),
            plan.buffers.len(),
            plan.schedule,
            plan.strategy
        ))
    );

    // Buffers.
    let _ = writeln!(s, r##"<g class="buffers" stroke="#222222" stroke-width="0.5">"##);
    for b in &plan.buffers {
        let (kernel, kind) = producer(plan, b);
        let (x0, x1) = (x(f64::from(b.start)), x(f64::from(b.end)));
        let (y0, y1) = (y((b.offset + b.bytes) as f64), y(b.offset as f64));
        let dtype = program
            .buffers
            .get(b.buffer as usize)
            .map_or(String::new(), |pb| format!(", {}", pb.ty));
        let tip = format!(
            "b{}{}{}: {} ({} B) at offset {}, live steps [{}, {}), written by {} ({}){}",
            b.buffer,
            b.name.as_ref().map_or(String::new(), |n| format!(" \"{n}\"")),
            dtype,
            human_bytes(b.bytes),
            b.bytes,
            b.offset,
            b.start,
            b.end,
            kernel,
            kind,
            b.reuses.map_or(String::new(), |r| format!(", in place of b{r}"))
        );
        let _ = writeln!(
            s,
            r#"<rect class="buffer" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}</title></rect>"#,
            x0,
            y0,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            kind_color(kind),
            xml_escape(&tip)
        );
    }
    for sc in &plan.scratch {
        let (x0, x1) = (x(f64::from(sc.step)), x(f64::from(sc.step + 1)));
        let (y0, y1) = (y((sc.offset + sc.bytes) as f64), y(sc.offset as f64));
        let kernel = plan.steps.get(sc.step as usize).map_or("", |st| st.kernel.as_str());
        let tip = format!(
            "GEMM scratch of {kernel}: {} ({} B) at offset {}, step {}",
            human_bytes(sc.bytes),
            sc.bytes,
            sc.offset,
            sc.step
        );
        let _ = writeln!(
            s,
            r##"<rect class="scratch" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="#bbbbbb" stroke="#555555" stroke-dasharray="2,2"><title>{}</title></rect>"##,
            x0,
            y0,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            xml_escape(&tip)
        );
    }
    let _ = writeln!(s, "</g>");

    // Axes.
    let _ = writeln!(s, r##"<g class="axes" stroke="#000000" stroke-width="1">"##);
    let _ = writeln!(
        s,
        r#"<line x1="{ML}" y1="{}" x2="{}" y2="{}"/>"#,
        MT + ph,
        ML + pw,
        MT + ph
    );
    let _ = writeln!(s, r#"<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{}"/>"#, MT + ph);
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r##"<g class="ticks" stroke="#000000">"##);
    let step_tick = [1usize, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
        .into_iter()
        .find(|&i| plan.kernels / i <= 12)
        .unwrap_or(plan.kernels.max(1));
    let mut ticks: Vec<usize> = (0..=plan.kernels).step_by(step_tick).collect();
    if ticks.last() != Some(&plan.kernels) {
        ticks.push(plan.kernels);
    }
    for t in ticks {
        let tx = x(t as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{tx:.2}" y1="{}" x2="{tx:.2}" y2="{}"/><text x="{tx:.2}" y="{}" text-anchor="middle" stroke="none">{t}</text>"#,
            MT + ph,
            MT + ph + 5.0,
            MT + ph + 18.0
        );
    }
    for i in 0..=4u64 {
        let bytes = (u128::from(plan.arena_bytes) * u128::from(i) / 4) as u64;
        let ty = y(bytes as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ty:.2}" x2="{ML}" y2="{ty:.2}"/><text x="{}" y="{:.2}" text-anchor="end" stroke="none">{}</text>"#,
            ML - 5.0,
            ML - 8.0,
            ty + 4.0,
            xml_escape(&human_bytes(bytes))
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<text x="{:.2}" y="{}" text-anchor="middle">kernel step</text>"#,
        ML + pw / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.2}" text-anchor="middle" transform="rotate(-90 16 {:.2})">arena offset</text>"#,
        MT + ph / 2.0,
        MT + ph / 2.0
    );

    // Lower bound and peak.
    if plan.arena_bytes > 0 {
        let ly = y(plan.lower_bound_bytes as f64);
        let _ = writeln!(
            s,
            r##"<line class="lower-bound" x1="{ML}" y1="{ly:.2}" x2="{}" y2="{ly:.2}" stroke="#000000" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
            ML + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.2}">{}</text>"#,
            ML + pw + 6.0,
            ly + 4.0,
            xml_escape(&format!("lower bound {}", human_bytes(plan.lower_bound_bytes)))
        );
        let px = x(f64::from(plan.peak_step) + 0.5);
        let _ = writeln!(
            s,
            r##"<line class="peak" x1="{px:.2}" y1="{MT}" x2="{px:.2}" y2="{}" stroke="#555555" stroke-dasharray="2 3"/>"##,
            MT + ph
        );
        let _ = writeln!(
            s,
            r#"<text x="{px:.2}" y="{}" text-anchor="middle">{}</text>"#,
            MT - 6.0,
            xml_escape(&format!("peak: step {}", plan.peak_step))
        );
    } else {
        let _ = writeln!(
            s,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">the arena is empty</text>"#,
            ML + pw / 2.0,
            MT + ph / 2.0
        );
    }

    // Legend: the kernel kinds present.
    let mut kinds: Vec<&str> = plan.buffers.iter().map(|b| producer(plan, b).1).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let _ = writeln!(s, r#"<g class="legend">"#);
    for (i, kind) in kinds.iter().enumerate() {
        let ly = MT + 60.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<rect class="legend" x="{}" y="{ly:.2}" width="12" height="12" fill="{}" stroke="#222222" stroke-width="0.5"/><text x="{}" y="{:.2}">{}</text>"##,
            ML + pw + 6.0,
            kind_color(kind),
            ML + pw + 24.0,
            ly + 10.0,
            xml_escape(kind)
        );
    }
    let _ = writeln!(s, "</g>");
    s.push_str("</svg>\n");
    s
}

/// A plan over its budget, with what [`over_budget_diagnosis`] says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// Bytes over the budget.
    pub over_by: u64,
    pub total_bytes: u64,
    pub budget_bytes: u64,
    /// The full diagnosis (what `Display` prints).
    pub diagnosis: String,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.diagnosis.trim_end())
    }
}

impl std::error::Error for OverBudget {}

/// `Ok` when the plan fits its budget, else [`OverBudget`] with the diagnosis.
pub fn check_budget(program: &Program, plan: &MemoryPlan, symbolic_dims: &[String]) -> Result<(), OverBudget> {
    match over_budget_diagnosis(program, plan, symbolic_dims) {
        None => Ok(()),
        Some(diagnosis) => Err(OverBudget {
            over_by: plan.total_bytes.saturating_sub(plan.budget_bytes),
            total_bytes: plan.total_bytes,
            budget_bytes: plan.budget_bytes,
            diagnosis,
        }),
    }
}

/// A tensor that could be recomputed instead of kept across the peak.
struct Remat {
    buffer: u32,
    name: String,
    kernel: String,
    kind: String,
    produced: u32,
    next_read: u32,
    /// Its bytes, less the bytes of its producer's arena operands that would have to
    /// stay live across the peak to recompute it.
    freed: u64,
}

/// Tensors live at the peak that a cheap kernel (elementwise, row) produced at least two
/// steps earlier and that nothing touches at the peak step (read again only later).
fn remat_candidates(plan: &MemoryPlan) -> Vec<Remat> {
    let peak = plan.peak_step;
    let mut accesses: HashMap<u32, Vec<u32>> = HashMap::new();
    for (k, step) in plan.steps.iter().enumerate() {
        for a in &step.args {
            accesses.entry(a.buffer).or_default().push(k as u32);
        }
    }
    // By id, once: a lookup per argument of a scan of all buffers would be quadratic.
    let by_id: HashMap<u32, &PlannedBuffer> = plan.buffers.iter().map(|b| (b.buffer, b)).collect();
    let buffer = |id: u32| by_id.get(&id).copied();
    let live_at_peak = |id: u32| buffer(id).is_some_and(|b| b.start <= peak && peak < b.end);
    let mut out = Vec::new();
    for t in &plan.peak_live {
        let Some(b) = buffer(t.buffer) else { continue };
        if !matches!(t.op.as_str(), "elementwise" | "row") || b.start + 2 > peak {
            continue;
        }
        let steps = accesses.get(&t.buffer).map(Vec::as_slice).unwrap_or_default();
        if steps.contains(&peak) {
            continue;
        }
        let Some(&next_read) = steps.iter().filter(|&&k| k > peak).min() else {
            continue;
        };
        // The producer's operands that live in the arena and would have to outlive the
        // peak (weights and inputs are always there).
        let keep: u64 = plan.steps[b.start as usize]
            .args
            .iter()
            .filter(|a| a.access == ArgAccess::Read && a.buffer != t.buffer)
            .filter_map(|a| buffer(a.buffer))
            .filter(|ob| !live_at_peak(ob.buffer))
            .map(|ob| ob.bytes)
            .fold(0, u64::saturating_add);
        let freed = t.bytes.saturating_sub(keep);
        if freed == 0 {
            continue;
        }
        out.push(Remat {
            buffer: t.buffer,
            name: display_name(&t.name).to_string(),
            kernel: t.kernel.clone(),
            kind: t.op.clone(),
            produced: b.start,
            next_read,
            freed,
        });
    }
    out
}

/// Why a plan does not fit and what would help; `None` when it fits.
///
/// Says by how much (bytes and human), the budget, the total broken down, the peak step
/// and the tensors live there (the top 8, then a count and total), and the remedies that
/// apply, each with an estimate from the plan: a smaller symbolic dimension
/// (`symbolic_dims`: the model's symbolic dimension names, e.g. ONNX `--dim` names),
/// bf16/fp16 when weights or intermediates are f32, recomputation of tensors idle across
/// the peak, and, when the weights alone exceed the budget, that no activation remedy
/// can help.
pub fn over_budget_diagnosis(program: &Program, plan: &MemoryPlan, symbolic_dims: &[String]) -> Option<String> {
    let over = plan.over_budget()?;
    let budget = plan.budget_bytes;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "the model needs {} ({} B) but the budget is {} ({} B): over by {} ({} B)",
        human_bytes(plan.total_bytes),
        plan.total_bytes,
        human_bytes(budget),
        budget,
        human_bytes(over),
        over
    );
    let rows = vec![
        size_row("weights", plan.weights_bytes, String::new()),
        size_row(
            "arena",
            plan.arena_bytes,
            format!(
                "{}; lower bound {}",
                plural(plan.buffers.len(), "intermediate", "intermediates"),
                human_bytes(plan.lower_bound_bytes)
            ),
        ),
        size_row("inputs", plan.inputs_bytes, String::new()),
        size_row("outputs", plan.outputs_bytes, String::new()),
        size_row(
            "workspace",
            plan.workspace_bytes,
            if plan.workspace_bytes > 0 {
                "cuBLASLt".into()
            } else {
                String::new()
            },
        ),
        size_row("total", plan.total_bytes, String::new()),
    ];
    s.push_str(&table("  ", &rows, &[false, true, true, false]));

    match plan.steps.get(plan.peak_step as usize) {
        Some(step) if !plan.peak_live.is_empty() => {
            let _ = writeln!(
                s,
                "peak: step {} of {}, kernel {} ({}): {} live in the arena, {}",
                plan.peak_step,
                plan.kernels,
                step.kernel,
                step.kind,
                plural(plan.peak_live.len(), "tensor", "tensors"),
                human_bytes(peak_bytes(plan))
            );
            const TOP: usize = 8;
            let mut rows: Vec<Vec<String>> = plan
                .peak_live
                .iter()
                .take(TOP)
                .map(|t| {
                    vec![
                        display_name(&t.name).to_string(),
                        format!("b{}", t.buffer),
                        format!("{} ({})", t.kernel, t.op),
                        human_bytes(t.bytes),
                        format!("{} B", t.bytes),
                    ]
                })
                .collect();
            if plan.peak_scratch_bytes > 0 {
                rows.push(vec![
                    "(GEMM scratch)".into(),
                    "-".into(),
                    format!("{} ({})", step.kernel, step.kind),
                    human_bytes(plan.peak_scratch_bytes),
                    format!("{} B", plan.peak_scratch_bytes),
                ]);
            }
            s.push_str(&table("  ", &rows, &[false, false, false, true, true]));
            if plan.peak_live.len() > TOP {
                let rest = &plan.peak_live[TOP..];
                let _ = writeln!(
                    s,
                    "  and {} more totalling {}",
                    rest.len(),
                    human_bytes(rest.iter().map(|t| t.bytes).fold(0, u64::saturating_add))
                );
            }
        }
        _ => {
            let _ = writeln!(s, "peak: the arena is empty (nothing to shrink there)");
        }
    }

    // Remedies.
    let _ = writeln!(s, "what would help:");
    let verdict = |total: u64| {
        if total <= budget {
            format!("fits, {} to spare", human_bytes(budget - total))
        } else {
            format!("still over by {}", human_bytes(total - budget))
        }
    };
    let weights_over = plan.weights_bytes > budget;
    if weights_over {
        let _ = writeln!(
            s,
            "  - the weights alone ({}) exceed the budget ({}): no activation remedy (a smaller batch or \
             sequence, recomputation) can help; the weights themselves must shrink (bf16/fp16, quantization) \
             or be split across devices",
            human_bytes(plan.weights_bytes),
            human_bytes(budget)
        );
    }
    let fixed = plan.weights_bytes.saturating_add(plan.workspace_bytes);
    let fixed_over = !weights_over && fixed > budget;
    if fixed_over && plan.workspace_bytes > budget {
        let _ = writeln!(
            s,
            "  - the cuBLASLt workspace the GEMMs reserve ({}) alone exceeds the budget ({}): no remedy in \
             the model can help; the budget must cover the workspace plus the weights ({}) and activations",
            human_bytes(plan.workspace_bytes),
            human_bytes(budget),
            human_bytes(plan.weights_bytes)
        );
    } else if fixed_over {
        let _ = writeln!(
            s,
            "  - the weights ({}) and the cuBLASLt workspace ({}) together exceed the budget ({}): no \
             activation remedy (a smaller batch or sequence, recomputation) can help; the weights must shrink \
             (bf16/fp16, quantization) or the budget grow",
            human_bytes(plan.weights_bytes),
            human_bytes(plan.workspace_bytes),
            human_bytes(budget)
        );
    }
    let activations = plan
        .arena_bytes
        .saturating_add(plan.inputs_bytes)
        .saturating_add(plan.outputs_bytes);
    if !weights_over && !fixed_over && activations > 0 {
        let share = (budget - fixed) as f64 / activations as f64;
        let estimate = if share < 0.01 {
            "even if they scale linearly, less than 1% of the current size fits".to_string()
        } else {
            format!(
                "if they scale linearly, about {:.0}% of the current size fits",
                (share * 100.0).floor().min(99.0)
            )
        };
        if symbolic_dims.is_empty() {
            let _ = writeln!(
                s,
                "  - a smaller batch or sequence length: activations (arena, inputs, outputs: {}) scale with \
                 them; {estimate}; this model's shapes are static, so that means re-exporting it smaller or \
                 with a symbolic dimension",
                human_bytes(activations)
            );
        } else {
            for name in symbolic_dims {
                let _ = writeln!(
                    s,
                    "  - a smaller {name}: activations (arena, inputs, outputs: {}) scale with it; {estimate}; \
                     `graphc fit MODEL --dim {name} --budget {}` finds the largest {name} that fits",
                    human_bytes(activations),
                    budget_arg(budget)
                );
            }
        }
    }

    // bf16 / fp16.
    let f32_bytes = |pred: &dyn Fn(&BufferKind, usize) -> bool| -> u64 {
        program
            .buffers
            .iter()
            .enumerate()
            .filter(|(i, b)| b.ty.dtype == DType::F32 && pred(&b.kind, *i))
            .map(|(_, b)| b.ty.size_bytes() as u64)
            .fold(0, u64::saturating_add)
    };
    let is_output: Vec<bool> = {
        let mut v = vec![false; program.buffers.len()];
        for (_, b) in &program.outputs {
            if let Some(o) = v.get_mut(b.index()) {
                *o = true;
            }
        }
        v
    };
    let f32_weights = f32_bytes(&|k, _| matches!(k, BufferKind::Weight { .. } | BufferKind::Constant { .. }));
    let f32_io = f32_bytes(&|k, i| matches!(k, BufferKind::Input { .. }) || is_output[i]);
    let peak_total = peak_bytes(plan);
    let peak_f32: u64 = plan
        .peak_live
        .iter()
        .filter(|t| {
            program
                .buffers
                .get(t.buffer as usize)
                .is_some_and(|b| b.ty.dtype == DType::F32)
        })
        .map(|t| t.bytes)
        .fold(0, u64::saturating_add);
    let arena_f32 = if peak_total == 0 {
        0
    } else {
        (u128::from(plan.arena_bytes) * u128::from(peak_f32) / u128::from(peak_total)) as u64
    };
    let workspace_over = plan.workspace_bytes > budget;
    if (f32_weights > 0 || arena_f32 > 0) && !workspace_over {
        let saved = f32_weights / 2 + f32_io / 2 + arena_f32 / 2;
        let _ = writeln!(
            s,
            "  - bf16/fp16 instead of f32: f32 weights {}, f32 intermediates at the peak {} of {}, f32 inputs \
             and outputs {}; halving them saves about {} (total about {}: {})",
            human_bytes(f32_weights),
            human_bytes(peak_f32),
            human_bytes(peak_total),
            human_bytes(f32_io),
            human_bytes(saved),
            human_bytes(plan.total_bytes - saved),
            verdict(plan.total_bytes - saved)
        );
    }

    // Recomputation.
    if !weights_over && !fixed_over {
        let remat = remat_candidates(plan);
        if !remat.is_empty() {
            let freed: u64 = remat.iter().map(|r| r.freed).fold(0, u64::saturating_add);
            let named: Vec<String> = remat
                .iter()
                .take(5)
                .map(|r| {
                    format!(
                        "{} (b{}, {} by {} ({}) at step {}, next read at step {})",
                        r.name,
                        r.buffer,
                        human_bytes(r.freed),
                        r.kernel,
                        r.kind,
                        r.produced,
                        r.next_read
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "  - recomputation (rematerialization): {} produced by cheap kernels and idle across the peak; \
                 recomputing each just before its next read frees about {} at the peak (total about {}: {}): \
                 {}{}",
                plural(remat.len(), "tensor", "tensors"),
                human_bytes(freed),
                human_bytes(plan.total_bytes.saturating_sub(freed)),
                verdict(plan.total_bytes.saturating_sub(freed)),
                named.join("; "),
                if remat.len() > 5 {
                    format!("; and {} more", remat.len() - 5)
                } else {
                    String::new()
                }
            );
        }
    }
    Some(s)
}
