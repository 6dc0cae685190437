//! Kernel bodies: static checks (operands, dtypes, which expressions a kernel kind
//! allows) and evaluation of the expressions a kernel needs, each as a whole tensor over
//! the iteration space, through the interpreter's `eval_op`.

use graphc_compiler::kernel::{Access, Body, BufferId, Expr, ExprId, Stage, Store};
use graphc_ir::interp::eval_op;
use graphc_ir::{infer_type, DType, Op, ReduceOp, Shape, Tensor, TensorType};

use super::access::{check_read, check_store, gather, scatter};
use super::{describe, Ctx};

/// What a body may use besides loads, constants, indices and elementwise ops.
pub(crate) enum Extra<'a> {
    /// Elementwise kernels: nothing.
    None,
    /// Row kernels: stages reducing over the space's dims from `outer_rank` on.
    Row { stages: &'a [Stage], outer_rank: usize },
    /// Matmul kernels: the product, of this dtype.
    Acc(DType),
}

impl Extra<'_> {
    fn stages(&self) -> &[Stage] {
        match self {
            Extra::Row { stages, .. } => stages,
            _ => &[],
        }
    }
}

/// The reduction a row kernel's stage computes over a full space of rank `rank`.
pub(crate) fn stage_op(op: ReduceOp, outer_rank: usize, rank: usize) -> Op {
    Op::Reduce {
        op,
        axes: (outer_rank..rank).collect(),
        keepdims: true,
    }
}

fn expr_name(e: &Expr) -> String {
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

/// Operands of an expression (stage and acc references excluded).
fn operands(e: &Expr) -> Vec<ExprId> {
    e.operands()
}

/// Check `body` over `space`: every operand precedes its user, loads name kernel inputs
/// (of dtypes `inputs`), constants are scalars, every expression's declared dtype is the
/// one its op gives, stages and the product only where `extra` allows them, and each
/// stage uses earlier stages only.
pub(crate) fn validate(body: &Body, space: &[usize], inputs: &[DType], extra: &Extra) -> Result<(), String> {
    let exprs = &body.exprs;
    let stages = extra.stages();
    // The greatest stage each expression depends on.
    let mut max_stage: Vec<Option<u32>> = Vec::with_capacity(exprs.len());
    for (i, (e, dt)) in exprs.iter().enumerate() {
        let at = || format!("e{i} ({})", expr_name(e));
        let ops = operands(e);
        for &o in &ops {
            if o.index() >= i {
                return Err(format!("{}: operand e{o} does not precede it", at()));
            }
        }
        let ty = |id: ExprId| TensorType::new(exprs[id.index()].1, space.to_vec());
        let infer = |op: &Op, args: &[ExprId]| -> Result<DType, String> {
            let tys: Vec<TensorType> = args.iter().map(|&a| ty(a)).collect();
            let refs: Vec<&TensorType> = tys.iter().collect();
            infer_type(op, &refs)
                .map(|t| t.dtype)
                .map_err(|m| format!("{}: {m}", at()))
        };
        let mut dep = ops.iter().filter_map(|&o| max_stage[o.index()]).max();
        let expected = match e {
            Expr::Load(n) => *inputs
                .get(*n as usize)
                .ok_or_else(|| format!("{}: the kernel has {} inputs", at(), inputs.len()))?,
            Expr::Gather { input, index, .. } => {
                if !matches!(exprs[index.index()].1, DType::I64 | DType::I32) {
                    return Err(format!("{}: index e{index} is {}", at(), exprs[index.index()].1));
                }
                *inputs
                    .get(*input as usize)
                    .ok_or_else(|| format!("{}: the kernel has {} inputs", at(), inputs.len()))?
            }
            Expr::Const(t) => {
                if t.shape().rank() != 0 {
                    return Err(format!("{}: constant is {}, not a scalar", at(), t.ty()));
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
                let Extra::Row { outer_rank, .. } = extra else {
                    return Err(format!("{}: stages are only allowed in row kernels", at()));
                };
                let stage = stages
                    .get(*n as usize)
                    .ok_or_else(|| format!("{}: the kernel has {} stages", at(), stages.len()))?;
                if stage.value.index() >= i {
                    return Err(format!(
                        "{}: the stage's value e{} does not precede it",
                        at(),
                        stage.value
                    ));
                }
                dep = dep.max(Some(*n));
                infer(&stage_op(stage.op, *outer_rank, space.len()), &[stage.value])?
            }
            Expr::Acc => match extra {
                Extra::Acc(d) => *d,
                _ => return Err(format!("{}: the product is only allowed in matmul kernels", at())),
            },
        };
        if expected != *dt {
            return Err(format!("{}: declared {dt} but computes {expected}", at()));
        }
        max_stage.push(dep);
    }
    for (n, stage) in stages.iter().enumerate() {
        let v = stage.value.index();
        if v >= exprs.len() {
            return Err(format!(
                "stage {n}: value e{v} does not exist ({} expressions)",
                exprs.len()
            ));
        }
        if let Some(m) = max_stage[v] {
            if m as usize >= n {
                return Err(format!("stage {n}: its value e{v} uses stage {m}, not an earlier one"));
            }
        }
        if let Extra::Row { outer_rank, .. } = extra {
            let t = TensorType::new(exprs[v].1, space.to_vec());
            infer_type(&stage_op(stage.op, *outer_rank, space.len()), &[&t]).map_err(|m| format!("stage {n}: {m}"))?;
        }
    }
    Ok(())
}

/// Which expressions vary along the space's dims from `from` on (row kernels: whether an
/// expression is row-level or per element).
pub(crate) fn varies_from(body: &Body, space: &[usize], inputs: &[Access], from: usize) -> Vec<bool> {
    let mut v: Vec<bool> = Vec::with_capacity(body.exprs.len());
    let moves = |k: usize| space.get(k).is_some_and(|&d| d > 1);
    for (e, _) in &body.exprs {
        let x = match e {
            Expr::Load(n) => inputs.get(*n as usize).is_some_and(|a| {
                a.strides
                    .iter()
                    .enumerate()
                    .any(|(k, &s)| k >= from && s != 0 && moves(k))
            }),
            Expr::Index(a) => *a as usize >= from && moves(*a as usize),
            Expr::Gather { input, index, .. } => {
                v.get(index.index()).copied().unwrap_or(true)
                    || inputs.get(*input as usize).is_some_and(|a| {
                        a.strides
                            .iter()
                            .enumerate()
                            .any(|(k, &s)| k >= from && s != 0 && moves(k))
                    })
            }
            Expr::Const(_) | Expr::Stage(_) | Expr::Acc => false,
            _ => operands(e).iter().any(|&o| v.get(o.index()).copied().unwrap_or(true)),
        };
        v.push(x);
    }
    v
}

/// Check a kernel's inputs over `space` (rank, bounds, and that each is readable now);
/// returns their dtypes.
pub(crate) fn check_inputs(ctx: &Ctx, inputs: &[Access], space: &[usize]) -> Result<Vec<DType>, String> {
    let mut dtypes = Vec::with_capacity(inputs.len());
    for (n, acc) in inputs.iter().enumerate() {
        let buf = ctx.buffer(acc.buffer)?;
        check_read(acc, space, buf, &format!("input {n}"))?;
        ctx.value(acc.buffer)?;
        dtypes.push(buf.ty.dtype);
    }
    Ok(dtypes)
}

/// Check stores over `space`: the value exists and has the buffer's dtype, the buffer is
/// a temp written by no other store of the kernel (`seen`), and the access writes every
/// element of it exactly once.
pub(crate) fn check_stores(
    ctx: &Ctx,
    body: &Body,
    stores: &[Store],
    space: &[usize],
    what: &str,
    seen: &mut Vec<BufferId>,
) -> Result<(), String> {
    for (j, st) in stores.iter().enumerate() {
        let at = format!("{what} {j}");
        let buf = ctx.writable(st.access.buffer)?;
        let (_, dt) = body
            .exprs
            .get(st.value.index())
            .ok_or_else(|| format!("{at}: value e{} does not exist", st.value))?;
        if *dt != buf.ty.dtype {
            return Err(format!(
                "{at}: stores e{} of {dt} into {}, which is {}",
                st.value,
                describe(st.access.buffer, buf),
                buf.ty
            ));
        }
        if seen.contains(&st.access.buffer) {
            return Err(format!(
                "{at}: buffer {} is stored twice",
                describe(st.access.buffer, buf)
            ));
        }
        seen.push(st.access.buffer);
        check_store(&st.access, space, buf, &at)?;
    }
    Ok(())
}

/// Gather kernel input `n` over `space`.
pub(crate) fn load(ctx: &Ctx, inputs: &[Access], n: u32, space: &[usize]) -> Result<Tensor, String> {
    let acc = inputs
        .get(n as usize)
        .ok_or_else(|| format!("load of input {n}, which does not exist"))?;
    gather(ctx.value(acc.buffer)?, acc, space)
}

/// An indexed read of kernel input `n` over `space`.
pub(crate) fn gather_load(
    ctx: &Ctx,
    inputs: &[Access],
    n: u32,
    space: &[usize],
    index: &Tensor,
    stride: i64,
    extent: u64,
) -> Result<Tensor, String> {
    let acc = inputs
        .get(n as usize)
        .ok_or_else(|| format!("gather from input {n}, which does not exist"))?;
    super::access::gather_indexed(ctx.value(acc.buffer)?, acc, space, index, stride, extent)
}

/// How to compute the expressions that are not plain ops: loads, stages, the product.
pub(crate) trait Leaves {
    fn load(&mut self, n: u32) -> Result<Tensor, String>;
    /// An indexed read ([`Expr::Gather`]); by default not allowed.
    fn gather(&mut self, _n: u32, _index: &Tensor, _stride: i64, _extent: u64) -> Result<Tensor, String> {
        Err("gather reads are not supported in this kind of kernel".into())
    }
    /// A stage or the product, given the values computed so far.
    fn special(&mut self, e: &Expr, dtype: DType, values: &[Option<Tensor>]) -> Result<Tensor, String>;
}

/// Evaluate the expressions `roots` need over `space`, each as a whole tensor; values
/// not needed by a root or a later expression are dropped as soon as possible.
/// The body must have been validated.
pub(crate) fn evaluate(
    body: &Body,
    space: &[usize],
    roots: &[ExprId],
    stages: &[Stage],
    leaves: &mut dyn Leaves,
) -> Result<Vec<Option<Tensor>>, String> {
    let n = body.exprs.len();
    // Needed expressions and the last user of each (usize::MAX for roots).
    let mut needed = vec![false; n];
    let mut last_use = vec![0usize; n];
    for &r in roots {
        if let Some(x) = needed.get_mut(r.index()) {
            *x = true;
            last_use[r.index()] = usize::MAX;
        }
    }
    for i in (0..n).rev() {
        if !needed[i] {
            continue;
        }
        let e = &body.exprs[i].0;
        let mut deps = operands(e);
        if let Expr::Stage(s) = e {
            if let Some(st) = stages.get(*s as usize) {
                deps.push(st.value);
            }
        }
        for d in deps {
            if let Some(x) = needed.get_mut(d.index()) {
                *x = true;
                last_use[d.index()] = last_use[d.index()].max(i);
            }
        }
    }

    let mut values: Vec<Option<Tensor>> = vec![None; n];
    for i in 0..n {
        if !needed[i] {
            continue;
        }
        let (e, dt) = &body.exprs[i];
        let ty = TensorType::new(*dt, Shape::new(space));
        let at = |m: String| format!("e{i} ({}): {m}", expr_name(e));
        let arg = |id: ExprId| {
            values
                .get(id.index())
                .and_then(|v| v.as_ref())
                .ok_or_else(|| at(format!("internal error: operand e{id} has no value")))
        };
        let v = match e {
            Expr::Load(k) => leaves.load(*k).map_err(at)?,
            Expr::Const(t) => eval_op(
                &Op::Broadcast {
                    shape: ty.shape.clone(),
                },
                &[t],
                &ty,
            )
            .map_err(at)?,
            Expr::Index(a) => eval_op(
                &Op::Iota {
                    ty: ty.clone(),
                    axis: *a as usize,
                },
                &[],
                &ty,
            )
            .map_err(at)?,
            Expr::Unary(u, a) => eval_op(&Op::Unary(*u), &[arg(*a)?], &ty).map_err(at)?,
            Expr::Binary(b, x, y) => eval_op(&Op::Binary(*b), &[arg(*x)?, arg(*y)?], &ty).map_err(at)?,
            Expr::Select(c, x, y) => eval_op(&Op::Select, &[arg(*c)?, arg(*x)?, arg(*y)?], &ty).map_err(at)?,
            Expr::Cast(a) => eval_op(&Op::Cast { to: *dt }, &[arg(*a)?], &ty).map_err(at)?,
            Expr::Stage(_) | Expr::Acc => leaves.special(e, *dt, &values).map_err(at)?,
            Expr::Gather {
                input,
                index,
                stride,
                extent,
            } => leaves.gather(*input, arg(*index)?, *stride, *extent).map_err(at)?,
        };
        if v.ty() != ty {
            return Err(at(format!("internal error: computed {} for {ty}", v.ty())));
        }
        values[i] = Some(v);
        let mut deps = operands(e);
        if let Expr::Stage(s) = e {
            if let Some(st) = stages.get(*s as usize) {
                deps.push(st.value);
            }
        }
        for d in deps {
            if last_use[d.index()] == i {
                values[d.index()] = None;
            }
        }
    }
    Ok(values)
}

/// Scatter each store's value into its buffer; values used by one store only are moved.
pub(crate) fn write_stores(
    ctx: &Ctx,
    stores: &[Store],
    values: &mut [Option<Tensor>],
    out: &mut Vec<(BufferId, Tensor)>,
) -> Result<(), String> {
    for (j, st) in stores.iter().enumerate() {
        let later = stores[j + 1..].iter().any(|s| s.value == st.value);
        let slot = values
            .get_mut(st.value.index())
            .ok_or_else(|| format!("store {j}: value e{} does not exist", st.value))?;
        let v = if later { slot.clone() } else { slot.take() };
        let v = v.ok_or_else(|| format!("store {j}: internal error: e{} has no value", st.value))?;
        let buf = ctx.writable(st.access.buffer)?;
        out.push((
            st.access.buffer,
            scatter(v, &st.access, &buf.ty).map_err(|m| format!("store {j}: {m}"))?,
        ));
    }
    Ok(())
}
