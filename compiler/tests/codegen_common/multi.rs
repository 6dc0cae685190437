//! A multi-tensor kernel: three independent elementwise parts in one launch (a
//! contiguous part on the vector path, an odd-sized one with a tail and two stores, and
//! a transposed read on the general path), all reading one scalar.

use super::{acc, contig, store, B, P};
use graphc_compiler::kernel::{ElementwiseKernel, KernelKind, MultiTensorKernel, Program};
use graphc_ir::{BinaryOp, DType, UnaryOp};

pub fn multi_tensor() -> Program {
    let mut p = P::new();
    let s = p.input("s", DType::F32, &[]);
    let x = p.input("x", DType::F32, &[64, 256]);
    let y = p.input("y", DType::F32, &[7]);
    let xt = p.input("xt", DType::F32, &[24, 10]);
    let (o0, o1, o2, o3) = (
        p.temp(DType::F32, &[64, 256]),
        p.temp(DType::F32, &[7]),
        p.temp(DType::F32, &[7]),
        p.temp(DType::F32, &[10, 24]),
    );
    // x - s * x
    let mut b = B::new();
    let (lx, ls) = (b.load(0, DType::F32), b.load(1, DType::F32));
    let m = b.bin(BinaryOp::Mul, ls, lx);
    let r = b.bin(BinaryOp::Sub, lx, m);
    let part0 = ElementwiseKernel {
        space: vec![64, 256],
        inputs: vec![contig(x, &[64, 256]), acc(s, 0, &[0, 0])],
        body: b.b,
        stores: vec![store(r, o0, &[64, 256])],
    };
    // y * s and sqrt(y * y)
    let mut b = B::new();
    let (ly, ls) = (b.load(0, DType::F32), b.load(1, DType::F32));
    let m = b.bin(BinaryOp::Mul, ly, ls);
    let yy = b.bin(BinaryOp::Mul, ly, ly);
    let q = b.un(UnaryOp::Sqrt, yy);
    let part1 = ElementwiseKernel {
        space: vec![7],
        inputs: vec![contig(y, &[7]), acc(s, 0, &[0])],
        body: b.b,
        stores: vec![store(m, o1, &[7]), store(q, o2, &[7])],
    };
    // xt transposed, plus s
    let mut b = B::new();
    let (lt, ls) = (b.load(0, DType::F32), b.load(1, DType::F32));
    let a = b.bin(BinaryOp::Add, lt, ls);
    let part2 = ElementwiseKernel {
        space: vec![10, 24],
        inputs: vec![acc(xt, 0, &[1, 10]), acc(s, 0, &[0, 0])],
        body: b.b,
        stores: vec![store(a, o3, &[10, 24])],
    };
    p.kernel(
        "multi_tensor",
        KernelKind::MultiTensor(MultiTensorKernel {
            parts: vec![part0, part1, part2],
        }),
    )
}
