//! Index arithmetic: collapsing dims, multi-index decomposition and addresses, all with
//! the static shapes and strides baked in as constants.

use super::cuda::Writer;

/// Indices and addresses below this fit `int` with room for a grid stride added.
const NARROW_LIMIT: u128 = (1 << 31) - (1 << 26);

/// The index type of a kernel: `int` when every index and address fits, else 64-bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ix {
    pub wide: bool,
}

impl Ix {
    /// Wide enough for `numel` iterations and every access `(offset, strides)` over
    /// `dims` (plus `extra`, e.g. the elements of a whole buffer).
    pub fn for_space(dims: &[usize], accesses: &[(i64, &[i64])], extra: usize) -> Ix {
        let numel: u128 = dims.iter().map(|&d| d as u128).product();
        let mut max = numel.max(extra as u128);
        for (off, strides) in accesses {
            let mut m = off.unsigned_abs() as u128;
            for (k, &s) in strides.iter().enumerate() {
                let d = dims.get(k).copied().unwrap_or(1).max(1) as u128;
                m += (d - 1) * s.unsigned_abs() as u128;
            }
            max = max.max(m);
        }
        Ix {
            wide: max >= NARROW_LIMIT,
        }
    }

    pub fn ty(self) -> &'static str {
        if self.wide {
            "long long"
        } else {
            "int"
        }
    }

    pub fn lit(self, x: i64) -> String {
        match (self.wide, x < 0) {
            (true, true) => format!("({x}LL)"),
            (true, false) => format!("{x}LL"),
            (false, true) => format!("({x})"),
            (false, false) => format!("{x}"),
        }
    }
}

/// A space with dims merged where every access steps through them as one.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Collapsed {
    pub dims: Vec<usize>,
    /// One stride vector per access, in the order given.
    pub strides: Vec<Vec<i64>>,
}

/// Drop extent-1 dims and merge neighbours `k, k+1` where every access has
/// `s[k] == s[k+1] * d[k+1]`. A space with a zero extent is kept as is.
pub(crate) fn collapse(dims: &[usize], strides: &[&[i64]]) -> Collapsed {
    if dims.contains(&0) {
        return Collapsed {
            dims: dims.to_vec(),
            strides: strides.iter().map(|s| s.to_vec()).collect(),
        };
    }
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for (k, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let merge = !out_dims.is_empty()
            && strides
                .iter()
                .zip(&out)
                .all(|(s, o)| o.last().is_some_and(|&prev| Some(prev) == s[k].checked_mul(d as i64)));
        if merge {
            if let Some(l) = out_dims.last_mut() {
                *l *= d;
            }
            for (o, s) in out.iter_mut().zip(strides) {
                if let Some(l) = o.last_mut() {
                    *l = s[k];
                }
            }
        } else {
            out_dims.push(d);
            for (o, s) in out.iter_mut().zip(strides) {
                o.push(s[k]);
            }
        }
    }
    Collapsed {
        dims: out_dims,
        strides: out,
    }
}

/// Emit `const T {prefix}k = ...;` for the multi-index of `flat` over `dims`, each
/// coordinate on its own (unused ones are pruned from the finished source).
pub(crate) fn decompose(w: &mut Writer, ix: Ix, flat: &str, dims: &[usize], prefix: &str) {
    let t = ix.ty();
    for k in 0..dims.len() {
        w.line(format!("const {t} {prefix}{k} = {};", axis_coord(ix, flat, dims, k)));
    }
}

/// `offset + sum_k {prefix}k * strides[k]`, skipping zero terms.
pub(crate) fn address(ix: Ix, offset: i64, strides: &[i64], prefix: &str) -> String {
    let mut terms: Vec<String> = Vec::new();
    if offset != 0 {
        terms.push(ix.lit(offset));
    }
    for (k, &s) in strides.iter().enumerate() {
        match s {
            0 => {}
            1 => terms.push(format!("{prefix}{k}")),
            _ => terms.push(format!("{prefix}{k} * {}", ix.lit(s))),
        }
    }
    if terms.is_empty() {
        "0".to_string()
    } else {
        terms.join(" + ")
    }
}

/// The coordinate along axis `n` of `dims` of the flat row-major index `flat`.
pub(crate) fn axis_coord(ix: Ix, flat: &str, dims: &[usize], n: usize) -> String {
    let inner: usize = dims[n + 1..].iter().product();
    let mut s = flat.to_string();
    if inner != 1 {
        s = format!("({s} / {})", ix.lit(inner as i64));
    }
    if n > 0 {
        s = format!("({s} % {})", ix.lit(dims[n] as i64));
    }
    s
}

/// Whether `strides` over `dims` are plain row-major.
pub(crate) fn is_contiguous(dims: &[usize], strides: &[i64]) -> bool {
    crate::kernel::strides_equal(strides, &crate::kernel::contiguous_strides(dims), dims)
}

/// For a collapsed access: `Some(period)` when it reads the same contiguous block of
/// `period` elements over and over (leading strides 0, trailing dims row-major):
/// identity reads have period = numel, scalars period 1.
pub(crate) fn broadcast_period(dims: &[usize], strides: &[i64]) -> Option<usize> {
    let t = strides.iter().position(|&s| s != 0).unwrap_or(strides.len());
    is_contiguous(&dims[t..], &strides[t..]).then(|| dims[t..].iter().product())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_merges_contiguous_dims() {
        let c = collapse(&[2, 3, 4], &[&[12, 4, 1], &[0, 0, 1]]);
        assert_eq!(c.dims, vec![6, 4]);
        assert_eq!(c.strides, vec![vec![4, 1], vec![0, 1]]);
        let c = collapse(&[2, 1, 4], &[&[4, 9, 1]]);
        assert_eq!(c.dims, vec![8]);
        assert_eq!(c.strides, vec![vec![1]]);
        let c = collapse(&[3, 4], &[&[1, 3]]);
        assert_eq!(c.dims, vec![3, 4]);
    }

    #[test]
    fn periods() {
        assert_eq!(broadcast_period(&[6, 4], &[4, 1]), Some(24));
        assert_eq!(broadcast_period(&[6, 4], &[0, 1]), Some(4));
        assert_eq!(broadcast_period(&[6, 4], &[0, 0]), Some(1));
        assert_eq!(broadcast_period(&[6, 4], &[1, 6]), None);
    }
}
