//! [`Op::Concat`](graphc_ir::Op::Concat)'s kernel: each output element (or 16-byte
//! run of them, where every operand allows) copied from the operand whose range along
//! the axis holds it.

use super::super::cuda::Writer;
use super::super::layout::Ix;
use super::super::prelude::Helpers;
use super::super::CodegenError;
use super::Gen;

impl Gen<'_> {
    /// Elements a concat moves per 16-byte access: every operand read contiguously
    /// along the last dim, every row start and (along the last dim) every operand's
    /// extent a whole number of them; else 1.
    pub(super) fn concat_width(&self, axis: usize) -> usize {
        let size = self.out.dtype.size_bytes().max(1);
        let vw = 16 / size;
        let dims = self.out_dims();
        let Some(&last) = dims.last() else { return 1 };
        let ok = vw > 1
            && last.is_multiple_of(vw)
            && self.inputs.iter().all(|(a, ty)| {
                let d = ty.shape.dims();
                a.strides.last() == Some(&1)
                    && a.offset.rem_euclid(vw as i64) == 0
                    && a.strides[..a.strides.len() - 1]
                        .iter()
                        .all(|s| s.rem_euclid(vw as i64) == 0)
                    && (axis + 1 != dims.len() || d.get(axis).is_some_and(|e| e.is_multiple_of(vw)))
                    && d.last().is_some_and(|l| l.is_multiple_of(vw))
            });
        if ok {
            vw
        } else {
            1
        }
    }

    pub(super) fn concat(
        &self,
        w: &mut Writer,
        _h: &mut Helpers,
        ix: Ix,
        axis: usize,
        vw: usize,
    ) -> Result<&'static str, CodegenError> {
        let r = self.out_dims().len();
        if axis >= r {
            return Err(self.cx.malformed(format!("concat axis {axis} of rank {r}")));
        }
        let mut start = 0usize;
        let n = self.inputs.len();
        for (p, (a, ty)) in self.inputs.iter().enumerate() {
            self.check_rank("concat operand", ty.shape.rank(), r)?;
            if ty.dtype != self.out.dtype {
                return Err(self.cx.malformed("concat operands differ in dtype from the output"));
            }
            let e = ty.shape.dims()[axis];
            let mut terms = vec![ix.lit(a.offset)];
            for (k, &s) in a.strides.iter().enumerate() {
                if s == 0 {
                    continue;
                }
                if k == axis {
                    terms.push(format!("(o{k} - {}) * {}", ix.lit(start as i64), ix.lit(s)));
                } else {
                    terms.push(format!("o{k} * {}", ix.lit(s)));
                }
            }
            let read = if vw > 1 {
                let vt = super::super::elementwise::vec_type(16);
                format!(
                    "*({vt}*)(p{} + i) = *(const {vt}*)(p{} + {});",
                    self.out_param,
                    self.in_param[p],
                    terms.join(" + ")
                )
            } else {
                format!(
                    "p{}[{}] = p{}[{}];",
                    self.out_param,
                    "i",
                    self.in_param[p],
                    terms.join(" + ")
                )
            };
            let end = start + e;
            if p + 1 == n {
                if n == 1 {
                    w.line(read);
                } else {
                    w.open("else");
                    w.line(read);
                    w.close();
                }
            } else {
                let kw = if p == 0 { "if" } else { "else if" };
                w.open(format!("{kw} (o{axis} < {})", ix.lit(end as i64)));
                w.line(read);
                w.close();
            }
            start = end;
        }
        if start != self.out_dims()[axis] {
            return Err(self
                .cx
                .malformed("concat operand extents do not add up to the output's"));
        }
        Ok("concat")
    }
}
