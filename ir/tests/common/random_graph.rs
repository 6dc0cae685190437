//! A random graph generator for the text-format tests: every op kind, every dtype,
//! names with odd characters, special float values, negative slice steps, dead nodes,
//! several outputs.

#![allow(dead_code)]

use graphc_ir::{
    ArgReduceOp, BinaryOp, DType, Graph, NodeId, Op, PadMode, ReduceOp, Rng, SliceRange, Tensor, TensorData,
    TensorType, UnaryOp,
};
use half::{bf16, f16};

pub const ODD_NAMES: &[&str] = &[
    "x",
    "ln1.weight",
    "a\"b\\c",
    "tab\there",
    "naïve ✓ 名前",
    "\u{1}ctrl\u{7f}",
    "new\nline\r",
    "",
    "%0 = neg",
    "# not a comment",
    "}",
    "emoji 🦀",
    "\\u{41}",
];

pub fn odd_name(rng: &mut Rng) -> String {
    ODD_NAMES[rng.below(ODD_NAMES.len() as u64) as usize].to_string()
}

pub fn rand_dtype(rng: &mut Rng) -> DType {
    DType::ALL[rng.below(9) as usize]
}

pub fn rand_shape(rng: &mut Rng, max_rank: u64) -> Vec<usize> {
    let rank = rng.below(max_rank + 1);
    (0..rank)
        .map(|_| {
            if rng.below(15) == 0 {
                0
            } else {
                1 + rng.below(4) as usize
            }
        })
        .collect()
}

fn special_f64(rng: &mut Rng) -> f64 {
    match rng.below(14) {
        0 => f64::NAN,
        1 => -f64::NAN,
        2 => f64::INFINITY,
        3 => f64::NEG_INFINITY,
        4 => -0.0,
        5 => 0.0,
        6 => 1e-5,
        7 => f64::MAX,
        8 => f64::MIN_POSITIVE / 4.0,
        9 => 0.1,
        _ => rng.normal() * 10f64.powi(rng.below(20) as i32 - 10),
    }
}

/// Random elements of `dtype`, with NaNs (default, negative and other payloads),
/// infinities, -0.0, subnormals and integer extremes.
pub fn rand_data(rng: &mut Rng, dtype: DType, n: usize) -> TensorData {
    let ints = |rng: &mut Rng| match rng.below(5) {
        0 => i64::MIN,
        1 => i64::MAX,
        2 => 0,
        _ => rng.next_u64() as i64,
    };
    match dtype {
        DType::F64 => TensorData::F64(
            (0..n)
                .map(|_| {
                    if rng.below(12) == 0 {
                        f64::from_bits(0x7ff0_0000_0000_0001 | (rng.below(2) << 63))
                    } else {
                        special_f64(rng)
                    }
                })
                .collect(),
        ),
        DType::F32 => TensorData::F32(
            (0..n)
                .map(|_| match rng.below(12) {
                    0 => f32::from_bits(0x7f80_0001 | ((rng.below(2) as u32) << 31)),
                    1 => f32::from_bits(1),
                    _ => special_f64(rng) as f32,
                })
                .collect(),
        ),
        DType::F16 => TensorData::F16(
            (0..n)
                .map(|_| match rng.below(12) {
                    0 => f16::from_bits(0x7c01 | ((rng.below(2) as u16) << 15)),
                    1 => f16::from_bits(1),
                    _ => f16::from_f64(special_f64(rng)),
                })
                .collect(),
        ),
        DType::BF16 => TensorData::BF16(
            (0..n)
                .map(|_| match rng.below(12) {
                    0 => bf16::from_bits(0x7f81 | ((rng.below(2) as u16) << 15)),
                    1 => bf16::from_bits(1),
                    _ => bf16::from_f64(special_f64(rng)),
                })
                .collect(),
        ),
        DType::I64 => TensorData::I64((0..n).map(|_| ints(rng)).collect()),
        DType::I32 => TensorData::I32((0..n).map(|_| ints(rng) as i32).collect()),
        DType::I8 => TensorData::I8((0..n).map(|_| ints(rng) as i8).collect()),
        DType::U8 => TensorData::U8((0..n).map(|_| ints(rng) as u8).collect()),
        DType::Bool => TensorData::Bool((0..n).map(|_| rng.bool()).collect()),
    }
}

pub fn rand_tensor(rng: &mut Rng, dtype: DType, shape: Vec<usize>) -> Tensor {
    let n = shape.iter().product();
    let data = rand_data(rng, dtype, n);
    Tensor::new(shape, data).unwrap()
}

struct Gen {
    rng: Rng,
    g: Graph,
    uniq: usize,
}

impl Gen {
    fn unique_name(&mut self) -> String {
        self.uniq += 1;
        format!("{}{}", odd_name(&mut self.rng), self.uniq)
    }

    fn maybe_name(&mut self) -> Option<String> {
        if self.rng.below(3) == 0 {
            Some(odd_name(&mut self.rng))
        } else {
            None
        }
    }

    fn ty(&self, id: NodeId) -> TensorType {
        self.g.node(id).ty.clone()
    }

    fn pick_where(&mut self, f: impl Fn(&TensorType) -> bool) -> Option<NodeId> {
        let ids: Vec<NodeId> = self.g.ids().filter(|&i| f(&self.g.node(i).ty)).collect();
        if ids.is_empty() {
            None
        } else {
            Some(ids[self.rng.below(ids.len() as u64) as usize])
        }
    }

    fn pick(&mut self) -> NodeId {
        self.pick_where(|_| true).expect("the graph has nodes")
    }

    fn add(&mut self, op: Op, inputs: Vec<NodeId>) -> Option<NodeId> {
        let name = self.maybe_name();
        self.g.add(op, inputs, name).ok()
    }

    /// An input or parameter (`make` builds the op from its binding name and type),
    /// with a node name one time in five.
    fn binding(&mut self, make: fn(String, TensorType) -> Op) -> Option<NodeId> {
        let dtype = rand_dtype(&mut self.rng);
        let ty = TensorType::new(dtype, rand_shape(&mut self.rng, 3));
        let name = self.unique_name();
        let node_name = if self.rng.below(5) == 0 {
            Some(odd_name(&mut self.rng))
        } else {
            None
        };
        self.g.add(make(name, ty), vec![], node_name).ok()
    }

    fn constant(&mut self) -> Option<NodeId> {
        let dtype = rand_dtype(&mut self.rng);
        let shape = rand_shape(&mut self.rng, 2);
        let value = rand_tensor(&mut self.rng, dtype, shape);
        self.add(Op::Constant { value }, vec![])
    }

    fn step(&mut self) -> Option<NodeId> {
        let numeric = |t: &TensorType| t.dtype.is_numeric();
        match self.rng.below(20) {
            0 => {
                let x = self.pick();
                let d = self.ty(x).dtype;
                let ops: Vec<UnaryOp> = UnaryOp::ALL.into_iter().filter(|u| u.accepts(d)).collect();
                if ops.is_empty() {
                    return None;
                }
                let u = ops[self.rng.below(ops.len() as u64) as usize];
                self.add(Op::Unary(u), vec![x])
            }
            1 | 2 => {
                let x = self.pick();
                let t = self.ty(x);
                let y = self.pick_where(|u| *u == t)?;
                let ops: Vec<BinaryOp> = BinaryOp::ALL.into_iter().filter(|b| b.accepts(t.dtype)).collect();
                let b = ops[self.rng.below(ops.len() as u64) as usize];
                self.add(Op::Binary(b), vec![x, y])
            }
            3 => {
                let a = self.pick();
                let t = self.ty(a);
                let b = self.pick_where(|u| *u == t)?;
                let shape = t.shape.clone();
                let c = match self.pick_where(|u| u.dtype == DType::Bool && u.shape == shape) {
                    Some(c) if self.rng.bool() => c,
                    _ => self.add(Op::Cast { to: DType::Bool }, vec![a])?,
                };
                self.add(Op::Select, vec![c, a, b])
            }
            4 => {
                let x = self.pick();
                let to = rand_dtype(&mut self.rng);
                self.add(Op::Cast { to }, vec![x])
            }
            5 => {
                let x = self.pick();
                let mut shape: Vec<usize> = (0..self.rng.below(2)).map(|_| 1 + self.rng.below(3) as usize).collect();
                for &d in self.ty(x).shape.dims() {
                    shape.push(if d == 1 { 1 + self.rng.below(3) as usize } else { d });
                }
                self.add(Op::Broadcast { shape: shape.into() }, vec![x])
            }
            6 => {
                let x = self.pick_where(numeric)?;
                let rank = self.ty(x).shape.rank();
                let axes: Vec<usize> = (0..rank).filter(|_| self.rng.bool()).collect();
                let op = ReduceOp::ALL[self.rng.below(5) as usize];
                let keepdims = self.rng.bool();
                self.add(Op::Reduce { op, axes, keepdims }, vec![x])
            }
            7 => {
                let x = self.pick_where(|t| numeric(t) && t.shape.rank() >= 1)?;
                let rank = self.ty(x).shape.rank();
                let axis = self.rng.below(rank as u64) as usize;
                let op = if self.rng.bool() {
                    ArgReduceOp::ArgMax
                } else {
                    ArgReduceOp::ArgMin
                };
                let keepdims = self.rng.bool();
                self.add(Op::ArgReduce { op, axis, keepdims }, vec![x])
            }
            8 => {
                let x = self.pick_where(|t| numeric(t) && t.shape.rank() >= 2)?;
                let rank = self.ty(x).shape.rank();
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(rank - 1, rank - 2);
                let y = self.add(Op::Transpose { perm }, vec![x])?;
                self.add(Op::MatMul, vec![x, y])
            }
            9 => {
                let x = self.pick();
                let t = self.ty(x);
                let shape: Vec<usize> = match self.rng.below(3) {
                    0 => vec![t.numel()],
                    1 => t.shape.dims().iter().rev().copied().collect(),
                    _ => {
                        let mut s = t.shape.0.clone();
                        s.insert(self.rng.below(s.len() as u64 + 1) as usize, 1);
                        s
                    }
                };
                self.add(Op::Reshape { shape: shape.into() }, vec![x])
            }
            10 => {
                let x = self.pick();
                let rank = self.ty(x).shape.rank();
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    perm.swap(i, j);
                }
                self.add(Op::Transpose { perm }, vec![x])
            }
            11 => {
                let x = self.pick();
                let dims = self.ty(x).shape.0.clone();
                let bound = |rng: &mut Rng, d: usize| match rng.below(8) {
                    0 => i64::MAX,
                    1 => i64::MIN,
                    _ => rng.below(2 * d as u64 + 5) as i64 - d as i64 - 2,
                };
                let ranges = dims
                    .iter()
                    .map(|&d| SliceRange {
                        start: bound(&mut self.rng, d),
                        end: bound(&mut self.rng, d),
                        step: [1, 2, 3, -1, -2, -3][self.rng.below(6) as usize],
                    })
                    .collect();
                self.add(Op::Slice { ranges }, vec![x])
            }
            12 => {
                let x = self.pick_where(|t| t.shape.rank() >= 1)?;
                let rank = self.ty(x).shape.rank();
                let axis = self.rng.below(rank as u64) as usize;
                let n = 1 + self.rng.below(3) as usize;
                self.add(Op::Concat { axis }, vec![x; n])
            }
            13 => {
                let x = self.pick_where(|t| t.shape.dims().first().is_some_and(|&d| d > 0))?;
                let t = self.ty(x);
                let axis = self.rng.below(t.shape.rank() as u64) as usize;
                let d = t.shape.dims()[axis] as i64;
                if d == 0 {
                    return None;
                }
                let shape = rand_shape(&mut self.rng, 2);
                let n: usize = shape.iter().product();
                let idx: Vec<i64> = (0..n).map(|_| self.rng.below(2 * d as u64) as i64 - d).collect();
                let data = if self.rng.bool() {
                    TensorData::I64(idx)
                } else {
                    TensorData::I32(idx.iter().map(|&i| i as i32).collect())
                };
                let value = Tensor::new(shape, data).unwrap();
                let i = self.add(Op::Constant { value }, vec![])?;
                self.add(Op::Gather { axis }, vec![x, i])
            }
            14 => {
                let x = self.pick();
                let rank = self.ty(x).shape.rank();
                let pads = (0..rank)
                    .map(|_| (self.rng.below(4) as i64 - 1, self.rng.below(4) as i64 - 1))
                    .collect();
                let mode = [PadMode::Constant, PadMode::Reflect, PadMode::Edge][self.rng.below(3) as usize];
                let value = [0.0, -0.0, 1.5, f64::INFINITY, f64::NEG_INFINITY, 1e-300, f64::MAX, -7.0]
                    [self.rng.below(8) as usize];
                self.add(Op::Pad { pads, mode, value }, vec![x])
            }
            15 => {
                let dtype = DType::ALL[self.rng.below(8) as usize];
                let shape = rand_shape(&mut self.rng, 3);
                if shape.is_empty() {
                    return None;
                }
                let axis = self.rng.below(shape.len() as u64) as usize;
                self.add(
                    Op::Iota {
                        ty: TensorType::new(dtype, shape),
                        axis,
                    },
                    vec![],
                )
            }
            16 => self.constant(),
            17 => self.binding(|name, ty| Op::Input { name, ty }),
            18 => self.binding(|name, ty| Op::Parameter { name, ty }),
            _ => {
                let x = self.pick_where(|t| t.dtype.is_float())?;
                self.add(Op::Unary(UnaryOp::Exp), vec![x])
            }
        }
    }
}

/// A random verified graph: inputs and parameters (without weight data), constants,
/// then random ops; some nodes are dead; one to three outputs, maybe sharing a node.
pub fn random_graph(seed: u64) -> Graph {
    let mut gen = Gen {
        rng: Rng::new(seed),
        g: Graph::new(),
        uniq: 0,
    };
    for _ in 0..1 + gen.rng.below(3) {
        gen.binding(|name, ty| Op::Input { name, ty });
    }
    for _ in 0..gen.rng.below(3) {
        gen.binding(|name, ty| Op::Parameter { name, ty });
    }
    for _ in 0..1 + gen.rng.below(2) {
        gen.constant();
    }
    let steps = 3 + gen.rng.below(20);
    for _ in 0..steps {
        gen.step();
    }
    let n = gen.g.len() as u64;
    for k in 0..1 + gen.rng.below(3) {
        let node = NodeId(gen.rng.below(n) as u32);
        let name = format!("{}{k}", odd_name(&mut gen.rng));
        gen.g.add_output(name, node);
    }
    gen.g.verify().expect("generated graphs verify");
    gen.g
}
