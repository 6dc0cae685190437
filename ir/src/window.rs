//! Sliding windows over the spatial axes of `[N, C, spatial..]` tensors: what
//! convolution ([`crate::Op::Conv`]) and pooling ([`crate::Op::Pool`]) share.
//!
//! Along a spatial axis of extent `len`, output position `o` reads the taps
//! `p = o * stride - pad_lo + t * dilation` for `t` in `0..kernel`; a tap outside
//! `0..len` reads padding (0 for a convolution, nothing for a pooling). The output
//! extent is `floor((len + pad_lo + pad_hi - span) / stride) + 1` with
//! `span = dilation * (kernel - 1) + 1`, or with `ceil_mode` (pooling) the ceiling,
//! less one when the last window would start past the input and its low padding
//! (PyTorch's and ONNX's rule).

// reason: `Window::axes` checks that every list has one entry per spatial axis before
// it indexes them by axis.
#![allow(clippy::indexing_slicing)]

use serde::{Deserialize, Serialize};

/// Strides, pads and dilations of a window, one per spatial axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    pub strides: Vec<usize>,
    /// `(before, after)` per spatial axis.
    pub pads: Vec<(usize, usize)>,
    pub dilations: Vec<usize>,
}

/// What a pooling computes over a window's taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolOp {
    /// The largest tap inside the input (padding is never the maximum).
    Max,
    /// The mean of the taps: their sum over the taps inside the input, or with
    /// `count_include_pad` over the taps inside the padded input.
    Avg,
}

impl PoolOp {
    pub const ALL: [PoolOp; 2] = [PoolOp::Max, PoolOp::Avg];

    pub fn name(self) -> &'static str {
        match self {
            PoolOp::Max => "max_pool",
            PoolOp::Avg => "avg_pool",
        }
    }
}

/// Which operand of a convolution a [`crate::Op::ConvGrad`] is the gradient of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvOperand {
    /// The data `x`: from the output's gradient and the weights.
    Input,
    /// The weights `w`: from the data and the output's gradient.
    Weight,
}

impl ConvOperand {
    pub fn name(self) -> &'static str {
        match self {
            ConvOperand::Input => "input",
            ConvOperand::Weight => "weight",
        }
    }
}

/// One spatial axis of a window applied to an input: everything an index needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    pub len: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad_lo: usize,
    pub pad_hi: usize,
    pub out: usize,
}

impl Axis {
    /// The input position of tap `t` of output position `o` (may be outside `0..len`).
    pub fn tap(&self, o: usize, t: usize) -> i64 {
        (o * self.stride + t * self.dilation) as i64 - self.pad_lo as i64
    }

    /// The taps `t` of output `o` that read inside the input: `lo..hi`.
    pub fn inside(&self, o: usize) -> (usize, usize) {
        self.taps_within(o, 0, self.len as i64)
    }

    /// The taps of output `o` inside `from..to` (input positions).
    pub fn taps_within(&self, o: usize, from: i64, to: i64) -> (usize, usize) {
        let base = (o * self.stride) as i64 - self.pad_lo as i64;
        let d = self.dilation as i64;
        // The first t with base + t d >= from, and the first with base + t d >= to.
        let first = |bound: i64| -> usize {
            if base >= bound {
                0
            } else {
                let t = (bound - base + d - 1) / d;
                (t as usize).min(self.kernel)
            }
        };
        let (lo, hi) = (first(from), first(to));
        (lo, hi.max(lo))
    }
}

impl Window {
    /// A window of stride 1, no padding and dilation 1 over `rank` spatial axes.
    pub fn unit(rank: usize) -> Window {
        Window {
            strides: vec![1; rank],
            pads: vec![(0, 0); rank],
            dilations: vec![1; rank],
        }
    }

    pub fn rank(&self) -> usize {
        self.strides.len()
    }

    /// The axes of this window with `kernel` over `spatial`, or why it does not apply:
    /// lists of the spatial rank, strides and dilations at least 1, a kernel that fits
    /// the padded input, and extents that do not overflow.
    pub fn axes(&self, spatial: &[usize], kernel: &[usize], ceil_mode: bool) -> Result<Vec<Axis>, String> {
        let r = spatial.len();
        if self.strides.len() != r || self.pads.len() != r || self.dilations.len() != r || kernel.len() != r {
            return Err(format!(
                "a window over {r} spatial axes needs {r} strides, pads, dilations and kernel extents, got {}, {}, {} and {}",
                self.strides.len(),
                self.pads.len(),
                self.dilations.len(),
                kernel.len()
            ));
        }
        if self.strides.iter().chain(&self.dilations).any(|&s| s == 0) {
            return Err("window strides and dilations must be at least 1".into());
        }
        if kernel.contains(&0) {
            return Err(format!("empty window kernel {kernel:?}"));
        }
        let mut axes = Vec::with_capacity(r);
        for i in 0..r {
            let (len, k, s, d) = (
                spatial[i] as u128,
                kernel[i] as u128,
                self.strides[i] as u128,
                self.dilations[i] as u128,
            );
            let (lo, hi) = (self.pads[i].0 as u128, self.pads[i].1 as u128);
            let span = d * (k - 1) + 1;
            let padded = len + lo + hi;
            if padded < span {
                return Err(format!(
                    "window of extent {span} (kernel {k}, dilation {d}) is larger than the padded input ({padded}) on spatial axis {i}"
                ));
            }
            let mut out = if ceil_mode {
                (padded - span).div_ceil(s) + 1
            } else {
                (padded - span) / s + 1
            };
            if ceil_mode && (out - 1) * s >= len + lo {
                out -= 1;
            }
            let fits = |x: u128| usize::try_from(x).ok().filter(|&v| v < (1usize << 48));
            let (Some(out), Some(_)) = (fits(out), fits(padded)) else {
                return Err(format!("window extents of spatial axis {i} are too large"));
            };
            axes.push(Axis {
                len: spatial[i],
                kernel: kernel[i],
                stride: self.strides[i],
                dilation: self.dilations[i],
                pad_lo: self.pads[i].0,
                pad_hi: self.pads[i].1,
                out,
            });
        }
        Ok(axes)
    }
}

/// The full geometry of a convolution `[n, c, spatial..] * [o, c / groups, kernel..]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    pub n: usize,
    pub c: usize,
    pub o: usize,
    pub groups: usize,
    pub axes: Vec<Axis>,
}

impl ConvGeom {
    /// The geometry of `x` by `w`, or why they do not convolve.
    pub fn new(window: &Window, groups: usize, x: &[usize], w: &[usize]) -> Result<ConvGeom, String> {
        let (&[n, c, ref spatial @ ..], &[o, wc, ref kernel @ ..]) = (x, w) else {
            return Err(format!(
                "conv needs data [N, C, spatial..] and weights [O, C / groups, kernel..], got {x:?} and {w:?}"
            ));
        };
        if spatial.is_empty() || spatial.len() != kernel.len() || spatial.len() > 3 {
            return Err(format!(
                "conv needs data and weights of one rank with 1 to 3 spatial axes, got {x:?} and {w:?}"
            ));
        }
        if groups == 0 || c % groups != 0 || o % groups != 0 || wc * groups != c {
            return Err(format!(
                "conv groups {groups} do not divide {c} input channels and {o} output channels consistently with weights {w:?}"
            ));
        }
        let axes = window.axes(spatial, kernel, false)?;
        Ok(ConvGeom { n, c, o, groups, axes })
    }

    /// `[n, o, out..]`.
    pub fn out_dims(&self) -> Vec<usize> {
        [self.n, self.o]
            .into_iter()
            .chain(self.axes.iter().map(|a| a.out))
            .collect()
    }

    /// `[n, c, len..]`.
    pub fn in_dims(&self) -> Vec<usize> {
        [self.n, self.c]
            .into_iter()
            .chain(self.axes.iter().map(|a| a.len))
            .collect()
    }

    /// `[o, c / groups, kernel..]`.
    pub fn weight_dims(&self) -> Vec<usize> {
        [self.o, self.c / self.groups]
            .into_iter()
            .chain(self.axes.iter().map(|a| a.kernel))
            .collect()
    }

    /// Multiply-adds of the convolution (what its GEMM form would do).
    pub fn macs(&self) -> u128 {
        let out: u128 = self.axes.iter().map(|a| a.out as u128).product();
        let taps: u128 = self.axes.iter().map(|a| a.kernel as u128).product();
        self.n as u128 * self.o as u128 * out * (self.c / self.groups) as u128 * taps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_extents_follow_floor_and_ceil_mode() {
        let w = Window {
            strides: vec![2],
            pads: vec![(1, 1)],
            dilations: vec![1],
        };
        // ResNet's max pool: 112 -> 56 with kernel 3, stride 2, pad 1.
        assert_eq!(w.axes(&[112], &[3], false).unwrap()[0].out, 56);
        // 6 wide, kernel 3, stride 2, no pad: floor 2, ceil 3 (the last window starts at 4 < 6).
        let np = Window::unit(1);
        let s2 = Window { strides: vec![2], ..np };
        assert_eq!(s2.axes(&[6], &[3], false).unwrap()[0].out, 2);
        assert_eq!(s2.axes(&[6], &[3], true).unwrap()[0].out, 3);
        // SqueezeNet: 111, kernel 3, stride 2, ceil: 55.
        assert_eq!(s2.axes(&[111], &[3], true).unwrap()[0].out, 55);
        // Ceil mode never starts a window in the high padding.
        let p = Window {
            strides: vec![2],
            pads: vec![(0, 1)],
            dilations: vec![1],
        };
        assert_eq!(p.axes(&[5], &[2], true).unwrap()[0].out, 3);
        assert!(Window::unit(1).axes(&[2], &[3], false).is_err());
    }

    #[test]
    fn taps_inside_the_input() {
        let a = Window {
            strides: vec![1],
            pads: vec![(2, 2)],
            dilations: vec![2],
        }
        .axes(&[5], &[3], false)
        .unwrap()[0];
        assert_eq!(a.out, 5);
        // Output 0 taps at -2, 0, 2: the first is padding.
        assert_eq!(a.inside(0), (1, 3));
        // Output 4 taps at 2, 4, 6: the last is padding.
        assert_eq!(a.inside(4), (0, 2));
        assert_eq!(a.taps_within(4, -2, 7), (0, 3));
    }
}
