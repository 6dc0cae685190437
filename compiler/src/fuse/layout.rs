//! Affine layouts: how a view (reshape, transpose, slice, broadcast) of a dense tensor
//! addresses that tensor's memory. Composing views is composing layouts; a reshape of a
//! non-contiguous layout can fail, and then the view needs a copy.

use graphc_ir::SliceRange;

use crate::kernel::contiguous_strides;

/// Element `i` of a value of shape `dims` lives at `offset + sum_k i_k * strides[k]` of
/// its root's dense memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub offset: i64,
    pub strides: Vec<i64>,
}

impl Layout {
    pub fn contiguous(dims: &[usize]) -> Layout {
        Layout {
            offset: 0,
            strides: contiguous_strides(dims),
        }
    }

    /// Plain row-major order over `dims` (strides of extent-1 dims do not matter).
    pub fn is_contiguous(&self, dims: &[usize]) -> bool {
        self.offset == 0 && crate::kernel::strides_equal(&self.strides, &contiguous_strides(dims), dims)
    }

    pub fn transpose(&self, perm: &[usize]) -> Layout {
        Layout {
            offset: self.offset,
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    pub fn slice(&self, in_dims: &[usize], ranges: &[SliceRange]) -> Layout {
        let mut out = self.clone();
        for (k, r) in ranges.iter().enumerate() {
            let (start, len) = r.resolve(in_dims[k]);
            if len > 0 {
                out.offset += start * self.strides[k];
            }
            out.strides[k] = self.strides[k] * r.step;
        }
        out
    }

    pub fn broadcast(&self, in_dims: &[usize], out_dims: &[usize]) -> Layout {
        let lead = out_dims.len() - in_dims.len();
        let strides = (0..out_dims.len())
            .map(|i| {
                if i < lead || (in_dims[i - lead] == 1 && out_dims[i] != 1) {
                    0
                } else {
                    self.strides[i - lead]
                }
            })
            .collect();
        Layout {
            offset: self.offset,
            strides,
        }
    }

    /// The layout of a reshape, if it is affine (numpy's no-copy reshape).
    pub fn reshape(&self, in_dims: &[usize], out_dims: &[usize]) -> Option<Layout> {
        if in_dims.iter().product::<usize>() == 0 {
            return Some(Layout {
                offset: self.offset,
                strides: vec![0; out_dims.len()],
            });
        }
        let old: Vec<(usize, i64)> = in_dims
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d != 1)
            .map(|(d, s)| (*d, *s))
            .collect();
        let new: Vec<(usize, usize)> = out_dims.iter().copied().enumerate().filter(|(_, d)| *d != 1).collect();
        let mut strides = vec![0i64; out_dims.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < new.len() && oi < old.len() {
            let (mut oj, mut nj) = (oi + 1, ni + 1);
            let (mut op, mut np) = (old[oi].0, new[ni].1);
            while op != np {
                if np < op {
                    np *= new.get(nj)?.1;
                    nj += 1;
                } else {
                    op *= old.get(oj)?.0;
                    oj += 1;
                }
            }
            for k in oi..oj - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 as i64 {
                    return None;
                }
            }
            // The innermost new dim of the group takes the innermost old stride.
            let mut s = old[oj - 1].1;
            for k in (ni..nj).rev() {
                strides[new[k].0] = s;
                s *= new[k].1 as i64;
            }
            oi = oj;
            ni = nj;
        }
        if oi != old.len() || ni != new.len() {
            return None;
        }
        Some(Layout {
            offset: self.offset,
            strides,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_of_contiguous_is_contiguous() {
        let l = Layout::contiguous(&[2, 3, 4]);
        let r = l.reshape(&[2, 3, 4], &[6, 1, 4]).unwrap();
        assert!(r.is_contiguous(&[6, 1, 4]));
        let r = l.reshape(&[2, 3, 4], &[24]).unwrap();
        assert!(r.is_contiguous(&[24]));
    }

    #[test]
    fn reshape_of_transpose() {
        // [2,3,4] transposed to [2,4,3]: merging the last two dims needs a copy, splitting
        // the first does not.
        let t = Layout::contiguous(&[2, 3, 4]).transpose(&[0, 2, 1]);
        assert!(t.reshape(&[2, 4, 3], &[2, 12]).is_none());
        let s = t.reshape(&[2, 4, 3], &[1, 2, 4, 3]).unwrap();
        assert_eq!(&s.strides[1..], &[12, 1, 4]);
        // Heads split after a transpose: [s, b, h*d] -> [s, b, h, d].
        let t = Layout::contiguous(&[4, 2, 6]).transpose(&[1, 0, 2]);
        let s = t.reshape(&[2, 4, 6], &[2, 4, 3, 2]).unwrap();
        assert_eq!(s.strides, vec![6, 12, 2, 1]);
    }

    #[test]
    fn slice_and_broadcast() {
        let l = Layout::contiguous(&[4, 5]);
        let r = [
            SliceRange {
                start: 1,
                end: 3,
                step: 1,
            },
            SliceRange {
                start: -1,
                end: i64::MIN,
                step: -2,
            },
        ];
        let s = l.slice(&[4, 5], &r);
        assert_eq!(s.offset, 5 + 4);
        assert_eq!(s.strides, vec![5, -2]);
        let b = Layout::contiguous(&[3, 1]).broadcast(&[3, 1], &[2, 3, 4]);
        assert_eq!(b.strides, vec![0, 1, 0]);
    }
}
