//! Self-test cases of convolution and pooling and their gradients: every window
//! feature (strides, pads, dilations, groups and depthwise, 1-D, ceil mode, both
//! average divisors) in f32 and bf16.

use graphc_ir::{ConvOperand, DType, GraphError, Op, PoolOp, Window};

use super::{wp, Cases};

fn window(strides: &[usize], pads: &[(usize, usize)], dilations: &[usize]) -> Window {
    Window {
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dilations.to_vec(),
    }
}

pub(super) fn cases(c: &mut Cases) -> Result<(), GraphError> {
    for dt in [DType::F32, DType::BF16] {
        c.add(format!("conv {dt} 3x3 pad 1 + bias + relu [2,8,12,12]"), 0, &|b| {
            let x = b.input("x", dt, [2, 8, 12, 12]);
            let w = wp(b, dt, "w", &[16, 8, 3, 3], 1);
            let bias = wp(b, dt, "bias", &[16, 1, 1], 2);
            let y = x.conv(w, window(&[1, 1], &[(1, 1), (1, 1)], &[1, 1]), 1) + bias;
            b.output("y", y.relu());
        })?;
        c.add(
            format!("conv {dt} stride 2, dilation 2, 2 groups, uneven pads"),
            0,
            &|b| {
                let x = b.input("x", dt, [2, 6, 11, 9]);
                let w = wp(b, dt, "w", &[4, 3, 3, 2], 3);
                b.output("y", x.conv(w, window(&[2, 1], &[(2, 1), (0, 1)], &[2, 2]), 2));
            },
        )?;
        c.add(format!("conv {dt} depthwise 3x3 stride 2 and 1-D"), 0, &|b| {
            let x = b.input("x", dt, [2, 8, 10, 10]);
            let w = wp(b, dt, "w", &[8, 1, 3, 3], 4);
            b.output("dw", x.conv(w, window(&[2, 2], &[(1, 1), (1, 1)], &[1, 1]), 8));
            let s = b.input("s", dt, [3, 4, 20]);
            let w1 = wp(b, dt, "w1", &[6, 4, 5], 5);
            b.output("c1", s.conv(w1, window(&[3], &[(2, 2)], &[1]), 1));
        })?;
        c.add(
            format!("conv_grad {dt} of the input and weights, stride 2, 2 groups"),
            0,
            &|b| {
                let w_ = window(&[2, 2], &[(1, 0), (1, 1)], &[1, 1]);
                let x = b.input("x", dt, [2, 4, 9, 8]);
                let dy = b.input("dy", dt, [2, 6, 4, 4]);
                let w = wp(b, dt, "w", &[6, 2, 3, 3], 6);
                b.output("dx", dy.conv_grad(w, ConvOperand::Input, w_.clone(), 2, &[2, 4, 9, 8]));
                b.output("dw", x.conv_grad(dy, ConvOperand::Weight, w_, 2, &[6, 2, 3, 3]));
            },
        )?;
        c.add(
            format!("pools {dt}: max 3x3/2 ceil, avg with and without the pad, and their gradients"),
            0,
            &|b| {
                let x = b.input("x", dt, [2, 3, 9, 10]);
                let max = Op::Pool {
                    op: PoolOp::Max,
                    kernel: vec![3, 3],
                    window: window(&[2, 2], &[(1, 0), (1, 0)], &[1, 1]),
                    ceil_mode: true,
                    count_include_pad: false,
                };
                let avg = |count_include_pad| Op::Pool {
                    op: PoolOp::Avg,
                    kernel: vec![3, 2],
                    window: window(&[1, 2], &[(1, 1), (1, 1)], &[1, 1]),
                    ceil_mode: true,
                    count_include_pad,
                };
                for (name, op) in [("max", max), ("avg_in", avg(true)), ("avg_ex", avg(false))] {
                    let Op::Pool {
                        op: p,
                        kernel,
                        window,
                        ceil_mode,
                        count_include_pad,
                    } = &op
                    else {
                        continue;
                    };
                    let y = x.pool(*p, kernel, window.clone(), *ceil_mode, *count_include_pad);
                    b.output(name, y);
                    let dy = b.input(&format!("d{name}"), dt, y.shape().0);
                    b.output(&format!("g{name}"), x.pool_grad(dy, &op));
                }
            },
        )?;
    }
    Ok(())
}
