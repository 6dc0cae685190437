//! The arena over time as a standalone SVG ([`svg`]): one rectangle per arena buffer
//! and GEMM scratch area, axes with ticks, the lower bound and the peak step, a legend
//! of kernel kinds.

use std::fmt::Write;

use super::{human_bytes, producer};
use crate::kernel::Program;
use crate::plan::{MemoryPlan, StepKind};

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

/// The fill color of a buffer written by a kernel of this kind (`None`: no such kernel).
fn kind_color(kind: Option<&StepKind>) -> &'static str {
    match kind {
        Some(StepKind::Elementwise) => "#4e79a7",
        Some(StepKind::Row) => "#f28e2b",
        Some(StepKind::Matmul) => "#e15759",
        Some(StepKind::Op(_)) | None => "#76b7b2",
    }
}

/// The page and the plot area inside its margins, with the maps from steps and bytes
/// to coordinates.
struct Frame {
    /// The plot's width and height.
    pw: f64,
    ph: f64,
    nk: f64,
    arena: f64,
}

const W: f64 = 960.0;
const H: f64 = 540.0;
/// Margins: left, right, top, bottom.
const ML: f64 = 96.0;
const MR: f64 = 150.0;
const MT: f64 = 48.0;
const MB: f64 = 56.0;

impl Frame {
    fn new(plan: &MemoryPlan) -> Frame {
        Frame {
            pw: W - ML - MR,
            ph: H - MT - MB,
            nk: plan.kernels.max(1) as f64,
            arena: plan.arena_bytes.max(1) as f64,
        }
    }

    fn x(&self, step: f64) -> f64 {
        ML + step / self.nk * self.pw
    }

    fn y(&self, bytes: f64) -> f64 {
        MT + self.ph - bytes / self.arena * self.ph
    }
}

/// The picture of [`picture`](super::picture) as a standalone SVG: one `<rect
/// class="buffer">` per arena buffer (x = its steps `[start, end)`, y = its bytes
/// `[offset, offset + bytes)`, offset 0 at the bottom), filled by the kind of the kernel
/// that writes it, with a `<title>` tooltip; axes with ticks; a dashed line at the lower
/// bound and a dotted one at the peak step.
pub fn svg(program: &Program, plan: &MemoryPlan) -> String {
    let f = Frame::new(plan);
    let mut s = String::new();
    header(&mut s, plan);
    buffers(&mut s, program, plan, &f);
    axes(&mut s, plan, &f);
    markers(&mut s, plan, &f);
    legend(&mut s, plan, &f);
    s.push_str("</svg>\n");
    s
}

/// The `<svg>` element, its title, the background and the caption.
fn header(s: &mut String, plan: &MemoryPlan) {
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
}

/// One rectangle per arena buffer and per GEMM scratch area.
fn buffers(s: &mut String, program: &Program, plan: &MemoryPlan, f: &Frame) {
    let _ = writeln!(s, r##"<g class="buffers" stroke="#222222" stroke-width="0.5">"##);
    for b in &plan.buffers {
        let step = producer(plan, b);
        let (x0, x1) = (f.x(f64::from(b.start)), f.x(f64::from(b.end)));
        let (y0, y1) = (f.y((b.offset + b.bytes) as f64), f.y(b.offset as f64));
        let dtype = program
            .buffers
            .get(b.buffer.index())
            .map_or(String::new(), |pb| format!(", {}", pb.ty));
        let tip = format!(
            "b{}{}{}: {} ({} B) at offset {}, live steps [{}, {}), written by {} ({}){}",
            b.buffer.0,
            b.name.as_ref().map_or(String::new(), |n| format!(" \"{n}\"")),
            dtype,
            human_bytes(b.bytes),
            b.bytes,
            b.offset,
            b.start,
            b.end,
            step.map_or("?", |st| st.kernel.as_str()),
            step.map_or("?", |st| st.kind.as_str()),
            b.reuses.map_or(String::new(), |r| format!(", in place of b{}", r.0))
        );
        let _ = writeln!(
            s,
            r#"<rect class="buffer" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}</title></rect>"#,
            x0,
            y0,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            kind_color(step.map(|st| &st.kind)),
            xml_escape(&tip)
        );
    }
    for sc in &plan.scratch {
        let (x0, x1) = (f.x(f64::from(sc.step)), f.x(f64::from(sc.step + 1)));
        let (y0, y1) = (f.y((sc.offset + sc.bytes) as f64), f.y(sc.offset as f64));
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
}

/// The axes, their ticks and labels.
fn axes(s: &mut String, plan: &MemoryPlan, f: &Frame) {
    let (pw, ph) = (f.pw, f.ph);
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
        let tx = f.x(t as f64);
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
        let ty = f.y(bytes as f64);
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
}

/// The lower-bound line and the peak-step line (or a note that the arena is empty).
fn markers(s: &mut String, plan: &MemoryPlan, f: &Frame) {
    let (pw, ph) = (f.pw, f.ph);
    if plan.arena_bytes == 0 {
        let _ = writeln!(
            s,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">the arena is empty</text>"#,
            ML + pw / 2.0,
            MT + ph / 2.0
        );
        return;
    }
    let ly = f.y(plan.lower_bound_bytes as f64);
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
    let px = f.x(f64::from(plan.peak_step) + 0.5);
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
}

/// The legend: the kinds of the kernels that write arena buffers, by name.
fn legend(s: &mut String, plan: &MemoryPlan, f: &Frame) {
    let mut kinds: Vec<Option<&StepKind>> = plan
        .buffers
        .iter()
        .map(|b| producer(plan, b).map(|st| &st.kind))
        .collect();
    fn name<'k>(k: &Option<&'k StepKind>) -> &'k str {
        k.map_or("?", |k| k.as_str())
    }
    kinds.sort_unstable_by(|a, b| name(a).cmp(name(b)));
    kinds.dedup_by(|a, b| name(a) == name(b));
    let _ = writeln!(s, r#"<g class="legend">"#);
    for (i, kind) in kinds.iter().enumerate() {
        let ly = MT + 60.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<rect class="legend" x="{}" y="{ly:.2}" width="12" height="12" fill="{}" stroke="#222222" stroke-width="0.5"/><text x="{}" y="{:.2}">{}</text>"##,
            ML + f.pw + 6.0,
            kind_color(*kind),
            ML + f.pw + 24.0,
            ly + 10.0,
            xml_escape(name(kind))
        );
    }
    let _ = writeln!(s, "</g>");
}
