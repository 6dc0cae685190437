//! ONNX Conv lowerings against a direct convolution: the patch path (stride equal to
//! the kernel, ViT's patch embedding), with and without trailing rows no patch covers,
//! and the general im2col path (padding, stride, dilation, groups).

mod common;

use std::collections::HashMap;

use common::{int_attr, ints_attr, model, node, value_info};
use graphc_ir::onnx::proto::data_type as dt;
use graphc_ir::onnx::{import_model, ImportOptions};
use graphc_ir::{interpret, DType, Tensor, TensorType};

struct Conv {
    x: [usize; 4],
    w: [usize; 4],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
}

/// A direct 2-D convolution in f64.
fn direct(c: &Conv, x: &[f64], w: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let [n, ch, h, wd] = c.x;
    let [m, cg, kh, kw] = c.w;
    let ph = h + c.pads[0] + c.pads[2];
    let pw = wd + c.pads[1] + c.pads[3];
    let oh = (ph - (c.dilations[0] * (kh - 1) + 1)) / c.strides[0] + 1;
    let ow = (pw - (c.dilations[1] * (kw - 1) + 1)) / c.strides[1] + 1;
    let mg = m / c.group;
    let mut out = vec![0.0; n * m * oh * ow];
    for b in 0..n {
        for o in 0..m {
            let g = o / mg;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = 0.0;
                    for ci in 0..cg {
                        let cin = g * cg + ci;
                        for i in 0..kh {
                            for j in 0..kw {
                                let r = (y * c.strides[0] + i * c.dilations[0]) as i64 - c.pads[0] as i64;
                                let q = (xx * c.strides[1] + j * c.dilations[1]) as i64 - c.pads[1] as i64;
                                if r < 0 || q < 0 || r >= h as i64 || q >= wd as i64 {
                                    continue;
                                }
                                let xv = x[((b * ch + cin) * h + r as usize) * wd + q as usize];
                                let wv = w[((o * cg + ci) * kh + i) * kw + j];
                                acc += xv * wv;
                            }
                        }
                    }
                    out[((b * m + o) * oh + y) * ow + xx] = acc;
                }
            }
        }
    }
    let _ = ch;
    (vec![n, m, oh, ow], out)
}

fn check(c: Conv) {
    let dims = |d: &[usize]| d.iter().map(|&v| v as i64).collect::<Vec<_>>();
    let m = model(
        13,
        vec![node(
            "Conv",
            "conv",
            &["x", "w"],
            &["y"],
            vec![
                ints_attr("strides", &dims(&c.strides)),
                ints_attr("pads", &dims(&c.pads)),
                ints_attr("dilations", &dims(&c.dilations)),
                int_attr("group", c.group as i64),
            ],
        )],
        vec![
            value_info("x", dt::FLOAT, &dims(&c.x)),
            value_info("w", dt::FLOAT, &dims(&c.w)),
        ],
        vec![],
        &["y"],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let x = Tensor::random(&TensorType::new(DType::F32, c.x.to_vec()), 1);
    let w = Tensor::random(&TensorType::new(DType::F32, c.w.to_vec()), 2);
    let inputs: HashMap<String, Tensor> = [("x".to_string(), x.clone()), ("w".to_string(), w.clone())].into();
    let got = interpret(&g, &inputs).unwrap().remove(0).1;
    let (shape, want) = direct(&c, &x.to_f64_vec(), &w.to_f64_vec());
    assert_eq!(got.shape().dims(), shape.as_slice());
    for (a, b) in got.to_f64_vec().iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn patch_embedding_conv() {
    check(Conv {
        x: [2, 3, 8, 12],
        w: [5, 3, 4, 4],
        strides: [4, 4],
        pads: [0; 4],
        dilations: [1, 1],
        group: 1,
    });
}

#[test]
fn patch_conv_cuts_rows_no_patch_covers() {
    check(Conv {
        x: [1, 2, 7, 8],
        w: [3, 2, 3, 3],
        strides: [3, 3],
        pads: [0; 4],
        dilations: [1, 1],
        group: 1,
    });
}

#[test]
fn general_conv() {
    check(Conv {
        x: [2, 4, 7, 6],
        w: [6, 2, 3, 2],
        strides: [2, 1],
        pads: [1, 0, 2, 1],
        dilations: [1, 2],
        group: 2,
    });
}
