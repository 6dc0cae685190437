//! The launch list run on the CPU: the check of the plan-to-launch translation on
//! machines without a GPU.
//!
//! Device memory is four byte vectors (the regions of a [`LaunchPlan`]); weights and
//! inputs are uploaded at the layout's offsets, exactly as the session uploads them.
//! Each launch then does what the GPU would do with the same arguments:
//!
//! - a [`GemmLaunch`] computes `cublasLtMatmul`'s definition (column-major, `op(A)`
//!   by the transpose flags, leading dimensions, batch strides, alpha, beta, bias and
//!   the ReLU / tanh-GELU epilogue) from the bytes at its matrices' addresses;
//! - a [`KernelLaunch`] runs the kernel-IR kernel its CUDA C was generated from (for a
//!   matmul, the generated epilogue alone: [`codegen::matmul_split`]) with each
//!   parameter decoded from the address its argument gives, and stores encoded at the
//!   addresses of its output arguments.
//!
//! So a wrong offset, a swapped transpose flag, a wrong leading dimension or batch
//! stride, or a launch that reads scratch the GEMM did not write gives wrong numbers
//! here. What the emulator cannot check is the CUDA C itself (that is for the GPU check
//! in `bench/`). It also rejects a launch whose output overlaps one of its inputs other
//! than exactly (an in-place pair).

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::codegen::{self, GemmEpilogue, ParamAccess, ParamTarget, SCRATCH_BUFFER};
use graphc_compiler::kernel::{
    Access, Body, Buffer, BufferId, BufferKind, ElementwiseKernel, Expr, InputId, KernelKind, Program, Store,
};
use graphc_ir::{DType, Shape, Tensor, TensorData, TensorType};

use super::launch::{matrix_span, DevAddr, GemmLaunch, KernelLaunch, Launch, LaunchPlan, LtMatrix, Region};
use crate::kernels::{bind, encode, exec_kernel, kernel_error, KernelError};

/// The byte every region holds before anything writes it (NaN in every float type).
const POISON: u8 = 0xFF;

/// Run `plan`'s launches for `program` on the CPU; returns the named outputs in order.
pub fn emulate(
    program: &Program,
    plan: &LaunchPlan,
    weights: &BTreeMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let mut mem = load_memory(program, plan, weights, inputs)?;
    let emu = EmuProgram::new(program)?;
    for launch in &plan.launches {
        match launch {
            Launch::Gemm(g) => gemm(&mut mem, g).map_err(|m| kernel_error(program, g.step, m))?,
            Launch::Kernel(k) => kernel(&mut mem, &emu, k)?,
        }
    }

    read_outputs(&mem, &plan.layout)
}

/// Device memory for `plan` with the weights and inputs uploaded where the layout puts
/// them, everything else [`POISON`].
pub(super) fn load_memory(
    program: &Program,
    plan: &LaunchPlan,
    weights: &BTreeMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<Memory, KernelError> {
    let slots = bind(program, weights, inputs)?;
    let layout = &plan.layout;
    let mut mem = Memory::new(layout)?;
    for u in &layout.uploads {
        let t = slots
            .get(u.buffer as usize)
            .and_then(|s| s.as_deref())
            .ok_or_else(|| KernelError::Program(format!("upload of b{} has no value", u.buffer)))?;
        mem.write(DevAddr::new(Region::Weights, u.offset), t.data())?;
    }
    for x in &layout.inputs {
        let t = slots
            .get(x.buffer as usize)
            .and_then(|s| s.as_deref())
            .ok_or_else(|| KernelError::MissingInput(x.name.clone()))?;
        mem.write(x.addr, t.data())?;
    }

    Ok(mem)
}

/// The graph outputs, read where the layout puts them.
pub(super) fn read_outputs(
    mem: &Memory,
    layout: &super::launch::DeviceLayout,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let mut out = Vec::with_capacity(layout.outputs.len());
    for o in &layout.outputs {
        let t = mem.read(o.addr, &o.ty).map_err(|m| KernelError::Output {
            name: o.name.clone(),
            message: m,
        })?;
        out.push((o.name.clone(), t));
    }
    Ok(out)
}

/// The program whose kernels the launches run: matmul kernels replaced by their
/// generated epilogues, each reading its GEMM's scratch through a buffer of its own.
struct EmuProgram {
    program: Program,
    /// The scratch buffer of each step that has one.
    scratch: Vec<Option<BufferId>>,
}

impl EmuProgram {
    fn new(program: &Program) -> Result<EmuProgram, KernelError> {
        let mut p = program.clone();
        let mut scratch = vec![None; p.kernels.len()];
        for (k, slot) in scratch.iter_mut().enumerate() {
            let split = codegen::matmul_split(program, k).map_err(|e| kernel_error(program, k, e.to_string()))?;
            let Some(split) = split else { continue };
            let Some(KernelKind::Elementwise(ElementwiseKernel {
                space,
                inputs,
                body,
                stores,
            })) = split.epilogue
            else {
                continue;
            };
            let id = BufferId(p.buffers.len() as u32);
            let uses_scratch = inputs.iter().any(|a| a.buffer == SCRATCH_BUFFER);
            if uses_scratch {
                p.buffers.push(Buffer {
                    ty: TensorType::new(split.gemm.d_dtype, Shape::new(space.clone())),
                    kind: BufferKind::Temp,
                    name: Some(format!("gemm scratch of step {k}")),
                });
                *slot = Some(id);
            }
            let remap = |a: Access| Access {
                buffer: if a.buffer == SCRATCH_BUFFER { id } else { a.buffer },
                ..a
            };
            let (body, inputs) = prune_dead(body, inputs, &stores);
            p.kernels[k].kind = KernelKind::Elementwise(ElementwiseKernel {
                space,
                inputs: inputs.into_iter().map(remap).collect(),
                body,
                stores: stores
                    .into_iter()
                    .map(|s| Store {
                        value: s.value,
                        access: remap(s.access),
                    })
                    .collect(),
            });
        }
        Ok(EmuProgram { program: p, scratch })
    }
}

/// Drop what a generated epilogue does not compute: expressions no store uses (the
/// native part of the chain, done by cuBLASLt) become constants, and inputs no live
/// expression loads are removed (the CUDA C has no parameter for them).
fn prune_dead(mut body: Body, inputs: Vec<Access>, stores: &[Store]) -> (Body, Vec<Access>) {
    let n = body.exprs.len();
    let mut live = vec![false; n];
    for s in stores {
        if let Some(l) = live.get_mut(s.value.index()) {
            *l = true;
        }
    }
    for i in (0..n).rev() {
        if live[i] {
            for o in body.exprs[i].0.operands() {
                live[o.index()] = true;
            }
        }
    }
    let mut used = vec![false; inputs.len()];
    for (i, (e, dt)) in body.exprs.iter_mut().enumerate() {
        if !live[i] {
            *e = Expr::Const(Tensor::scalar(*dt, 0.0));
            continue;
        }
        match e {
            Expr::Load(x) | Expr::Gather { input: x, .. } => used[x.index()] = true,
            _ => {}
        }
    }
    let mut new_index = vec![0u32; inputs.len()];
    let mut kept = Vec::new();
    for (i, a) in inputs.into_iter().enumerate() {
        if used[i] {
            new_index[i] = kept.len() as u32;
            kept.push(a);
        }
    }
    for (e, _) in body.exprs.iter_mut() {
        match e {
            Expr::Load(x) | Expr::Gather { input: x, .. } => *x = InputId(new_index[x.index()]),
            _ => {}
        }
    }
    (body, kept)
}

/// A launch's outputs may share bytes with its inputs only exactly (an in-place pair).
pub(super) fn check_overlaps(k: &KernelLaunch) -> Result<(), String> {
    // Outputs may share bytes with inputs only exactly (in place).
    for (i, (pi, ai)) in k.params.iter().zip(&k.args).enumerate() {
        if pi.access != ParamAccess::Write {
            continue;
        }
        for (j, (pj, aj)) in k.params.iter().zip(&k.args).enumerate() {
            if i == j || ai.region != aj.region {
                continue;
            }
            let (a0, a1) = (ai.offset, ai.offset + k.arg_bytes[i]);
            let (b0, b1) = (aj.offset, aj.offset + k.arg_bytes[j]);
            let exact = a0 == b0 && a1 == b1 && pj.access == ParamAccess::Read;
            if a0 < b1 && b0 < a1 && !exact {
                return Err(format!(
                    "output argument {i} ({ai}, {} bytes) overlaps argument {j} ({aj}, {} bytes)",
                    k.arg_bytes[i], k.arg_bytes[j]
                ));
            }
        }
    }
    Ok(())
}

fn kernel(mem: &mut Memory, emu: &EmuProgram, k: &KernelLaunch) -> Result<(), KernelError> {
    let program = &emu.program;
    let err = |m: String| kernel_error(program, k.step, m);
    if k.args.len() != k.params.len() || k.arg_bytes.len() != k.params.len() {
        return Err(err(format!(
            "{} arguments for {} parameters",
            k.args.len(),
            k.params.len()
        )));
    }
    if k.grid == 0 || k.block == 0 {
        return Err(err(format!("launch of {} x {} threads", k.grid, k.block)));
    }
    check_overlaps(k).map_err(err)?;
    let buffer_of = |t: ParamTarget| -> Result<BufferId, KernelError> {
        match t {
            ParamTarget::Buffer(b) => Ok(b),
            ParamTarget::GemmScratch => emu.scratch[k.step]
                .ok_or_else(|| err("a scratch parameter, but the step's GEMM writes no scratch".into())),
        }
    };
    let mut local: Vec<(BufferId, Tensor)> = Vec::new();
    for (p, &a) in k.params.iter().zip(&k.args) {
        if p.access != ParamAccess::Read {
            continue;
        }
        let id = buffer_of(p.target)?;
        let buf = program
            .buffers
            .get(id.index())
            .ok_or_else(|| err(format!("parameter buffer b{} does not exist", id.0)))?;
        if buf.ty.dtype != p.dtype {
            return Err(err(format!(
                "parameter for b{} is {} but the buffer is {}",
                id.0, p.dtype, buf.ty.dtype
            )));
        }
        let t = mem.read(a, &buf.ty).map_err(&err)?;
        local.push((id, t));
    }
    let writes = exec_kernel(program, k.step, &|id| {
        local.iter().find(|(b, _)| *b == id).map(|(_, t)| t)
    })?;
    for (id, t) in writes {
        let pos = k
            .params
            .iter()
            .position(|p| p.access == ParamAccess::Write && buffer_of(p.target).ok() == Some(id))
            .ok_or_else(|| err(format!("the kernel writes b{}, which is none of its parameters", id.0)))?;
        mem.write(k.args[pos], t.data()).map_err(|e| err(e.to_string()))?;
    }
    Ok(())
}

/// `cublasLtMatmul` by its definition, accumulating in f64 and rounding `D` through f32
/// (f32 compute) or f64.
pub(super) fn gemm(mem: &mut Memory, g: &GemmLaunch) -> Result<(), String> {
    let lt = &g.lt;
    let dt = lt.dtype;
    let elem = dt.size_bytes() as u64;
    let load = |mem: &Memory, x: &LtMatrix, what: &str| -> Result<Vec<f64>, String> {
        let (lo, hi) =
            matrix_span(x, lt.batch, elem).ok_or_else(|| format!("GEMM matrix {what}: negative stride or overflow"))?;
        let bytes = mem.bytes(DevAddr::new(x.addr.region, lo), hi - lo)?;
        decode_f64(dt, bytes).ok_or_else(|| format!("GEMM matrix {what}: cannot decode {dt}"))
    };
    let a = load(mem, &lt.a, "A")?;
    let b = load(mem, &lt.b, "B")?;
    let c = match &lt.c {
        Some(c) => Some(load(mem, c, "C")?),
        None => None,
    };
    let aux = match &lt.aux {
        Some(x) => Some(load(mem, x, "aux")?),
        None => None,
    };
    let bias = match lt.bias {
        Some(_) if lt.epilogue.writes_bias() => None,
        Some(addr) => {
            Some(decode_f64(dt, mem.bytes(addr, lt.m * elem)?).ok_or_else(|| "GEMM bias: cannot decode".to_string())?)
        }
        None => None,
    };
    let (m, n, k) = (lt.m as usize, lt.n as usize, lt.k as usize);
    let (lda, ldb) = (lt.a.ld as usize, lt.b.ld as usize);
    let (sa, sb) = (lt.a.batch_stride as usize, lt.b.batch_stride as usize);
    let mut d = vec![0f64; 0];
    let (dld, dbs) = (lt.d.ld as usize, lt.d.batch_stride as usize);
    let (d_lo, d_hi) = matrix_span(&lt.d, lt.batch, elem).ok_or_else(|| "GEMM matrix D: overflow".to_string())?;
    d.resize(((d_hi - d_lo) / elem) as usize, f64::NAN);
    // Keep what D's span holds between its elements (ld > rows).
    if let Some(old) = decode_f64(dt, mem.bytes(DevAddr::new(lt.d.addr.region, d_lo), d_hi - d_lo)?) {
        d = old;
    }
    let f32_compute = dt != DType::F64;
    for bi in 0..lt.batch as usize {
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0f64;
                for p in 0..k {
                    let ai = bi * sa + if lt.transa { p + i * lda } else { i + p * lda };
                    let bj = bi * sb + if lt.transb { j + p * ldb } else { p + j * ldb };
                    acc += a[ai] * b[bj];
                }
                let mut v = lt.alpha * acc;
                if let (Some(c), Some(cm)) = (&c, &lt.c) {
                    v += lt.beta * c[bi * cm.batch_stride as usize + i + j * cm.ld as usize];
                }
                if let Some(bias) = &bias {
                    v += bias[i];
                }
                if f32_compute {
                    v = v as f32 as f64;
                }
                v = match lt.epilogue {
                    GemmEpilogue::Relu | GemmEpilogue::BiasRelu => {
                        if v > 0.0 || v.is_nan() {
                            v
                        } else {
                            0.0
                        }
                    }
                    GemmEpilogue::Gelu | GemmEpilogue::BiasGelu => {
                        let x = v as f32;
                        (0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())) as f64
                    }
                    GemmEpilogue::DGelu => {
                        let (Some(x), Some(xm)) = (&aux, &lt.aux) else {
                            return Err("DGELU without its aux matrix".to_string());
                        };
                        let x = x[bi * xm.batch_stride as usize + i + j * xm.ld as usize] as f32;
                        (v as f32 * graphc_ir::interp::gelu_tanh_derivative_f32(x)) as f64
                    }
                    GemmEpilogue::None | GemmEpilogue::Bias | GemmEpilogue::BGradA | GemmEpilogue::BGradB => v,
                };
                d[bi * dbs + i + j * dld] = v;
            }
        }
    }
    let data = encode_f64(dt, &d).ok_or_else(|| format!("GEMM output: cannot encode {dt}"))?;
    mem.write(DevAddr::new(lt.d.addr.region, d_lo), &data)
        .map_err(|e| e.to_string())?;
    // BGRADA / BGRADB: op(A) summed over k (m values) or op(B) over k (n values), in
    // f32 (the compute type), rounded to the bias type (D's).
    if let (Some(addr), true) = (lt.bias, lt.epilogue.writes_bias()) {
        let a_side = lt.epilogue == GemmEpilogue::BGradA;
        let len = if a_side { m } else { n };
        let mut sums = vec![0f64; len];
        for (x, s) in sums.iter_mut().enumerate() {
            let mut acc = 0f32;
            for p in 0..k {
                acc += if a_side {
                    a[if lt.transa { p + x * lda } else { x + p * lda }] as f32
                } else {
                    b[if lt.transb { x + p * ldb } else { p + x * ldb }] as f32
                };
            }
            *s = acc as f64;
        }
        let data = encode_f64(dt, &sums).ok_or_else(|| format!("GEMM bias gradient: cannot encode {dt}"))?;
        mem.write(addr, &data).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn decode_f64(dt: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    let n = bytes.len() / dt.size_bytes();
    Some(match TensorData::from_le_bytes(dt, bytes, n)? {
        TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
        TensorData::F64(v) => v,
        TensorData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        TensorData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        _ => return None,
    })
}

fn encode_f64(dt: DType, v: &[f64]) -> Option<TensorData> {
    Some(match dt {
        DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
        DType::F64 => TensorData::F64(v.to_vec()),
        DType::F16 => TensorData::F16(v.iter().map(|&x| half::f16::from_f32(x as f32)).collect()),
        DType::BF16 => TensorData::BF16(v.iter().map(|&x| half::bf16::from_f32(x as f32)).collect()),
        _ => return None,
    })
}

/// The four regions, as bytes.
pub(super) struct Memory {
    regions: [Vec<u8>; 4],
}

impl Memory {
    fn new(layout: &super::launch::DeviceLayout) -> Result<Memory, KernelError> {
        let alloc = |r: Region| -> Result<Vec<u8>, KernelError> {
            let bytes = layout.region_bytes(r);
            let fail =
                |why: String| KernelError::Plan(format!("cannot allocate the {bytes}-byte {} region: {why}", r.name()));
            let len = usize::try_from(bytes).map_err(|_| fail("too large".into()))?;
            let mut v = Vec::new();
            v.try_reserve_exact(len).map_err(|e| fail(e.to_string()))?;
            v.resize(len, POISON);
            Ok(v)
        };
        Ok(Memory {
            regions: [
                alloc(Region::Arena)?,
                alloc(Region::Weights)?,
                alloc(Region::Io)?,
                alloc(Region::Workspace)?,
            ],
        })
    }

    fn region(&self, r: Region) -> &Vec<u8> {
        &self.regions[r as usize]
    }

    pub(super) fn bytes(&self, at: DevAddr, len: u64) -> Result<&[u8], String> {
        let reg = self.region(at.region);
        let lo = usize::try_from(at.offset).map_err(|_| format!("address {at} out of range"))?;
        let hi = lo
            .checked_add(len as usize)
            .filter(|&h| h <= reg.len())
            .ok_or_else(|| {
                format!(
                    "{len} bytes at {at} lie outside the {}-byte {} region",
                    reg.len(),
                    at.region.name()
                )
            })?;
        Ok(&reg[lo..hi])
    }

    pub(super) fn read(&self, at: DevAddr, ty: &TensorType) -> Result<Tensor, String> {
        let n = ty.numel();
        let bytes = self.bytes(at, (n * ty.dtype.size_bytes()) as u64)?;
        TensorData::from_le_bytes(ty.dtype, bytes, n)
            .and_then(|d| Tensor::new(ty.shape.clone(), d).ok())
            .ok_or_else(|| format!("cannot decode {ty} at {at}"))
    }

    pub(super) fn write_bytes(&mut self, at: DevAddr, bytes: &[u8]) -> Result<(), KernelError> {
        let reg = &mut self.regions[at.region as usize];
        let lo = at.offset as usize;
        match lo.checked_add(bytes.len()).filter(|&h| h <= reg.len()) {
            Some(hi) => {
                reg[lo..hi].copy_from_slice(bytes);
                Ok(())
            }
            None => Err(KernelError::Plan(format!(
                "a write of {} bytes at {at} lies outside the {}-byte {} region",
                bytes.len(),
                reg.len(),
                at.region.name()
            ))),
        }
    }

    /// Every byte of region `r` set to the poison byte again (a kept memory's arena
    /// before each run: nothing a kernel reads there comes from an earlier run).
    pub(super) fn poison(&mut self, r: Region) {
        self.regions[r as usize].fill(POISON);
    }

    pub(super) fn write(&mut self, at: DevAddr, data: &TensorData) -> Result<(), KernelError> {
        let len = data.len() * data.dtype().size_bytes();
        let reg = &mut self.regions[at.region as usize];
        let lo = at.offset as usize;
        if lo.checked_add(len).is_none_or(|h| h > reg.len()) {
            return Err(KernelError::Plan(format!(
                "a write of {len} bytes at {at} lies outside the {}-byte {} region",
                reg.len(),
                at.region.name()
            )));
        }
        encode(data, &mut reg[lo..lo + len]);
        Ok(())
    }
}
