//! The attention self-tests: the attention kernel's shapes (causal and not, masks at
//! their small shapes, grouped-query heads, cross attention, partial tiles, head dims
//! 16 to 256, every float dtype, the tensor-core kernel's variants) and fully masked
//! rows giving 0 (`zero_masked_rows`) on both kernels.

use graphc_ir::{DType, GraphError, Tensor, TensorData};

use super::Cases;

/// One attention self-test shape.
struct A {
    dt: DType,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    mask: Option<[usize; 4]>,
    causal: bool,
    /// k given as `[b, hkv, d, sk]` and transposed: columns strided.
    k_transposed: bool,
    /// The mask is a constant that masks whole rows out (`-inf` on every key) and
    /// keys here and there, and fully masked rows give 0 (`zero_masked_rows`).
    zero_rows: bool,
}

/// The attention kernel's shapes: causal and not, additive masks at their small
/// shapes, grouped-query heads, cross attention (sq != sk), rows and keys that do not
/// fill a tile, head dims 32 to 256 and every float dtype; the tensor-core kernel's
/// q from shared memory, several key tiles, element copies, and its fallback.
fn attention_shapes() -> Vec<A> {
    vec![
        A {
            dt: DType::F32,
            b: 2,
            hq: 3,
            hkv: 3,
            sq: 45,
            sk: 45,
            d: 64,
            mask: None,
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::F16,
            b: 2,
            hq: 4,
            hkv: 4,
            sq: 33,
            sk: 33,
            d: 32,
            mask: Some([2, 1, 1, 33]),
            causal: false,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::BF16,
            b: 1,
            hq: 8,
            hkv: 2,
            sq: 40,
            sk: 40,
            d: 128,
            mask: None,
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::F32,
            b: 1,
            hq: 2,
            hkv: 2,
            sq: 17,
            sk: 29,
            d: 256,
            mask: None,
            causal: false,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::F64,
            b: 1,
            hq: 2,
            hkv: 1,
            sq: 9,
            sk: 12,
            d: 16,
            mask: Some([1, 2, 9, 12]),
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
        // The CUDA-core kernel over several 64-row tiles of queries and keys (the
        // last partial), grouped heads, a mask, the running max rescaling the output.
        A {
            dt: DType::F32,
            b: 1,
            hq: 4,
            hkv: 2,
            sq: 140,
            sk: 140,
            d: 64,
            mask: Some([1, 1, 1, 140]),
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
        // The tensor-core kernel: q from shared memory (d 256), several key tiles and
        // a full mask, element copies (k strided), a head dim that is not a multiple
        // of 16 (the CUDA-core path).
        A {
            dt: DType::BF16,
            b: 1,
            hq: 2,
            hkv: 2,
            sq: 70,
            sk: 70,
            d: 256,
            mask: None,
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::F16,
            b: 2,
            hq: 4,
            hkv: 2,
            sq: 65,
            sk: 150,
            d: 64,
            mask: Some([2, 1, 65, 150]),
            causal: false,
            k_transposed: false,
            zero_rows: false,
        },
        A {
            dt: DType::BF16,
            b: 2,
            hq: 2,
            hkv: 2,
            sq: 20,
            sk: 5,
            d: 48,
            mask: None,
            causal: false,
            k_transposed: true,
            zero_rows: false,
        },
        A {
            dt: DType::BF16,
            b: 1,
            hq: 3,
            hkv: 3,
            sq: 19,
            sk: 19,
            d: 40,
            mask: None,
            causal: true,
            k_transposed: false,
            zero_rows: false,
        },
    ]
}

/// Fully masked rows giving 0: a padding-only sequence (mask [b, 1, 1, sk]) on the
/// tensor-core kernel, whole query rows masked (mask [b, 1, sq, sk]) on the CUDA-core
/// kernel in f32 and in f16 (head dim 40), with causality on top.
fn zero_row_shapes() -> Vec<A> {
    vec![
        A {
            dt: DType::BF16,
            b: 3,
            hq: 2,
            hkv: 2,
            sq: 21,
            sk: 70,
            d: 64,
            mask: Some([3, 1, 1, 70]),
            causal: false,
            k_transposed: false,
            zero_rows: true,
        },
        A {
            dt: DType::F32,
            b: 2,
            hq: 2,
            hkv: 1,
            sq: 37,
            sk: 37,
            d: 32,
            mask: Some([2, 1, 37, 37]),
            causal: true,
            k_transposed: false,
            zero_rows: true,
        },
        A {
            dt: DType::F16,
            b: 2,
            hq: 2,
            hkv: 2,
            sq: 9,
            sk: 40,
            d: 40,
            mask: Some([2, 1, 9, 40]),
            causal: false,
            k_transposed: false,
            zero_rows: true,
        },
    ]
}

/// A mask of `dims` `[b, 1, sq or 1, sk]` with whole rows masked out: 0 or `-inf`
/// per element, `-inf` on every key of the last batch entry's query rows `i % 3 == 0`
/// (every row when the mask is `[.., 1, sk]`: a padding-only sequence) and on keys
/// `(i + j) % 4 == 0` elsewhere.
fn masked_rows(dt: DType, dims: [usize; 4]) -> Tensor {
    let [b, _, sq, sk] = dims;
    let mut v = Vec::with_capacity(b * sq * sk);
    for n in 0..b {
        for i in 0..sq {
            for j in 0..sk {
                let whole = n + 1 == b && i % 3 == 0;
                let off = whole || (sq > 1 && (i + j) % 4 == 0);
                v.push(if off { f64::NEG_INFINITY } else { 0.0 });
            }
        }
    }
    Tensor::new(dims, TensorData::from_f64(dt, &v)).unwrap_or_else(|_| Tensor::scalar(dt, 0.0))
}

pub(super) fn cases(c: &mut Cases) -> Result<(), GraphError> {
    for a in attention_shapes().into_iter().chain(zero_row_shapes()) {
        let mask = a.mask.map(|m| format!(" mask {m:?}")).unwrap_or_default();
        let causal = if a.causal { " causal" } else { "" };
        let mut causal = if a.k_transposed {
            format!("{causal} k strided")
        } else {
            causal.to_string()
        };
        if a.zero_rows {
            causal.push_str(" fully masked rows give 0");
        }
        let name = format!(
            "attention {} q[{},{},{},{}] kv {} heads x {}{mask}{causal}",
            a.dt, a.b, a.hq, a.sq, a.d, a.hkv, a.sk
        );
        c.add(name, 0, &|b| {
            let q = b.input("q", a.dt, [a.b, a.hq, a.sq, a.d]);
            let k = if a.k_transposed {
                b.input("k", a.dt, [a.b, a.hkv, a.d, a.sk]).transpose(&[0, 1, 3, 2])
            } else {
                b.input("k", a.dt, [a.b, a.hkv, a.sk, a.d])
            };
            let v = b.input("v", a.dt, [a.b, a.hkv, a.sk, a.d]);
            let scale = 1.0 / (a.d as f64).sqrt();
            if a.zero_rows {
                let m = a.mask.map(|m| b.constant(masked_rows(a.dt, m)));
                let flags = graphc_ir::interp::attention::Flags {
                    scale,
                    causal: a.causal,
                    zero_masked_rows: true,
                };
                b.output("o", b.attention_flags((q, k, v), m, flags));
            } else {
                let m = a.mask.map(|m| b.input("m", a.dt, m));
                b.output("o", b.attention(q, k, v, m, scale, a.causal));
            }
        })?;
    }
    backward_cases(c)
}

/// Attention's backward kernels (`attention_lse`, `attention_grad` of q, k and v):
/// grouped-query heads with an additive mask and causal rows; fully masked rows
/// giving 0 with a strided k and `dout` read through a transposed view; f64; several
/// tiles of the CUDA-core kernels, and bf16 through them; and the tensor-core
/// `attention_grad` in bf16 and f16 (head dims 32, 64, 128).
fn backward_cases(c: &mut Cases) -> Result<(), GraphError> {
    use graphc_ir::{AttentionOperand, Op};
    struct Bw {
        dt: DType,
        b: usize,
        hq: usize,
        hkv: usize,
        s: usize,
        d: usize,
        causal: bool,
        zero_rows: bool,
    }
    let shapes = [
        Bw {
            dt: DType::F32,
            b: 2,
            hq: 4,
            hkv: 2,
            s: 19,
            d: 24,
            causal: true,
            zero_rows: false,
        },
        Bw {
            dt: DType::F32,
            b: 2,
            hq: 2,
            hkv: 2,
            s: 12,
            d: 16,
            causal: false,
            zero_rows: true,
        },
        Bw {
            dt: DType::F64,
            b: 1,
            hq: 2,
            hkv: 1,
            s: 9,
            d: 8,
            causal: true,
            zero_rows: false,
        },
        // The CUDA-core kernels over several 64-row tiles, the last partial, causal
        // tiles skipped; and bf16 with a head dim they take (not a multiple of 16).
        Bw {
            dt: DType::F32,
            b: 1,
            hq: 4,
            hkv: 2,
            s: 150,
            d: 64,
            causal: true,
            zero_rows: false,
        },
        Bw {
            dt: DType::BF16,
            b: 1,
            hq: 2,
            hkv: 2,
            s: 40,
            d: 24,
            causal: false,
            zero_rows: true,
        },
        // The tensor-core kernels: two blocks of rows, the second partial, 64-row
        // tiles; fully masked rows through strided k and dout in f16; head dim 128
        // (32-row tiles) with a kv head shared by two query heads.
        Bw {
            dt: DType::BF16,
            b: 2,
            hq: 4,
            hkv: 2,
            s: 70,
            d: 32,
            causal: true,
            zero_rows: false,
        },
        Bw {
            dt: DType::F16,
            b: 1,
            hq: 2,
            hkv: 2,
            s: 40,
            d: 64,
            causal: false,
            zero_rows: true,
        },
        Bw {
            dt: DType::BF16,
            b: 1,
            hq: 2,
            hkv: 1,
            s: 33,
            d: 128,
            causal: true,
            zero_rows: false,
        },
        // Over head dim 128 (the warps' rows in shared memory, 16-row tiles).
        Bw {
            dt: DType::BF16,
            b: 1,
            hq: 2,
            hkv: 1,
            s: 21,
            d: 256,
            causal: true,
            zero_rows: false,
        },
        Bw {
            dt: DType::F16,
            b: 1,
            hq: 1,
            hkv: 1,
            s: 18,
            d: 160,
            causal: false,
            zero_rows: true,
        },
    ];
    for a in shapes {
        let name = format!(
            "attention backward {} q[{},{},{},{}] kv {} heads{}{}",
            a.dt,
            a.b,
            a.hq,
            a.s,
            a.d,
            a.hkv,
            if a.causal { " causal" } else { "" },
            if a.zero_rows {
                " fully masked rows give 0, k and dout strided"
            } else {
                " mask [b,1,1,s]"
            }
        );
        c.add(name, 0, &|b| {
            let q = b.input("q", a.dt, [a.b, a.hq, a.s, a.d]);
            let (k, dout) = if a.zero_rows {
                (
                    b.input("k", a.dt, [a.b, a.hkv, a.d, a.s]).transpose(&[0, 1, 3, 2]),
                    b.input("dout", a.dt, [a.b, a.s, a.hq, a.d]).transpose(&[0, 2, 1, 3]),
                )
            } else {
                (
                    b.input("k", a.dt, [a.b, a.hkv, a.s, a.d]),
                    b.input("dout", a.dt, [a.b, a.hq, a.s, a.d]),
                )
            };
            let v = b.input("v", a.dt, [a.b, a.hkv, a.s, a.d]);
            let m = if a.zero_rows {
                b.constant(masked_rows(a.dt, [a.b, 1, a.s, a.s]))
            } else {
                b.input("m", a.dt, [a.b, 1, 1, a.s])
            };
            let scale = 1.0 / (a.d as f64).sqrt();
            let lse = b.op(
                Op::AttentionLse {
                    scale,
                    causal: a.causal,
                },
                &[q.id(), k.id(), m.id()],
            );
            let stats = if a.dt == DType::F64 { DType::F64 } else { DType::F32 };
            let delta = b.input("delta", stats, [a.b, a.hq, a.s]);
            b.output("lse", lse);
            for wrt in [AttentionOperand::Q, AttentionOperand::K, AttentionOperand::V] {
                let op = Op::AttentionGrad {
                    wrt,
                    scale,
                    causal: a.causal,
                    zero_masked_rows: a.zero_rows,
                };
                let g = b.op(op, &[q.id(), k.id(), v.id(), dout.id(), lse.id(), delta.id(), m.id()]);
                b.output(&format!("d{}", wrt.name()), g);
            }
        })?;
    }
    pair_cases(c)
}

/// The kernels made of two ops: the forward with the backward's log-sum-exp beside it,
/// and the gradients of k and v of two different output gradients, each alone.
fn pair_cases(c: &mut Cases) -> Result<(), GraphError> {
    use graphc_ir::{AttentionOperand, Op};
    // The forward with the rows' log-sum-exp stored beside its output (the backward's
    // `attention_lse` of the same q, k and mask), then the backward.
    c.add(
        "attention bf16 q[1,2,40,64] kv 1 heads causal: the forward with its log-sum-exp, the backward".into(),
        0,
        &|b| {
            let (dt, shape) = (DType::BF16, [1, 2, 40, 64]);
            let q = b.input("q", dt, shape);
            let k = b.input("k", dt, [1, 1, 40, 64]);
            let v = b.input("v", dt, [1, 1, 40, 64]);
            let m = b.input("m", dt, [1, 1, 1, 40]);
            let scale = 0.125;
            let o = b.attention(q, k, v, Some(m), scale, true);
            let lse = b.op(Op::AttentionLse { scale, causal: true }, &[q.id(), k.id(), m.id()]);
            let dout = b.input("dout", dt, shape);
            let delta = b.input("delta", DType::F32, [1, 2, 40]);
            b.output("o", o);
            b.output("lse", lse);
            for wrt in [AttentionOperand::Q, AttentionOperand::K, AttentionOperand::V] {
                let op = Op::AttentionGrad {
                    wrt,
                    scale,
                    causal: true,
                    zero_masked_rows: false,
                };
                let g = b.op(op, &[q.id(), k.id(), v.id(), dout.id(), lse.id(), delta.id(), m.id()]);
                b.output(&format!("d{}", wrt.name()), g);
            }
        },
    )?;
    // The gradients of k and v of one output gradient are one kernel (above); of two,
    // the tensor-core kernel of each alone.
    c.add(
        "attention backward bf16 q[1,2,40,64] kv 1 heads causal, dk and dv of two output gradients".into(),
        0,
        &|b| {
            let (dt, shape) = (DType::BF16, [1, 2, 40, 64]);
            let q = b.input("q", dt, shape);
            let k = b.input("k", dt, [1, 1, 40, 64]);
            let v = b.input("v", dt, [1, 1, 40, 64]);
            let m = b.input("m", dt, [1, 1, 1, 40]);
            let scale = 0.125;
            let lse = b.op(Op::AttentionLse { scale, causal: true }, &[q.id(), k.id(), m.id()]);
            let delta = b.input("delta", DType::F32, [1, 2, 40]);
            for wrt in [AttentionOperand::K, AttentionOperand::V] {
                let dout = b.input(&format!("dout_{}", wrt.name()), dt, shape);
                let op = Op::AttentionGrad {
                    wrt,
                    scale,
                    causal: true,
                    zero_masked_rows: false,
                };
                let g = b.op(op, &[q.id(), k.id(), v.id(), dout.id(), lse.id(), delta.id(), m.id()]);
                b.output(&format!("d{}", wrt.name()), g);
            }
        },
    )?;
    Ok(())
}
