//! The one verifier of the kernel IR: [`verify`] checks a whole [`Program`],
//! [`verify_kernel`] one kernel, with typed errors ([`KernelVerifyError`]) naming the
//! kernel and the buffer, expression, stage or store at fault.
//!
//! What holds after it succeeds, for every kernel:
//! - every access names an existing buffer, has the rank of its space, and every
//!   element it reaches lies inside its buffer;
//! - every store writes a temp buffer of its value's dtype, covering it exactly once,
//!   and no buffer is stored twice by one kernel;
//! - the body is in SSA order (operands precede their users), every expression's
//!   declared dtype is the one its op computes (loads and gathers: their buffer's
//!   dtype), constants are scalars, gather indices are integers, loads, gathers,
//!   stages and index axes are in range, stages appear in row kernels only and use
//!   earlier stages only, the product in matmul kernels only;
//! - row stores store per-row values (not varying along the inner dims);
//! - matmul operands have the shapes `[batch.., m, k]` and `[batch.., k, n]` and a
//!   product [`Op::MatMul`] accepts;
//! - an op kernel's operands have their buffers' dtypes and the op gives exactly its
//!   output buffer's type;
//! - every part of a multi-tensor kernel is a valid elementwise kernel, and no part
//!   reads or writes a buffer another part writes.
//!
//! Code generation (`crate::codegen`) and the CPU executor (`graphc-runtime`) run it
//! before they read a kernel; the compile pipeline runs it after fusion and scheduling
//! in debug builds and with `verify_each_pass`.

// The error names what is wrong in full (buffers, types); it is built once, when
// verification fails, and callers box it into their own error types.
#![allow(clippy::result_large_err)]

mod error;

use graphc_ir::{infer_type, DType, Op, ReduceOp, TensorType};

use super::{
    Access, Body, Buffer, BufferId, BufferKind, ElementwiseKernel, Expr, ExprId, KernelKind, MatMulKernel,
    MultiTensorKernel, OpKernel, Program, QuantB, RowKernel, Stage, Store,
};

pub use error::{describe_buffer, ExprAt, KernelAt, KernelVerifyError};

/// Verify every kernel of `program`, in order; the first error.
pub fn verify(program: &Program) -> Result<(), KernelVerifyError> {
    (0..program.kernels.len()).try_for_each(|k| verify_kernel(program, k))
}

/// Verify kernel `index` of `program` (see the module doc).
pub fn verify_kernel(program: &Program, index: usize) -> Result<(), KernelVerifyError> {
    let kernel = program.kernels.get(index).ok_or(KernelVerifyError::NoSuchKernel {
        index,
        count: program.kernels.len(),
    })?;
    graphc_ir::work::add(graphc_ir::work::Stage::Verify, 1);
    let v = Verifier {
        program,
        at: KernelAt {
            index,
            name: kernel.name.clone(),
        },
    };
    match &kernel.kind {
        KernelKind::Elementwise(e) => v.elementwise(e),
        KernelKind::Row(r) => v.row(r),
        KernelKind::MatMul(mm) => v.matmul(mm),
        KernelKind::Op(o) => v.op(o),
        KernelKind::MultiTensor(m) => v.multi_tensor(m),
        KernelKind::Conv(c) => v.conv(c),
    }
}

/// What a body may use besides loads, constants, indices and elementwise ops.
enum Extra<'a> {
    None,
    /// Row kernels: stages reducing over the space's dims from `outer_rank` on.
    Row {
        stages: &'a [Stage],
        outer_rank: usize,
    },
    /// Matmul kernels: the product, of this dtype.
    Acc(DType),
}

/// The reduction a row kernel's stage computes over a full space of rank `rank`
/// (keeping the reduced dims).
pub fn stage_op(op: ReduceOp, outer_rank: usize, rank: usize) -> Op {
    Op::Reduce {
        op,
        axes: (outer_rank..rank).collect(),
        keepdims: true,
    }
}

/// A short name of an expression for messages: `load 0`, `add`, `stage 1`, ...
pub fn expr_name(e: &Expr) -> String {
    match e {
        Expr::Load(n) => format!("load {n}"),
        Expr::Const(_) => "const".into(),
        Expr::Index(a) => format!("index {a}"),
        Expr::Unary(u, _) => u.name().into(),
        Expr::Binary(b, _, _) => b.name().into(),
        Expr::Select(..) => "select".into(),
        Expr::Cast(_) => "cast".into(),
        Expr::Stage(n) => format!("stage {n}"),
        Expr::Acc => "acc".into(),
        Expr::Gather { input, .. } => format!("gather {input}"),
    }
}

/// Which expressions vary along the space's dims from `from` on (row kernels: whether an
/// expression is per element rather than per row).
pub fn varies_from(body: &Body, space: &[usize], inputs: &[Access], from: usize) -> Vec<bool> {
    let moves = |k: usize| space.get(k).is_some_and(|&d| d > 1);
    let input_varies = |n: u32| {
        inputs.get(n as usize).is_some_and(|a| {
            a.strides
                .iter()
                .enumerate()
                .any(|(k, &s)| k >= from && s != 0 && moves(k))
        })
    };
    let mut v: Vec<bool> = Vec::with_capacity(body.exprs.len());
    for (e, _) in &body.exprs {
        let x = match e {
            Expr::Load(n) => input_varies(n.0),
            Expr::Index(a) => *a as usize >= from && moves(*a as usize),
            Expr::Gather { input, index, .. } => v.get(index.index()).copied().unwrap_or(true) || input_varies(input.0),
            Expr::Const(_) | Expr::Stage(_) | Expr::Acc => false,
            _ => e.operands().iter().any(|&o| v.get(o.index()).copied().unwrap_or(true)),
        };
        v.push(x);
    }
    v
}

/// Element count of `dims`, None when it overflows.
fn numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The least and greatest element offset an access reaches over a non-empty space.
fn reach(acc: &Access, space: &[usize]) -> (i128, i128) {
    let mut lo = acc.offset as i128;
    let mut hi = acc.offset as i128;
    for (&d, &s) in space.iter().zip(&acc.strides) {
        // Saturating: i128 holds any one span of realistic sizes, not every sum of them.
        let span = (d as i128 - 1).saturating_mul(s as i128);
        if span < 0 {
            lo = lo.saturating_add(span);
        } else {
            hi = hi.saturating_add(span);
        }
    }
    (lo, hi)
}

/// Whether strides (ignoring extent-1 dims, in any order and sign) are the contiguous
/// strides of some ordering of the dims of `space`.
fn is_permutation(acc: &Access, space: &[usize]) -> bool {
    let mut dims: Vec<(u64, usize)> = space
        .iter()
        .zip(&acc.strides)
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (s.unsigned_abs(), d))
        .collect();
    dims.sort_unstable();
    let mut expect: u128 = 1;
    for &(s, d) in &dims {
        if s as u128 != expect {
            return false;
        }
        expect *= d as u128;
    }
    true
}

struct Verifier<'p> {
    program: &'p Program,
    at: KernelAt,
}

type R<T = ()> = Result<T, KernelVerifyError>;

impl<'p> Verifier<'p> {
    fn kernel(&self) -> KernelAt {
        self.at.clone()
    }

    fn buffer(&self, id: BufferId, what: &str) -> R<&'p Buffer> {
        self.program
            .buffers
            .get(id.index())
            .ok_or_else(|| KernelVerifyError::MissingBuffer {
                kernel: self.kernel(),
                what: what.to_string(),
                buffer: id.0,
                count: self.program.buffers.len(),
            })
    }

    fn rank(&self, acc: &Access, space: &[usize], what: &str) -> R {
        if acc.strides.len() != space.len() {
            return Err(KernelVerifyError::AccessRank {
                kernel: self.kernel(),
                what: what.to_string(),
                buffer: acc.buffer.0,
                strides: acc.strides.len(),
                rank: space.len(),
            });
        }
        Ok(())
    }

    fn space_numel(&self, space: &[usize], what: &str) -> R<usize> {
        numel(space).ok_or_else(|| KernelVerifyError::SpaceTooLarge {
            kernel: self.kernel(),
            what: what.to_string(),
            space: space.to_vec(),
        })
    }

    /// A read over `space`: rank, and every reached element inside the buffer.
    /// Returns the buffer.
    fn read(&self, acc: &Access, space: &[usize], what: &str) -> R<&'p Buffer> {
        let buf = self.buffer(acc.buffer, what)?;
        self.rank(acc, space, what)?;
        if self.space_numel(space, what)? == 0 {
            return Ok(buf);
        }
        let (lo, hi) = reach(acc, space);
        let len = buf.ty.numel();
        if lo < 0 || hi >= len as i128 {
            return Err(KernelVerifyError::OutOfBounds {
                kernel: self.kernel(),
                what: what.to_string(),
                buffer: acc.buffer.0,
                lo,
                hi,
                len,
            });
        }
        Ok(buf)
    }

    /// Input accesses over `space`; their dtypes.
    fn inputs(&self, inputs: &[Access], space: &[usize]) -> R<Vec<DType>> {
        inputs
            .iter()
            .enumerate()
            .map(|(n, a)| self.read(a, space, &format!("input {n}")).map(|b| b.ty.dtype))
            .collect()
    }

    /// Stores over `space` (see the module doc); `seen` collects the stored buffers of
    /// the kernel.
    fn stores(&self, body: &Body, stores: &[Store], space: &[usize], what: &str, seen: &mut Vec<BufferId>) -> R {
        for (j, st) in stores.iter().enumerate() {
            let what = format!("{what} {j}");
            let id = st.access.buffer;
            let buf = self.buffer(id, &what)?;
            let described = || describe_buffer(id, buf);
            if buf.kind != BufferKind::Temp {
                return Err(KernelVerifyError::StoreNotTemp {
                    kernel: self.kernel(),
                    what,
                    buffer: described(),
                });
            }
            let Some((_, dt)) = body.exprs.get(st.value.index()) else {
                return Err(KernelVerifyError::MissingValue {
                    kernel: self.kernel(),
                    what,
                    value: st.value,
                    count: body.exprs.len(),
                });
            };
            if *dt != buf.ty.dtype {
                return Err(KernelVerifyError::StoreDtype {
                    kernel: self.kernel(),
                    what,
                    value: st.value,
                    dtype: *dt,
                    buffer: described(),
                    ty: buf.ty.clone(),
                });
            }
            if seen.contains(&id) {
                return Err(KernelVerifyError::StoredTwice {
                    kernel: self.kernel(),
                    what,
                    buffer: described(),
                });
            }
            seen.push(id);
            self.rank(&st.access, space, &what)?;
            let n = self.space_numel(space, &what)?;
            if n != buf.ty.numel() {
                return Err(KernelVerifyError::StoreSize {
                    kernel: self.kernel(),
                    what,
                    elements: n,
                    buffer: described(),
                    buffer_elements: buf.ty.numel(),
                    ty: buf.ty.clone(),
                });
            }
            if n != 0 && (!is_permutation(&st.access, space) || reach(&st.access, space).0 != 0) {
                return Err(KernelVerifyError::StoreCoverage {
                    kernel: self.kernel(),
                    what,
                    buffer: id.0,
                    offset: st.access.offset,
                    strides: st.access.strides.clone(),
                    space: space.to_vec(),
                });
            }
        }
        Ok(())
    }

    fn elementwise(&self, k: &ElementwiseKernel) -> R {
        let dtypes = self.inputs(&k.inputs, &k.space)?;
        self.body(&k.body, &k.space, &dtypes, &Extra::None)?;
        self.stores(&k.body, &k.stores, &k.space, "store", &mut Vec::new())
    }

    fn multi_tensor(&self, m: &MultiTensorKernel) -> R {
        let mut writer: std::collections::HashMap<BufferId, usize> = std::collections::HashMap::new();
        for (i, part) in m.parts.iter().enumerate() {
            self.elementwise(part)?;
            for s in &part.stores {
                if let Some(other) = writer.insert(s.access.buffer, i) {
                    return Err(self.part_conflict(i, "writes", s.access.buffer, other));
                }
            }
        }
        for (i, part) in m.parts.iter().enumerate() {
            for a in &part.inputs {
                if let Some(&other) = writer.get(&a.buffer).filter(|&&w| w != i) {
                    return Err(self.part_conflict(i, "reads", a.buffer, other));
                }
            }
        }
        Ok(())
    }

    fn part_conflict(&self, part: usize, what: &'static str, buffer: BufferId, other: usize) -> KernelVerifyError {
        KernelVerifyError::PartConflict {
            kernel: self.at.clone(),
            part,
            what,
            buffer: match self.program.buffers.get(buffer.index()) {
                Some(b) => describe_buffer(buffer, b),
                None => format!("b{}", buffer.0),
            },
            other,
        }
    }

    fn row(&self, k: &RowKernel) -> R {
        let space = k.space();
        let r = k.outer.len();
        let dtypes = self.inputs(&k.inputs, &space)?;
        let extra = Extra::Row {
            stages: &k.stages,
            outer_rank: r,
        };
        self.body(&k.body, &space, &dtypes, &extra)?;
        let mut seen = Vec::new();
        self.stores(&k.body, &k.row_stores, &k.outer, "row store", &mut seen)?;
        self.stores(&k.body, &k.stores, &space, "store", &mut seen)?;
        let varies = varies_from(&k.body, &space, &k.inputs, r);
        for (j, st) in k.row_stores.iter().enumerate() {
            if varies.get(st.value.index()).copied().unwrap_or(true) {
                return Err(KernelVerifyError::RowStoreVaries {
                    kernel: self.kernel(),
                    store: j,
                    value: st.value,
                });
            }
        }
        Ok(())
    }

    fn matmul(&self, mm: &MatMulKernel) -> R {
        let dims = |x: usize, y: usize| mm.batch.iter().copied().chain([x, y]).collect::<Vec<usize>>();
        let (a_dims, b_dims) = (dims(mm.m, mm.k), dims(mm.k, mm.n));
        let a = self.read(&mm.a, &a_dims, "operand a")?;
        let b_dtype = match &mm.quant {
            None => self.read(&mm.b, &b_dims, "operand b")?.ty.dtype,
            Some(q) => self.quant_b(mm, q)?,
        };
        let a_ty = TensorType::new(a.ty.dtype, a_dims);
        let b_ty = TensorType::new(b_dtype, b_dims);
        let acc = infer_type(&Op::MatMul, &[&a_ty, &b_ty]).map_err(|message| KernelVerifyError::MatMulShape {
            kernel: self.kernel(),
            message,
        })?;
        let space = mm.space();
        let dtypes = self.inputs(&mm.inputs, &space)?;
        self.body(&mm.body, &space, &dtypes, &Extra::Acc(acc.dtype))?;
        let mut seen = Vec::new();
        self.stores(&mm.body, &mm.stores, &space, "store", &mut seen)?;
        match &mm.bias_grad {
            Some(g) => self.bias_grad(mm, g, a.ty.dtype, &mut seen),
            None => Ok(()),
        }
    }

    /// A convolution kernel: `x` and `w` read in bounds over their dims, the
    /// convolution well-typed, then the epilogue as a matmul's over the output space.
    fn conv(&self, c: &crate::kernel::ConvKernel) -> R {
        let x = self.read(&c.x, &c.x_dims, "data")?;
        let w = self.read(&c.w, &c.w_dims, "weights")?;
        let (x_ty, w_ty) = (
            TensorType::new(x.ty.dtype, c.x_dims.clone()),
            TensorType::new(w.ty.dtype, c.w_dims.clone()),
        );
        let acc = infer_type(&c.op(), &[&x_ty, &w_ty]).map_err(|message| KernelVerifyError::MatMulShape {
            kernel: self.kernel(),
            message,
        })?;
        let space = acc.shape.dims().to_vec();
        let dtypes = self.inputs(&c.inputs, &space)?;
        self.body(&c.body, &space, &dtypes, &Extra::Acc(acc.dtype))?;
        self.stores(&c.body, &c.stores, &space, "store", &mut Vec::new())
    }

    /// A bias gradient (see [`crate::kernel::BiasGrad`]): a float operand, no batch,
    /// not quantized, stored whole in the operand's type by a rank-1 access over the
    /// bias length, to a buffer no other store writes.
    fn bias_grad(&self, mm: &MatMulKernel, g: &crate::kernel::BiasGrad, dtype: DType, seen: &mut Vec<BufferId>) -> R {
        let err = |message: String| KernelVerifyError::MatMulShape {
            kernel: self.kernel(),
            message,
        };
        if mm.quant.is_some() {
            return Err(err("a bias gradient beside a quantized operand".into()));
        }
        if mm.batch.iter().any(|&d| d != 1) {
            return Err(err(format!(
                "a bias gradient of a batched product (batch {:?})",
                mm.batch
            )));
        }
        if !dtype.is_float() {
            return Err(err(format!("a bias gradient of a {dtype} operand")));
        }
        // The sum is a value of the operand's type, stored like any other store.
        let mut body = Body::default();
        let v = body.push(Expr::Index(0), dtype);
        let store = Store {
            value: v,
            access: g.store.clone(),
        };
        self.stores(&body, &[store], &[g.len(mm)], "bias gradient", seen)
    }

    /// A quantized `b` (see [`QuantB`]): the packed data and scales typed and shaped
    /// for `[k, n]`, read exactly as the layout says. Gives the dequantized dtype.
    fn quant_b(&self, mm: &MatMulKernel, q: &QuantB) -> Result<DType, KernelVerifyError> {
        let err = |message: String| KernelVerifyError::MatMulShape {
            kernel: self.kernel(),
            message,
        };
        let data = self.buffer(mm.b.buffer, "operand b")?;
        let scales = self.buffer(q.scales, "scales")?;
        let (packed, dtype) = match q.bits {
            8 => (mm.k, DType::I8),
            4 if mm.k.is_multiple_of(2) => (mm.k / 2, DType::U8),
            _ => return Err(err(format!("quantized b of {} bits over k {}", q.bits, mm.k))),
        };
        if data.ty.dtype != dtype || data.ty.shape.dims() != [mm.n, packed] {
            return Err(err(format!(
                "quantized b at {} bits needs {dtype} [{}, {packed}] data, got {}",
                q.bits, mm.n, data.ty
            )));
        }
        let groups = mm.k.div_ceil(q.group.max(1));
        if q.group == 0 || !scales.ty.dtype.is_float() || scales.ty.shape.dims() != [mm.n, groups] {
            return Err(err(format!(
                "quantized b in groups of {} needs float scales [{}, {groups}], got {}",
                q.group, mm.n, scales.ty
            )));
        }
        let nb = mm.batch.len();
        let want: Vec<i64> = std::iter::repeat_n(0, nb).chain([1, mm.k as i64]).collect();
        if mm.b.offset != 0 || mm.b.strides != want {
            return Err(err(format!(
                "quantized b must be read as [k, n] with strides {want:?} from offset 0, got {:?} from {}",
                mm.b.strides, mm.b.offset
            )));
        }
        Ok(scales.ty.dtype)
    }

    fn op(&self, k: &OpKernel) -> R {
        for (n, (acc, ty)) in k.inputs.iter().enumerate() {
            let what = format!("input {n}");
            let buf = self.buffer(acc.buffer, &what)?;
            if buf.ty.dtype != ty.dtype {
                return Err(KernelVerifyError::OpOperandType {
                    kernel: self.kernel(),
                    input: n,
                    declared: ty.clone(),
                    buffer: describe_buffer(acc.buffer, buf),
                    ty: buf.ty.clone(),
                });
            }
            self.read(acc, ty.shape.dims(), &what)?;
        }
        let tys: Vec<&TensorType> = k.inputs.iter().map(|(_, t)| t).collect();
        self.op_output(&k.op, &tys, k.output, "output")?;
        let mut written = vec![k.output];
        for (n, sib) in k.siblings.iter().enumerate() {
            let what = format!("sibling {n} ({})", sib.op.name());
            let tys = sib
                .inputs
                .iter()
                .map(|&i| tys.get(i).copied())
                .collect::<Option<Vec<&TensorType>>>()
                .ok_or_else(|| KernelVerifyError::OpType {
                    kernel: self.kernel(),
                    op: sib.op.name().to_string(),
                    message: format!("{what} reads operands {:?} of {}", sib.inputs, k.inputs.len()),
                })?;
            if written.contains(&sib.output) {
                let buf = self.buffer(sib.output, &what)?;
                return Err(KernelVerifyError::StoredTwice {
                    kernel: self.kernel(),
                    what,
                    buffer: describe_buffer(sib.output, buf),
                });
            }
            self.op_output(&sib.op, &tys, sib.output, &what)?;
            written.push(sib.output);
        }
        Ok(())
    }

    /// `op` of operands `tys` gives the type of `output`, a temp.
    fn op_output(&self, op: &graphc_ir::Op, tys: &[&TensorType], output: BufferId, what: &str) -> R {
        let out = self.buffer(output, what)?;
        if out.kind != BufferKind::Temp {
            return Err(KernelVerifyError::StoreNotTemp {
                kernel: self.kernel(),
                what: what.into(),
                buffer: describe_buffer(output, out),
            });
        }
        let ty = infer_type(op, tys).map_err(|message| KernelVerifyError::OpType {
            kernel: self.kernel(),
            op: op.name().to_string(),
            message,
        })?;
        if ty != out.ty {
            return Err(KernelVerifyError::OpOutput {
                kernel: self.kernel(),
                op: op.name().to_string(),
                ty,
                buffer: describe_buffer(output, out),
                out: out.ty.clone(),
            });
        }
        Ok(())
    }

    /// The body over `space` (see the module doc); `inputs` are the inputs' dtypes.
    fn body(&self, body: &Body, space: &[usize], inputs: &[DType], extra: &Extra) -> R {
        let exprs = &body.exprs;
        let stages = match extra {
            Extra::Row { stages, .. } => *stages,
            _ => &[],
        };
        // The greatest stage each expression depends on.
        let mut max_stage: Vec<Option<u32>> = Vec::with_capacity(exprs.len());
        for (i, (e, dt)) in exprs.iter().enumerate() {
            let expr = || ExprAt {
                id: ExprId(i as u32),
                name: expr_name(e),
            };
            let ops = e.operands();
            if let Some(&o) = ops.iter().find(|o| o.index() >= i) {
                return Err(KernelVerifyError::OperandOrder {
                    kernel: self.kernel(),
                    expr: expr(),
                    operand: o,
                });
            }
            let mut dep = ops.iter().filter_map(|&o| max_stage[o.index()]).max();
            let computed = self.expr_type(body, i, space, inputs, extra, &expr)?;
            if let Expr::Stage(n) = e {
                dep = dep.max(Some(n.0));
            }
            if computed != *dt {
                return Err(KernelVerifyError::DeclaredType {
                    kernel: self.kernel(),
                    expr: expr(),
                    declared: *dt,
                    computed,
                });
            }
            max_stage.push(dep);
        }
        for (n, stage) in stages.iter().enumerate() {
            let v = stage.value.index();
            let Some((_, vt)) = exprs.get(v) else {
                return Err(KernelVerifyError::MissingStageValue {
                    kernel: self.kernel(),
                    stage: n,
                    value: stage.value,
                    count: exprs.len(),
                });
            };
            if let Some(m) = max_stage[v].filter(|&m| m as usize >= n) {
                return Err(KernelVerifyError::StageOrder {
                    kernel: self.kernel(),
                    stage: n,
                    value: stage.value,
                    uses: m,
                });
            }
            if let Extra::Row { outer_rank, .. } = extra {
                let t = TensorType::new(*vt, space.to_vec());
                infer_type(&stage_op(stage.op, *outer_rank, space.len()), &[&t]).map_err(|message| {
                    KernelVerifyError::StageType {
                        kernel: self.kernel(),
                        stage: n,
                        message,
                    }
                })?;
            }
        }
        Ok(())
    }

    /// The dtype expression `i` computes (its operands precede it).
    fn expr_type(
        &self,
        body: &Body,
        i: usize,
        space: &[usize],
        inputs: &[DType],
        extra: &Extra,
        expr: &dyn Fn() -> ExprAt,
    ) -> R<DType> {
        let exprs = &body.exprs;
        let (e, dt) = &exprs[i];
        let ty = |id: ExprId| TensorType::new(exprs[id.index()].1, space.to_vec());
        let infer = |op: &Op, args: &[ExprId]| -> R<DType> {
            let tys: Vec<TensorType> = args.iter().map(|&a| ty(a)).collect();
            let refs: Vec<&TensorType> = tys.iter().collect();
            infer_type(op, &refs)
                .map(|t| t.dtype)
                .map_err(|message| KernelVerifyError::ExprType {
                    kernel: self.kernel(),
                    expr: expr(),
                    message,
                })
        };
        let input = |n: u32| {
            inputs
                .get(n as usize)
                .copied()
                .ok_or_else(|| KernelVerifyError::MissingInput {
                    kernel: self.kernel(),
                    expr: expr(),
                    inputs: inputs.len(),
                })
        };
        let not_allowed = |what, kind| KernelVerifyError::NotAllowed {
            kernel: self.kernel(),
            expr: expr(),
            what,
            kind,
        };
        Ok(match e {
            Expr::Load(n) => input(n.0)?,
            Expr::Gather { input: n, index, .. } => {
                let d = exprs[index.index()].1;
                if !matches!(d, DType::I64 | DType::I32) {
                    return Err(KernelVerifyError::GatherIndex {
                        kernel: self.kernel(),
                        expr: expr(),
                        index: *index,
                        dtype: d,
                    });
                }
                input(n.0)?
            }
            Expr::Const(t) => {
                if t.shape().rank() != 0 {
                    return Err(KernelVerifyError::NotScalar {
                        kernel: self.kernel(),
                        expr: expr(),
                        ty: t.ty(),
                    });
                }
                t.dtype()
            }
            Expr::Index(a) => infer(
                &Op::Iota {
                    ty: TensorType::new(*dt, space.to_vec()),
                    axis: *a as usize,
                },
                &[],
            )?,
            Expr::Unary(u, a) => infer(&Op::Unary(*u), &[*a])?,
            Expr::Binary(b, x, y) => infer(&Op::Binary(*b), &[*x, *y])?,
            Expr::Select(c, x, y) => infer(&Op::Select, &[*c, *x, *y])?,
            Expr::Cast(a) => infer(&Op::Cast { to: *dt }, &[*a])?,
            Expr::Stage(n) => {
                let Extra::Row { stages, outer_rank } = extra else {
                    return Err(not_allowed("stages", "row"));
                };
                let stage = stages.get(n.index()).ok_or_else(|| KernelVerifyError::MissingStage {
                    kernel: self.kernel(),
                    expr: expr(),
                    stages: stages.len(),
                })?;
                if stage.value.index() >= i {
                    return Err(KernelVerifyError::StageValueOrder {
                        kernel: self.kernel(),
                        expr: expr(),
                        value: stage.value,
                    });
                }
                infer(&stage_op(stage.op, *outer_rank, space.len()), &[stage.value])?
            }
            Expr::Acc => match extra {
                Extra::Acc(d) => *d,
                _ => return Err(not_allowed("products", "matmul")),
            },
        })
    }
}
