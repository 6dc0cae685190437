//! The memory plan of a fused program: every intermediate buffer at an offset in one
//! arena, from its lifetime over the kernel order, plus what the whole run needs.
//!
//! The program's kernel order is the schedule (the pipeline has already applied the
//! memory-aware order of `schedule.rs`). Then:
//!
//! - **Liveness.** A temp buffer is live from the kernel that writes it through the last
//!   kernel that reads it. Graph inputs, weights, constants and graph outputs live
//!   outside the arena (caller-owned, or for the whole run). Views need no buffers:
//!   fusion already folded reshapes, transposes, slices and broadcasts into the strided
//!   accesses that read their source ([`MemoryPlan::aliases`] counts those reads).
//! - **In place.** A kernel's per-element output takes the storage of one of its inputs
//!   when the kernel is that input's last reader, both have the same element size and
//!   count, and every read of the input in the kernel is the very access the output is
//!   stored through (each element is read, then written, by the same thread). That holds
//!   for elementwise kernels and the per-element stores of row kernels, whose threads
//!   keep the same chunks of a row in every pass. GEMMs never write in place.
//!   The two buffers then form one arena slot; [`PlannedBuffer::reuses`] says which
//!   buffer's storage a buffer takes over.
//! - **Offsets** of the slots: [`assign_offsets`] (greedy best-fit in several orders,
//!   then a search towards the lower bound).
//! - **GEMM scratch.** A matmul kernel whose epilogue cuBLASLt cannot apply writes the
//!   product into one of its outputs when one has the product's type and layout (the
//!   generated epilogue then reads it and overwrites it in place), else to a scratch
//!   area that its generated epilogue reads
//!   (`codegen::GemmDesc::scratch_bytes`, queried by `codegen::epilogue_plan`); the
//!   plan gives that area a slot of its own, live for that one step ([`MemoryPlan::scratch`], [`PlanStep::scratch`]).
//! - **Budget**: weights + inputs + outputs + arena + library workspace (cuBLASLt, when
//!   the program has GEMMs), against `budget_bytes`.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{assign_offsets, Arch, Interval, PlanError, PlanOptions, Scheduler, Strategy};
use crate::kernel::{strides_equal, Access, BufferId, BufferKind, KernelKind, Program, Store};
use graphc_ir::work::{self, Stage};

/// 24 GiB, an RTX 4090D.
pub const DEFAULT_BUDGET: u64 = 24 << 30;

/// The cuBLASLt workspace the runtime reserves when a program has GEMMs (what PyTorch
/// gives cuBLASLt on Hopper: 32 MiB).
pub const GEMM_WORKSPACE_BYTES: u64 = 32 << 20;

/// Knobs of [`plan_memory`].
#[derive(Clone, Debug)]
pub struct MemoryOptions {
    pub budget_bytes: u64,
    pub align: u64,
    /// A safety stop on the offset search (its budget of visited states is what ends
    /// it: `plan::PlanOptions::node_limit`).
    pub time_budget: Duration,
    /// The target GPU architecture the plan is for (recorded in the plan).
    pub arch: Arch,
    /// Let outputs take their inputs' storage (see the module doc).
    pub in_place: bool,
}

impl Default for MemoryOptions {
    fn default() -> MemoryOptions {
        MemoryOptions {
            budget_bytes: DEFAULT_BUDGET,
            align: 256,
            time_budget: Duration::from_secs(2),
            arch: Arch::sm_89(),
            in_place: true,
        }
    }
}

/// One arena buffer: its place and lifetime (kernel indices, `end` exclusive).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedBuffer {
    pub buffer: BufferId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub offset: u64,
    pub bytes: u64,
    /// The kernel that writes it.
    pub start: u32,
    /// One past the last kernel that reads it (`start + 1` when nothing reads it).
    pub end: u32,
    /// The buffer whose storage this one takes over, in place, at kernel `start` (that
    /// kernel is the other buffer's last reader; both have this offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuses: Option<BufferId>,
}

/// A tensor live at the peak, for reports and the over-budget diagnosis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTensor {
    pub buffer: BufferId,
    /// The IR node that defined it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The kernel that produces it (its name) and that kernel's kind.
    pub kernel: String,
    pub op: StepKind,
    pub bytes: u64,
}

/// Where a kernel argument lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "place", rename_all = "snake_case")]
pub enum Place {
    /// In the arena, at this byte offset.
    Arena { offset: u64 },
    /// A graph input (caller-owned).
    Input { name: String },
    /// A weight (the weights region).
    Weight { name: String },
    /// A constant tensor (stored with the weights).
    Constant,
    /// A graph output (its own allocation; the first output name bound to it).
    Output { name: String },
}

/// One buffer argument of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanArg {
    pub buffer: BufferId,
    /// `read` or `write`.
    pub access: ArgAccess,
    #[serde(flatten)]
    pub place: Place,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgAccess {
    Read,
    Write,
}

/// The kind of a kernel, serialized as `elementwise`, `row`, `matmul` or the op's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum StepKind {
    Elementwise,
    Row,
    Matmul,
    /// A kernel that runs one IR op, by the op's name.
    Op(String),
}

impl StepKind {
    /// The kind of `kernel`.
    pub fn of(kernel: &crate::kernel::Kernel) -> StepKind {
        StepKind::from(kernel.kind_name())
    }

    pub fn as_str(&self) -> &str {
        match self {
            StepKind::Elementwise => "elementwise",
            StepKind::Row => "row",
            StepKind::Matmul => "matmul",
            StepKind::Op(name) => name,
        }
    }

    /// An elementwise or row kernel: cheap to run again (recomputation).
    pub fn is_cheap(&self) -> bool {
        matches!(self, StepKind::Elementwise | StepKind::Row)
    }
}

impl From<&str> for StepKind {
    fn from(s: &str) -> StepKind {
        match s {
            "elementwise" => StepKind::Elementwise,
            "row" => StepKind::Row,
            "matmul" => StepKind::Matmul,
            op => StepKind::Op(op.to_string()),
        }
    }
}

impl From<String> for StepKind {
    fn from(s: String) -> StepKind {
        StepKind::from(s.as_str())
    }
}

impl From<StepKind> for String {
    fn from(k: StepKind) -> String {
        k.as_str().to_string()
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a program runs, for the bytes it needs ([`MemoryPlan::total_bytes_for`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// A CUDA GPU: the cuBLASLt workspace counts when the program has GEMMs.
    #[default]
    Cuda,
    /// The CPU executor: no cuBLASLt workspace.
    Cpu,
}

/// One kernel of the schedule, with where each of its arguments is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    pub kernel: String,
    /// `elementwise`, `row`, `matmul` or the op's name.
    pub kind: StepKind,
    pub args: Vec<PlanArg>,
    /// The arena offset of this step's GEMM scratch, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<u64>,
}

/// The scratch area of one step's GEMM (the product its generated epilogue reads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedScratch {
    pub step: u32,
    pub offset: u64,
    pub bytes: u64,
}

/// Where every intermediate goes, and what the whole run needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The GPU architecture the plan is for.
    pub arch: Arch,
    /// Number of kernels (steps).
    pub kernels: usize,
    /// Which kernel order won (`program`, `dfs`, `list:free-largest`, ...).
    pub schedule: Scheduler,
    /// Every arena offset is a multiple of this.
    pub align: u64,
    pub arena_bytes: u64,
    /// The most arena bytes live at once (no placement can do better).
    pub lower_bound_bytes: u64,
    pub weights_bytes: u64,
    pub inputs_bytes: u64,
    pub outputs_bytes: u64,
    /// Library workspace (cuBLASLt) the run reserves.
    pub workspace_bytes: u64,
    pub budget_bytes: u64,
    /// weights + inputs + outputs + workspace + arena: what a GPU run needs
    /// ([`MemoryPlan::total_bytes_for`] gives a CPU run's).
    pub total_bytes: u64,
    /// Which offset heuristic won (`greedy:size`, `search`, ...).
    pub strategy: Strategy,
    /// The best greedy arena, for comparison.
    pub greedy_arena_bytes: u64,
    /// Buffers that took over an input's storage.
    pub in_place: usize,
    /// Reads through views (reshape, transpose, slice, broadcast folded into strides):
    /// each one a tensor that needed no buffer of its own.
    pub aliases: usize,
    /// The step (kernel index) where the most arena bytes are live.
    pub peak_step: u32,
    /// The arena tensors live at the peak, largest first.
    pub peak_live: Vec<LiveTensor>,
    /// GEMM scratch live at the peak (bytes; part of the lower bound, not a tensor).
    #[serde(default)]
    pub peak_scratch_bytes: u64,
    /// Every kernel in order, with the place of each argument.
    pub steps: Vec<PlanStep>,
    /// The arena buffers.
    pub buffers: Vec<PlannedBuffer>,
    /// GEMM scratch areas in the arena, one per step that needs one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scratch: Vec<PlannedScratch>,
    /// How long planning took (not serialized: plans are compared and snapshotted).
    #[serde(skip)]
    pub time: Duration,
}

impl MemoryPlan {
    pub fn fits(&self) -> bool {
        self.total_bytes <= self.budget_bytes
    }

    /// Bytes over the budget, if any.
    pub fn over_budget(&self) -> Option<u64> {
        self.total_bytes.checked_sub(self.budget_bytes).filter(|&b| b > 0)
    }

    /// arena / lower bound (1.0 for an empty arena).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_bytes == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound_bytes as f64
        }
    }

    /// The most arena bytes live at once (each size rounded up to the alignment) with
    /// each buffer and GEMM scratch area taking the bytes `buffer` and `scratch` give:
    /// [`MemoryPlan::lower_bound_bytes`] when they give their own sizes. A buffer
    /// written in place holds its predecessor's slot at the step that writes it (as
    /// the plan verifier counts).
    pub fn peak_with(&self, buffer: impl Fn(&PlannedBuffer) -> u64, scratch: impl Fn(&PlannedScratch) -> u64) -> u64 {
        let nk = self.steps.len();
        let align = self.align.max(1);
        let mut delta = vec![0i128; nk + 1];
        let mut add = |from: usize, to: usize, bytes: u64| {
            if from < to && bytes > 0 {
                let a = i128::from(bytes.div_ceil(align).saturating_mul(align));
                delta[from] += a;
                delta[to] -= a;
            }
        };
        for b in &self.buffers {
            let from = b.start as usize + usize::from(b.reuses.is_some());
            add(from, (b.end as usize).min(nk), buffer(b));
        }
        for sc in &self.scratch {
            add(sc.step as usize, (sc.step as usize + 1).min(nk), scratch(sc));
        }
        let (mut live, mut peak) = (0i128, 0i128);
        for d in delta {
            live += d;
            peak = peak.max(live);
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }

    /// The planned arena buffer of program buffer `id`, if it is in the arena.
    pub fn buffer(&self, id: BufferId) -> Option<&PlannedBuffer> {
        self.buffers.iter().find(|b| b.buffer == id)
    }

    /// The bytes a run on `device` needs: [`MemoryPlan::total_bytes`] on a GPU; without
    /// the cuBLASLt workspace on the CPU.
    pub fn total_bytes_for(&self, device: Device) -> u64 {
        match device {
            Device::Cuda => self.total_bytes,
            Device::Cpu => self.total_bytes.saturating_sub(self.workspace_bytes),
        }
    }

    /// Whether a run on `device` fits the budget ([`MemoryPlan::total_bytes_for`]).
    pub fn fits_on(&self, device: Device) -> bool {
        self.total_bytes_for(device) <= self.budget_bytes
    }
}

/// Union-find root.
fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Plan a program's intermediates into one arena (kernels run in program order).
pub fn plan_memory(program: &Program, opts: &MemoryOptions) -> Result<MemoryPlan, PlanError> {
    let t0 = Instant::now();
    let n = program.buffers.len();
    let nk = program.kernels.len();
    let mut first = vec![None::<u32>; n];
    let mut last = vec![None::<u32>; n];
    for (k, kernel) in program.kernels.iter().enumerate() {
        let k = k as u32;
        work::add(Stage::Plan, 1);
        for b in kernel.writes().into_iter().filter(|b| b.index() < n) {
            first[b.index()].get_or_insert(k);
            last[b.index()] = Some(last[b.index()].map_or(k, |l| l.max(k)));
        }
        for b in kernel.reads().into_iter().filter(|b| b.index() < n) {
            last[b.index()] = Some(last[b.index()].map_or(k, |l| l.max(k)));
        }
    }
    let mut output_name: Vec<Option<&str>> = vec![None; n];
    for (name, b) in &program.outputs {
        if let Some(o) = output_name.get_mut(b.index()) {
            o.get_or_insert(name.as_str());
        }
    }
    let in_arena = |i: usize| {
        matches!(program.buffers[i].kind, BufferKind::Temp) && output_name[i].is_none() && first[i].is_some()
    };

    // In-place reuse: union buffers into slots.
    let (mut parent, reuses) = if opts.in_place {
        in_place(program, &first, &last, &in_arena)
    } else {
        ((0..n).collect(), vec![None; n])
    };

    let (weights, inputs, outputs) = outside_bytes(program, &output_name);
    // Slots: one interval per union-find root.
    let mut slot_of = vec![usize::MAX; n];
    let mut root_slot = vec![usize::MAX; n];
    let mut slots: Vec<Interval> = Vec::new();
    // This loop and the buffers' below.
    work::add_len(Stage::Plan, 2 * n);
    for i in 0..n {
        if !in_arena(i) {
            continue;
        }
        let (Some(s), Some(e)) = (first[i], last[i]) else {
            continue;
        };
        let bytes = program.buffers[i].ty.size_bytes() as u64;
        let r = root(&mut parent, i);
        if root_slot[r] == usize::MAX {
            root_slot[r] = slots.len();
            slots.push(Interval::new(s, e + 1, bytes));
        }
        let slot = root_slot[r];
        let iv = &mut slots[slot];
        iv.start = iv.start.min(s);
        iv.end = iv.end.max(e + 1);
        iv.size = iv.size.max(bytes);
        slot_of[i] = slot;
    }
    // GEMM scratch: a slot live for its one step.
    let scratch_slots = gemm_scratch_slots(program, &mut slots)?;
    let placement = assign_offsets(
        &slots,
        &PlanOptions {
            align: opts.align,
            time_budget: opts.time_budget,
            node_limit: super::offsets::search_nodes(PlanOptions::default().node_limit, slots.len()),
            ..PlanOptions::default()
        },
    )?;
    debug_assert!(super::verify(&slots, &placement, opts.align).is_ok());

    let mut buffers = Vec::new();
    for i in 0..n {
        if slot_of[i] == usize::MAX {
            continue;
        }
        let (Some(s), Some(e)) = (first[i], last[i]) else {
            continue;
        };
        buffers.push(PlannedBuffer {
            buffer: BufferId(i as u32),
            name: program.buffers[i].name.clone(),
            offset: placement.offsets[slot_of[i]],
            bytes: program.buffers[i].ty.size_bytes() as u64,
            start: s,
            end: e + 1,
            reuses: reuses[i],
        });
    }

    let scratch: Vec<PlannedScratch> = scratch_slots
        .iter()
        .map(|&(step, slot)| PlannedScratch {
            step,
            offset: placement.offsets[slot],
            bytes: slots[slot].size,
        })
        .collect();
    let (peak_step, peak_live, peak_scratch_bytes) = peak(program, &slots, &buffers, &slot_of, &scratch, opts.align);
    let scratch_at: std::collections::HashMap<u32, u64> = scratch.iter().map(|s| (s.step, s.offset)).collect();

    let (steps, aliases) = plan_steps(program, &output_name, &slot_of, &placement.offsets, &scratch_at);

    // Quantized GEMMs are generated kernels: only cuBLASLt's need its workspace.
    let has_gemm = program
        .kernels
        .iter()
        .any(|k| matches!(&k.kind, KernelKind::MatMul(m) if m.quant.is_none()));
    let workspace = if has_gemm { GEMM_WORKSPACE_BYTES } else { 0 };
    let total = weights
        .saturating_add(inputs)
        .saturating_add(outputs)
        .saturating_add(workspace)
        .saturating_add(placement.arena);
    Ok(MemoryPlan {
        arch: opts.arch.clone(),
        kernels: nk,
        schedule: Scheduler::Program,
        align: opts.align,
        arena_bytes: placement.arena,
        lower_bound_bytes: placement.lower_bound,
        weights_bytes: weights,
        inputs_bytes: inputs,
        outputs_bytes: outputs,
        workspace_bytes: workspace,
        budget_bytes: opts.budget_bytes,
        total_bytes: total,
        strategy: placement.strategy,
        greedy_arena_bytes: placement.greedy_arena,
        in_place: reuses.iter().filter(|r| r.is_some()).count(),
        aliases,
        peak_step,
        peak_live,
        peak_scratch_bytes,
        steps,
        buffers,
        scratch,
        time: t0.elapsed(),
    })
}

/// The bytes outside the arena: weights (and constants), graph inputs, graph outputs
/// (donated outputs take their input's storage).
fn outside_bytes(program: &Program, output_name: &[Option<&str>]) -> (u64, u64, u64) {
    let (mut weights, mut inputs, mut outputs) = (0u64, 0u64, 0u64);
    for (i, b) in program.buffers.iter().enumerate() {
        let bytes = b.ty.size_bytes() as u64;
        let is_output = output_name.get(i).is_some_and(Option::is_some);
        // A donated output is written over its input's storage: no bytes of its own.
        if program.donated.iter().any(|d| d.output.index() == i) {
            continue;
        }
        match (&b.kind, is_output) {
            (BufferKind::Weight { .. } | BufferKind::Constant { .. }, _) => weights = weights.saturating_add(bytes),
            (BufferKind::Input { .. }, _) => inputs = inputs.saturating_add(bytes),
            (BufferKind::Temp, true) => outputs = outputs.saturating_add(bytes),
            (BufferKind::Temp, false) => {}
        }
    }
    (weights, inputs, outputs)
}

/// In-place reuse (see the module doc): per buffer, the buffer whose storage it takes
/// over, and the union-find parents that join each such pair into one slot.
fn in_place(
    program: &Program,
    first: &[Option<u32>],
    last: &[Option<u32>],
    in_arena: &dyn Fn(usize) -> bool,
) -> (Vec<usize>, Vec<Option<BufferId>>) {
    let n = program.buffers.len();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut reuses: Vec<Option<BufferId>> = vec![None; n];
    let mut taken = vec![false; n];
    for (k, kernel) in program.kernels.iter().enumerate() {
        let (space, inputs, stores): (Vec<usize>, &[Access], &[Store]) = match &kernel.kind {
            KernelKind::Elementwise(e) => (e.space.clone(), &e.inputs, &e.stores),
            KernelKind::Row(r) => (r.space(), &r.inputs, &r.stores),
            _ => continue,
        };
        // The accesses of each input buffer, grouped once per kernel (a kernel may
        // read 100k buffers: no scan of all inputs per candidate).
        let mut reads_of: std::collections::HashMap<usize, Vec<&Access>> = std::collections::HashMap::new();
        for a in inputs {
            reads_of.entry(a.buffer.index()).or_default().push(a);
        }
        for store in stores {
            let out = store.access.buffer.index();
            if out >= n || !in_arena(out) || first[out] != Some(k as u32) || reuses[out].is_some() {
                continue;
            }
            let ob = &program.buffers[out];
            let candidate = inputs.iter().map(|a| a.buffer.index()).find(|&a| {
                a < n
                    && a != out
                    && !taken[a]
                    && in_arena(a)
                    && last[a] == Some(k as u32)
                    && program.buffers[a].ty.dtype.size_bytes() == ob.ty.dtype.size_bytes()
                    && program.buffers[a].ty.numel() == ob.ty.numel()
                    && reads_of.get(&a).into_iter().flatten().all(|x| {
                        x.offset == store.access.offset && strides_equal(&x.strides, &store.access.strides, &space)
                    })
            });
            if let Some(a) = candidate {
                taken[a] = true;
                reuses[out] = Some(BufferId(a as u32));
                let (ra, ro) = (root(&mut parent, a), root(&mut parent, out));
                parent[ro] = ra;
            }
        }
    }
    (parent, reuses)
}

/// The step where the slots' aligned live bytes are highest, the tensors live there
/// (largest first) and the GEMM scratch live there.
fn peak(
    program: &Program,
    slots: &[Interval],
    buffers: &[PlannedBuffer],
    slot_of: &[usize],
    scratch: &[PlannedScratch],
    align: u64,
) -> (u32, Vec<LiveTensor>, u64) {
    let nk = program.kernels.len();
    // The peak step: where the slots' live bytes (aligned) are highest.
    let align = align.max(1);
    let mut delta = vec![0i128; nk + 1];
    // The slots, the steps, the buffers.
    work::add_len(Stage::Plan, slots.len() + nk + buffers.len());
    for iv in slots {
        let a = iv.size.div_ceil(align).saturating_mul(align);
        delta[iv.start as usize] += i128::from(a);
        delta[(iv.end as usize).min(nk)] -= i128::from(a);
    }
    let (mut live, mut peak, mut peak_step) = (0i128, 0i128, 0u32);
    for (t, d) in delta.iter().enumerate().take(nk) {
        live += d;
        if live > peak {
            (peak, peak_step) = (live, t as u32);
        }
    }
    let peak_scratch_bytes = scratch
        .iter()
        .filter(|s| s.step == peak_step)
        .map(|s| s.bytes)
        .fold(0, u64::saturating_add);
    let mut seen_slot = vec![false; slots.len()];
    let mut at_peak: Vec<&PlannedBuffer> = buffers
        .iter()
        .filter(|b| b.start <= peak_step && peak_step < b.end)
        .collect();
    // Of two buffers sharing a slot at the peak (the step that writes in place), the
    // newer one stands for the slot.
    at_peak.sort_by_key(|b| std::cmp::Reverse(b.start));
    at_peak.retain(|b| !std::mem::replace(&mut seen_slot[slot_of[b.buffer.index()]], true));
    let mut peak_live: Vec<LiveTensor> = at_peak
        .iter()
        .map(|b| {
            let kernel = &program.kernels[b.start as usize];
            LiveTensor {
                buffer: b.buffer,
                name: b.name.clone(),
                kernel: kernel.name.clone(),
                op: StepKind::of(kernel),
                bytes: b.bytes,
            }
        })
        .collect();
    peak_live.sort_by_key(|t| (std::cmp::Reverse(t.bytes), t.buffer));

    (peak_step, peak_live, peak_scratch_bytes)
}

/// Every kernel in order with the place of each argument, and the reads through views.
fn plan_steps(
    program: &Program,
    output_name: &[Option<&str>],
    slot_of: &[usize],
    offsets: &[u64],
    scratch_at: &std::collections::HashMap<u32, u64>,
) -> (Vec<PlanStep>, usize) {
    let place = |b: BufferId| -> Place {
        let i = b.index();
        match program.buffers.get(i).map(|x| &x.kind) {
            Some(BufferKind::Input { name }) => Place::Input { name: name.clone() },
            Some(BufferKind::Weight { name }) => Place::Weight { name: name.clone() },
            Some(BufferKind::Constant { .. }) => Place::Constant,
            _ => match output_name.get(i).copied().flatten() {
                Some(name) => Place::Output { name: name.to_string() },
                None => Place::Arena {
                    offset: slot_of.get(i).and_then(|&s| offsets.get(s)).copied().unwrap_or(0),
                },
            },
        }
    };
    let mut aliases = 0usize;
    let steps: Vec<PlanStep> = program
        .kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            work::add(Stage::Plan, 1);
            aliases += view_reads(program, kernel);
            let reads = kernel.reads().into_iter().map(|b| (b, ArgAccess::Read));
            let writes = kernel.writes().into_iter().map(|b| (b, ArgAccess::Write));
            PlanStep {
                kernel: kernel.name.clone(),
                kind: StepKind::of(kernel),
                args: reads
                    .chain(writes)
                    .map(|(b, access)| PlanArg {
                        buffer: b,
                        access,
                        place: place(b),
                    })
                    .collect(),
                scratch: scratch_at.get(&(k as u32)).copied(),
            }
        })
        .collect();
    (steps, aliases)
}

/// A slot live for its one step for each matmul whose generated epilogue reads the
/// GEMM's product from scratch: (step, slot index) pairs, the slots appended.
fn gemm_scratch_slots(program: &Program, slots: &mut Vec<Interval>) -> Result<Vec<(u32, usize)>, PlanError> {
    let mut scratch_slots: Vec<(u32, usize)> = Vec::new();
    for k in 0..program.kernels.len() {
        // A matmul the CUDA backend cannot run has no GEMM scratch.
        let bytes = match crate::codegen::epilogue_plan(program, k) {
            Ok(plan) => plan.map_or(0, |p| p.scratch_bytes()),
            Err(e) if e.is_backend_limit() => 0,
            Err(e) => return Err(PlanError::Codegen(Box::new(e))),
        };
        if bytes > 0 {
            scratch_slots.push((k as u32, slots.len()));
            slots.push(Interval::new(k as u32, k as u32 + 1, bytes));
        }
    }
    Ok(scratch_slots)
}

/// Reads of a kernel that go through a view: an access that is not the plain row-major
/// walk of its buffer over a space of the buffer's own shape.
fn view_reads(program: &Program, kernel: &crate::kernel::Kernel) -> usize {
    let plain = |a: &Access, space: &[usize]| {
        program
            .buffers
            .get(a.buffer.index())
            .is_some_and(|b| b.ty.shape.dims() == space && a.is_contiguous(space))
    };
    match &kernel.kind {
        KernelKind::Elementwise(e) => e.inputs.iter().filter(|a| !plain(a, &e.space)).count(),
        KernelKind::Row(r) => {
            let space = r.space();
            r.inputs.iter().filter(|a| !plain(a, &space)).count()
        }
        KernelKind::MatMul(mm) => {
            let dims = |x: usize, y: usize| mm.batch.iter().copied().chain([x, y]).collect::<Vec<usize>>();
            usize::from(!plain(&mm.a, &dims(mm.m, mm.k)))
                + usize::from(!plain(&mm.b, &dims(mm.k, mm.n)))
                + mm.inputs.iter().filter(|a| !plain(a, &dims(mm.m, mm.n))).count()
        }
        KernelKind::Op(o) => o.inputs.iter().filter(|(a, t)| !plain(a, t.shape.dims())).count(),
        KernelKind::Conv(c) => {
            let space = c.space();
            usize::from(!plain(&c.x, &c.x_dims))
                + usize::from(!plain(&c.w, &c.w_dims))
                + c.inputs.iter().filter(|a| !plain(a, &space)).count()
        }
        KernelKind::MultiTensor(m) => m
            .parts
            .iter()
            .map(|p| p.inputs.iter().filter(|a| !plain(a, &p.space)).count())
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::StepKind;

    #[test]
    fn step_kinds_serialize_as_their_names() {
        for (k, name) in [
            (StepKind::Elementwise, "elementwise"),
            (StepKind::Row, "row"),
            (StepKind::Matmul, "matmul"),
            (StepKind::Op("conv2d".into()), "conv2d"),
        ] {
            assert_eq!(k.to_string(), name);
            assert_eq!(serde_json::to_string(&k).ok(), Some(format!("\"{name}\"")));
            assert_eq!(serde_json::from_str::<StepKind>(&format!("\"{name}\"")).ok(), Some(k));
        }
    }
}
