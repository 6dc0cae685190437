//! [`Op::ScatterAdd`](graphc_ir::Op::ScatterAdd)'s kernel (the gradient of a gather).

use graphc_ir::DType;

use super::super::cuda::{self, Writer};
use super::super::layout::Ix;
use super::super::prelude::Helpers;
use super::super::CodegenError;
use super::Gen;

impl Gen<'_> {
    /// [`Op::ScatterAdd`], one thread per output element: it walks every index
    /// position in row-major order and adds the updates whose index names its row, so
    /// the sum is the interpreter's, in its order, without atomics (deterministic).
    /// Accumulates in f32 (f64 for f64; wrapping 64-bit for integers). An index out of
    /// range adds nothing here (the CPU side reports it).
    pub(super) fn scatter_add(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        ix: Ix,
        axis: usize,
        size: usize,
    ) -> Result<&'static str, CodegenError> {
        let (ua, uty) = &self.inputs[0];
        let (ia, ity) = &self.inputs[1];
        let ud = uty.shape.dims();
        let idims = ity.shape.dims();
        let q = idims.len();
        let od = self.out_dims();
        if axis + q > ud.len() || od.len() + q != ud.len() + 1 || od.get(axis) != Some(&size) {
            return Err(self
                .cx
                .malformed(format!("scatter_add of {} by {} along axis {axis}", uty, ity)));
        }
        if !matches!(ity.dtype, DType::I64 | DType::I32) || uty.dtype != self.out.dtype {
            return Err(self.cx.malformed(format!(
                "scatter_add of {} by {} into {}",
                uty.dtype, ity.dtype, self.out.dtype
            )));
        }
        let t = ix.ty();
        let d = self.out.dtype;
        let (acc_t, add) = match d {
            DType::F32 | DType::F16 | DType::BF16 => ("float", "acc += x;"),
            DType::F64 => ("double", "acc += x;"),
            // wrapping, as the interpreter's integers (no signed overflow)
            _ => ("unsigned long long", "acc += (unsigned long long)(long long)x;"),
        };
        let n_idx: usize = idims.iter().product();
        w.line(format!("{acc_t} acc = 0;"));
        w.open(format!("for ({t} k = 0; k < {}; ++k)", ix.lit(n_idx as i64)));
        w.line(format!("{t} rem = k;"));
        for m in (0..q).rev() {
            w.line(format!("const {t} j{m} = rem % {};", ix.lit(idims[m] as i64)));
            if m > 0 {
                w.line(format!("rem /= {};", ix.lit(idims[m] as i64)));
            }
        }
        let mut iterms = vec![ix.lit(ia.offset)];
        for (m, &s) in ia.strides.iter().enumerate() {
            if s != 0 {
                iterms.push(format!("j{m} * {}", ix.lit(s)));
            }
        }
        w.line(format!(
            "long long g = (long long)p{}[{}];",
            self.in_param[1],
            iterms.join(" + ")
        ));
        w.line(format!("if (g < 0) g += {size}LL;"));
        w.open(format!("if (g == (long long)o{axis})"));
        let mut uterms = vec![ix.lit(ua.offset)];
        for (k, &s) in ua.strides.iter().enumerate() {
            if s == 0 {
                continue;
            }
            if k < axis {
                uterms.push(format!("o{k} * {}", ix.lit(s)));
            } else if k < axis + q {
                uterms.push(format!("j{} * {}", k - axis, ix.lit(s)));
            } else {
                uterms.push(format!("o{} * {}", k + 1 - q, ix.lit(s)));
            }
        }
        let rt = cuda::reg_type(d);
        w.line(format!(
            "const {rt} x = {};",
            cuda::load_conv(h, d, &format!("p{}[{}]", self.in_param[0], uterms.join(" + ")))
        ));
        w.line(add);
        w.close();
        w.close();
        let st = cuda::storage_type(d);
        let val = cuda::store_conv(h, d, &format!("({rt})acc"));
        w.line(format!("p{}[i] = ({st}){val};", self.out_param));
        Ok("scatter_add")
    }
}
