//! Static shapes and the shape arithmetic every stage shares.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::DType;

/// A static shape: the extent of each dimension, outermost first. Rank 0 is a scalar.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of elements (1 for a scalar). Saturates; types the verifier accepts
    /// stay below [`MAX_ELEMENTS`].
    pub fn numel(&self) -> usize {
        self.0.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Number of elements, or `None` past [`MAX_ELEMENTS`] (zero dims counted as one,
    /// so that a shape which is empty now cannot overflow after a reshape).
    pub fn checked_numel(&self) -> Option<usize> {
        self.0
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d.max(1)).filter(|&n| n <= MAX_ELEMENTS))
            .map(|_| self.numel())
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        let mut after = 1usize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = after;
            after = after.saturating_mul(d);
        }
        strides
    }

    /// Turn a possibly negative axis into an index `< rank`.
    pub fn normalize_axis(&self, axis: i64) -> Option<usize> {
        normalize_axis(axis, self.rank())
    }
}

/// The most elements a tensor type may have (2^56): far above any real model, and low
/// enough that byte sizes and index arithmetic never overflow.
pub const MAX_ELEMENTS: usize = 1 << 56;

/// Turn a possibly negative axis into an index `< rank` (numpy rules).
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// The numpy broadcast of two shapes, or `None` when they do not broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    // Dim `i` of `s` right-aligned to `rank`, 1 where `s` has no such dim.
    let aligned = |s: &[usize], i: usize| {
        i.checked_sub(rank - s.len())
            .and_then(|j| s.get(j))
            .copied()
            .unwrap_or(1)
    };
    (0..rank)
        .map(|i| match (aligned(a, i), aligned(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// True when `from` broadcasts to `to` by numpy rules (right-aligned, each dim equal or 1).
pub fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == t || f == 1)
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Shape {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Shape {
        Shape(v.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Shape {
        Shape(v.to_vec())
    }
}

/// The type of a value: element type and static shape. Printed `f32[2,16,256]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Bytes of a dense row-major tensor of this type.
    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
