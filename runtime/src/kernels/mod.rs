//! The CPU executor of a kernel-IR [`Program`] (see `graphc_compiler::kernel`).
//!
//! Each kernel is computed a whole expression at a time: a body expression becomes one
//! tensor over the kernel's iteration space, computed by the reference interpreter's own
//! [`eval_op`](graphc_ir::interp::eval_op), so a fused program computes exactly what the
//! interpreter computes for the unfused graph. Accesses are gathered into dense tensors
//! (a plain copy when contiguous, an odometer walk otherwise) and stores are scattered
//! into fresh, whole buffers.
//!
//! Two drivers share that machinery:
//!
//! - [`run_planned`] (`arena.rs`): the executor models run through. Every intermediate
//!   lives in ONE host arena (`Vec<u8>`, poisoned with `0xFF` bytes) at the offset a
//!   [`MemoryPlan`](graphc_compiler::plan::MemoryPlan) gives it, the bytes the GPU would
//!   use; each kernel decodes the arena buffers it reads, runs, and encodes what it
//!   writes back. A plan that overlaps live buffers gives wrong numbers here; a plan
//!   that does not fit the program is a [`KernelError::Plan`] naming the buffer.
//! - [`run_program`]: the unplanned reference, one allocation per buffer, used by the
//!   low-level kernel tests (and to compare the arena against).
//!
//! Nothing here panics on a malformed program: every kernel is verified by the kernel
//! IR's verifier ([`graphc_compiler::kernel::verify_kernel`]: access ranks and bounds,
//! expression operands, dtypes, stage and store rules) before it reads any data, and
//! errors name the kernel (index and name) or the input, weight or buffer.

mod access;
mod arena;
mod attention;
mod body;
mod conv;
mod elementwise;
mod matmul;
mod op;
mod row;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use graphc_compiler::kernel::{Buffer, BufferId, BufferKind, KernelKind, Program};
use graphc_ir::{Tensor, TensorType};

pub use arena::run_planned;
pub(crate) use arena::{encode, validate as validate_plan};

/// An error running a program, naming what it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("input \"{0}\" is missing")]
    MissingInput(String),
    #[error("input \"{name}\" should be {expected}, got {got}")]
    InputType {
        name: String,
        expected: TensorType,
        got: TensorType,
    },
    #[error("\"{0}\" is not an input of the program")]
    UnknownInput(String),
    #[error("weight \"{name}\" (buffer b{buffer}) is missing")]
    MissingWeight { name: String, buffer: u32 },
    /// A buffer that cannot be bound (bad declaration, weight or constant of the wrong type).
    #[error("buffer b{buffer}: {message}")]
    Buffer { buffer: u32, message: String },
    /// A kernel that is not well-formed kernel IR.
    #[error(transparent)]
    Verify(#[from] Box<graphc_compiler::kernel::KernelVerifyError>),
    /// A kernel that fails while running (or is malformed in a way only running shows).
    #[error("kernel {index} ({name}): {message}")]
    Kernel {
        index: usize,
        name: String,
        message: String,
    },
    #[error("output \"{name}\": {message}")]
    Output { name: String, message: String },
    /// The program as a whole (outputs, input list, buffer slots) is malformed.
    #[error("program: {0}")]
    Program(String),
    /// The memory plan does not fit the program (or the arena cannot be allocated);
    /// the message names the buffer.
    #[error("memory plan: {0}")]
    Plan(String),
}

/// Run `program` on named inputs with its weights; returns the named outputs in order.
///
/// Input buffers are bound by name (each must be given with the buffer's exact type,
/// and no other name may be given), weights by name from `weights`, constants from
/// their values. Kernels run in program order; a temp buffer is allocated when a kernel
/// writes it and dropped after its last reader (unless it is an output).
///
/// This is the *unplanned* executor (one allocation per buffer): the reference the
/// low-level kernel tests use. Models run through [`run_planned`], which keeps every
/// intermediate in one arena at the offsets of a memory plan.
pub fn run_program(
    program: &Program,
    weights: &BTreeMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let n = program.buffers.len();
    let mut slots = bind(program, weights, inputs)?;

    // The last kernel reading each buffer, to drop temps early.
    let mut last_read: Vec<Option<usize>> = vec![None; n];
    for (k, kernel) in program.kernels.iter().enumerate() {
        for b in kernel.reads() {
            if let Some(l) = last_read.get_mut(b.index()) {
                *l = Some(k);
            }
        }
    }
    let mut is_output = vec![false; n];
    for (_, id) in &program.outputs {
        is_output[id.index()] = true;
    }

    for index in 0..program.kernels.len() {
        let writes = exec_kernel(program, index, &|id| slots.get(id.index()).and_then(|s| s.as_deref()))?;
        for (id, t) in writes {
            if slots[id.index()].is_some() {
                return Err(kernel_error(
                    program,
                    index,
                    format!("writes buffer b{} which an earlier kernel already wrote", id.0),
                ));
            }
            slots[id.index()] = Some(Cow::Owned(t));
        }
        for b in program.kernels[index].reads() {
            let i = b.index();
            if i < n
                && last_read[i] == Some(index)
                && !is_output[i]
                && matches!(program.buffers[i].kind, BufferKind::Temp)
            {
                slots[i] = None;
            }
        }
    }

    collect_outputs(program, |id| slots[id.index()].as_deref())
}

/// The named outputs, in order, read from where the executor keeps them.
pub(crate) fn collect_outputs<'t>(
    program: &Program,
    value: impl Fn(BufferId) -> Option<&'t Tensor>,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let mut out = Vec::with_capacity(program.outputs.len());
    for (name, id) in &program.outputs {
        let t = value(*id).ok_or_else(|| KernelError::Output {
            name: name.clone(),
            message: format!("buffer b{} was never written", id.0),
        })?;
        out.push((name.clone(), t.clone()));
    }
    Ok(out)
}

/// Check the program's input and output lists, then bind inputs (by name, exact type,
/// no unknown names), weights and constants: one slot per buffer, temps empty.
pub(crate) fn bind<'a>(
    program: &'a Program,
    weights: &'a BTreeMap<String, Tensor>,
    inputs: &'a HashMap<String, Tensor>,
) -> Result<Vec<Option<Cow<'a, Tensor>>>, KernelError> {
    let n = program.buffers.len();
    for &id in &program.inputs {
        match program.buffers.get(id.index()) {
            Some(Buffer {
                kind: BufferKind::Input { .. },
                ..
            }) => {}
            Some(_) => {
                return Err(KernelError::Program(format!(
                    "b{} is listed as an input but is not one",
                    id.0
                )))
            }
            None => return Err(KernelError::Program(format!("input buffer b{} does not exist", id.0))),
        }
    }
    for (name, id) in &program.outputs {
        if id.index() >= n {
            return Err(KernelError::Output {
                name: name.clone(),
                message: format!("buffer b{} does not exist", id.0),
            });
        }
    }

    // Bind inputs, weights and constants.
    let mut slots: Vec<Option<Cow<'_, Tensor>>> = Vec::with_capacity(n);
    // A set: a program may read 100k inputs, and each given name is looked up.
    let mut input_names: HashSet<&str> = HashSet::new();
    for (i, buf) in program.buffers.iter().enumerate() {
        let slot = match &buf.kind {
            BufferKind::Input { name } => {
                let t = inputs
                    .get(name)
                    .ok_or_else(|| KernelError::MissingInput(name.clone()))?;
                if t.ty() != buf.ty {
                    return Err(KernelError::InputType {
                        name: name.clone(),
                        expected: buf.ty.clone(),
                        got: t.ty(),
                    });
                }
                input_names.insert(name);
                Some(Cow::Borrowed(t))
            }
            BufferKind::Weight { name } => {
                let t = weights.get(name).ok_or_else(|| KernelError::MissingWeight {
                    name: name.clone(),
                    buffer: i as u32,
                })?;
                if t.ty() != buf.ty {
                    return Err(KernelError::Buffer {
                        buffer: i as u32,
                        message: format!("weight \"{name}\" is {} but the buffer is {}", t.ty(), buf.ty),
                    });
                }
                Some(Cow::Borrowed(t))
            }
            BufferKind::Constant { value } => {
                if value.ty() != buf.ty {
                    return Err(KernelError::Buffer {
                        buffer: i as u32,
                        message: format!("constant is {} but the buffer is {}", value.ty(), buf.ty),
                    });
                }
                Some(Cow::Borrowed(value))
            }
            BufferKind::Temp => None,
        };
        slots.push(slot);
    }
    let mut extra: Vec<&String> = inputs.keys().filter(|k| !input_names.contains(&k.as_str())).collect();
    extra.sort();
    if let Some(name) = extra.first() {
        return Err(KernelError::UnknownInput((*name).clone()));
    }
    Ok(slots)
}

/// Run kernel `index` of `program` on `buffers` (indexed by buffer id, one slot per
/// buffer of the program): reads the buffers it reads (each must be set, with its
/// buffer's type) and sets the buffers it writes, replacing what they held.
pub fn run_kernel(program: &Program, index: usize, buffers: &mut [Option<Tensor>]) -> Result<(), KernelError> {
    if buffers.len() != program.buffers.len() {
        return Err(KernelError::Program(format!(
            "{} buffer slots given for {} buffers",
            buffers.len(),
            program.buffers.len()
        )));
    }
    let writes = exec_kernel(program, index, &|id| buffers.get(id.index()).and_then(|s| s.as_ref()))?;
    for (id, t) in writes {
        buffers[id.index()] = Some(t);
    }
    Ok(())
}

/// Empty slots for `program`'s buffers, with constants bound (for [`run_kernel`]).
pub fn constant_slots(program: &Program) -> Vec<Option<Tensor>> {
    program
        .buffers
        .iter()
        .map(|b| match &b.kind {
            BufferKind::Constant { value } => Some(value.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn kernel_error(program: &Program, index: usize, message: String) -> KernelError {
    KernelError::Kernel {
        index,
        name: program.kernels.get(index).map(|k| k.name.clone()).unwrap_or_default(),
        message,
    }
}

/// Reads a buffer's current value (`None` when not set).
pub(crate) type Reader<'r> = dyn Fn(BufferId) -> Option<&'r Tensor> + 'r;

/// The buffers a kernel reads, checked, and a way to name them in messages.
pub(crate) struct Ctx<'p, 'r> {
    pub program: &'p Program,
    read: &'r Reader<'r>,
}

impl<'p, 'r> Ctx<'p, 'r> {
    /// The declared buffer `id`, or an error when it does not exist.
    pub fn buffer(&self, id: BufferId) -> Result<&'p Buffer, String> {
        self.program.buffers.get(id.index()).ok_or_else(|| {
            format!(
                "buffer b{} does not exist ({} buffers)",
                id.0,
                self.program.buffers.len()
            )
        })
    }

    /// The current value of buffer `id`, checked against its declared type.
    pub fn value(&self, id: BufferId) -> Result<&'r Tensor, String> {
        let buf = self.buffer(id)?;
        let t = (self.read)(id).ok_or_else(|| match &buf.kind {
            BufferKind::Temp => format!("reads buffer {} before any kernel wrote it", describe(id, buf)),
            _ => format!("reads buffer {}, which is not bound", describe(id, buf)),
        })?;
        if t.ty() != buf.ty {
            return Err(format!(
                "buffer {} holds {} but is declared {}",
                describe(id, buf),
                t.ty(),
                buf.ty
            ));
        }
        Ok(t)
    }

    /// Check that a kernel may write buffer `id` (a temp), returning its declaration.
    pub fn writable(&self, id: BufferId) -> Result<&'p Buffer, String> {
        let buf = self.buffer(id)?;
        match buf.kind {
            BufferKind::Temp => Ok(buf),
            _ => Err(format!("writes buffer {}, which is not a temp", describe(id, buf))),
        }
    }
}

/// `b3 (temp "name")`, `b0 (input "x")`, ... for messages.
pub(crate) fn describe(id: BufferId, buf: &Buffer) -> String {
    graphc_compiler::kernel::describe_buffer(id, buf)
}

/// Verify and run kernel `index`, returning the buffers it writes with their values.
pub(crate) fn exec_kernel<'r>(
    program: &Program,
    index: usize,
    read: &'r Reader<'r>,
) -> Result<Vec<(BufferId, Tensor)>, KernelError> {
    let kernel = program
        .kernels
        .get(index)
        .ok_or_else(|| KernelError::Program(format!("kernel {index} does not exist")))?;
    graphc_compiler::kernel::verify_kernel(program, index).map_err(Box::new)?;
    let ctx = Ctx { program, read };
    let result = match &kernel.kind {
        KernelKind::Elementwise(e) => elementwise::run(&ctx, &e.space, &e.inputs, &e.body, &e.stores),
        KernelKind::Row(r) => row::run(&ctx, r),
        KernelKind::MatMul(mm) => matmul::run(&ctx, mm),
        KernelKind::Conv(c) => conv::run(&ctx, c),
        // Siblings (verified) run as ops of their own over the operands they read.
        KernelKind::Op(o) => op::run(&ctx, &o.op, &o.inputs, o.output).and_then(|first| {
            o.siblings.iter().try_fold(first, |mut all, s| {
                let inputs = o
                    .sibling_inputs(s)
                    .ok_or("a sibling reads an operand past the kernel's")?;
                all.extend(op::run(&ctx, &s.op, &inputs, s.output)?);
                Ok(all)
            })
        }),
        // The parts are independent (verified): each runs as its own elementwise kernel.
        KernelKind::MultiTensor(m) => m.parts.iter().try_fold(Vec::new(), |mut all, p| {
            all.extend(elementwise::run(&ctx, &p.space, &p.inputs, &p.body, &p.stores)?);
            Ok(all)
        }),
    };
    let writes = result.map_err(|m| kernel_error(program, index, m))?;
    // Two stores of one kernel to the same buffer are rejected by validation; check
    // the result type once more so a slot never holds a mistyped tensor.
    for (id, t) in &writes {
        let buf = &program.buffers[id.index()];
        if t.ty() != buf.ty {
            return Err(kernel_error(
                program,
                index,
                format!("internal error: computed {} for buffer {}", t.ty(), describe(*id, buf)),
            ));
        }
    }
    Ok(writes)
}
