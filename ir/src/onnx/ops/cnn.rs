//! The rest of a convolutional network: pooling (`MaxPool`, `AveragePool`,
//! `GlobalAveragePool`, `GlobalMaxPool`, as [`crate::Op::Pool`] or a reduction) and
//! `BatchNormalization` (an [`crate::Op::BatchNorm`]: the compiler lowers it to a
//! per-channel affine map for inference and to batch statistics for training).

use super::nn::conv_axes;
use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::{PoolOp, ReduceOp, Value, Window};

pub const OPS: &[(&str, Lowering)] = &[
    ("MaxPool", max_pool),
    ("AveragePool", average_pool),
    ("GlobalAveragePool", global_average_pool),
    ("GlobalMaxPool", global_max_pool),
    ("BatchNormalization", batch_norm),
];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// `x` as `[N, C, spatial..]` with 1 to 3 spatial axes, or the error naming `op`; also
/// its `[N, C]` and spatial extents.
#[allow(clippy::type_complexity)]
fn spatial_input<'b>(n: &Node<'_, 'b>, op: &str) -> Result<(Value<'b>, [usize; 2], Vec<usize>), String> {
    let x = n.input(0)?;
    let dims = x.shape().0;
    match dims.as_slice() {
        [b, c, spatial @ ..] if (1..=3).contains(&spatial.len()) && x.dtype().is_float() => {
            Ok((x, [*b, *c], spatial.to_vec()))
        }
        _ => Err(format!(
            "{op} needs a float [N, C, spatial..] input with 1 to 3 spatial axes, got {}",
            x.ty()
        )),
    }
}

fn pool<'b>(n: &Node<'_, 'b>, op: PoolOp, name: &str) -> Out<'b> {
    let (x, lead, spatial) = spatial_input(n, name)?;
    if n.proto.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(format!("{name}'s Indices output is not supported"));
    }
    let kernel: Vec<usize> = n
        .attrs
        .ints("kernel_shape")?
        .ok_or_else(|| format!("{name} needs `kernel_shape`"))?
        .iter()
        .map(|&k| usize::try_from(k).ok().filter(|&k| k >= 1))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{name} kernel_shape must be positive"))?;
    if kernel.len() != spatial.len() {
        return Err(format!(
            "{name} kernel_shape {kernel:?} does not have one extent per spatial axis of {}",
            x.ty()
        ));
    }
    if n.attrs.int("storage_order", 0)? != 0 {
        return Err(format!(
            "{name} storage_order 1 (column-major indices) is not supported"
        ));
    }
    let axes = conv_axes(n, &spatial, &kernel, lead)?;
    let pads = axes
        .iter()
        .map(|a| Some((usize::try_from(a.pads.0).ok()?, usize::try_from(a.pads.1).ok()?)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("{name} pads must not be negative"))?;
    let window = Window {
        strides: axes.iter().map(|a| a.stride as usize).collect(),
        pads,
        dilations: axes.iter().map(|a| a.dilation as usize).collect(),
    };
    let ceil_mode = n.attrs.int("ceil_mode", 0)? != 0;
    let count_include_pad = n.attrs.int("count_include_pad", 0)? != 0;
    Ok(vec![x.pool(op, &kernel, window, ceil_mode, count_include_pad)])
}

fn max_pool<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    pool(n, PoolOp::Max, "MaxPool")
}

fn average_pool<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    pool(n, PoolOp::Avg, "AveragePool")
}

/// The mean or max over every spatial axis, kept as extent 1.
fn global<'b>(n: &Node<'_, 'b>, op: ReduceOp, name: &str) -> Out<'b> {
    let (x, _, spatial) = spatial_input(n, name)?;
    let axes: Vec<i64> = (2..2 + spatial.len() as i64).collect();
    Ok(vec![x.reduce(op, &axes, true)])
}

fn global_average_pool<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    global(n, ReduceOp::Mean, "GlobalAveragePool")
}

fn global_max_pool<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    global(n, ReduceOp::Max, "GlobalMaxPool")
}

/// Inference batch normalization over axis 1 (`training_mode` 0; the running-statistics
/// outputs of training mode are refused).
fn batch_norm<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let x = n.input(0)?;
    let dims = x.shape().0;
    let c = match dims.as_slice() {
        [_, c, ..] if x.dtype().is_float() => *c,
        _ => {
            return Err(format!(
                "BatchNormalization needs a float [N, C, ..] input, got {}",
                x.ty()
            ))
        }
    };
    if n.attrs.int("training_mode", 0)? != 0 || n.num_outputs() > 1 {
        return Err(
            "BatchNormalization in training mode (batch statistics, running-statistics outputs) is not \
             imported; export the model in eval mode (graphc's training step computes batch statistics itself)"
                .into(),
        );
    }
    let per_channel = |i: usize, what: &str| -> Result<Value<'b>, String> {
        let v = n.input(i)?;
        if v.shape().0 != [c] || v.dtype() != x.dtype() {
            return Err(format!(
                "BatchNormalization {what} must be {}[{c}], got {}",
                x.dtype(),
                v.ty()
            ));
        }
        Ok(v)
    };
    let (scale, bias, mean, var) = (
        per_channel(1, "scale")?,
        per_channel(2, "bias")?,
        per_channel(3, "mean")?,
        per_channel(4, "var")?,
    );
    let epsilon = f64::from(n.attrs.float("epsilon", 1e-5)?);
    let momentum = f64::from(n.attrs.float("momentum", 0.9)?);
    let op = crate::Op::BatchNorm { epsilon, momentum };
    Ok(vec![x.builder().add_op(op, &[x, scale, bias, mean, var])])
}
