//! [`Op::ScatterAdd`](graphc_ir::Op::ScatterAdd)'s kernel (the gradient of a gather).

use graphc_ir::DType;

use super::super::cuda::{self, Writer};
use super::super::layout::Ix;
use super::super::prelude::Helpers;
use super::super::{CodegenError, GridSize, LaunchConfig};
use super::{Emitted, Gen};

/// Threads of a block of the row kernel ([`Gen::scatter_add_rows`]).
const ROWS_BLOCK: usize = 256;
/// Index positions each thread of the row kernel tests a round.
const ROWS_PER_THREAD: usize = 8;
/// Index positions a block of the row kernel scans a round (its list of matches).
const ROWS_CHUNK: usize = ROWS_BLOCK * ROWS_PER_THREAD;
/// The round's match counts per (position slot, warp), prefixed by the first warp's
/// lanes two each.
const ROWS_COUNTS: usize = ROWS_PER_THREAD * ROWS_BLOCK / 32;
const _: () = assert!(ROWS_COUNTS == 64 && ROWS_CHUNK <= 1 << 16);
/// f32 accumulators of a block of the row kernel (its rows times the row length).
const ROWS_ACC: usize = 8192;
/// The longest row the row kernel takes (one row a block, its accumulators 32 KiB).
const ROWS_MAX_ROW: usize = 8192;

impl Gen<'_> {
    /// [`Op::ScatterAdd`] along the leading axis of a float output (the embedding
    /// gradient: updates `[positions.., row]` added into `[size, row]`), as row blocks:
    /// a block owns `R` output rows (`R` rows of f32 accumulators in shared memory),
    /// scans the indices in rounds of [`ROWS_CHUNK`] (each thread tests
    /// [`ROWS_PER_THREAD`] positions, coalesced, and takes a ballot of each), compacts
    /// the positions that name its rows in position order (one prefix over the round's
    /// per-warp counts, two barriers a round), then adds each match's update row into
    /// its accumulators, each element by the one thread that owns its column. So every element is the interpreter's sum in its order
    /// (deterministic, no atomics), the indices are read once per block instead of once
    /// per element, and each update row once. `None` where it does not apply (another
    /// axis or dtype, rows over [`ROWS_MAX_ROW`]): the element kernel serves.
    pub(super) fn scatter_add_rows(&self, axis: usize, size: usize) -> Result<Option<Emitted>, CodegenError> {
        let (ua, uty) = &self.inputs[0];
        let (ia, ity) = &self.inputs[1];
        let (ud, idims, od) = (uty.shape.dims(), ity.shape.dims(), self.out_dims());
        let q = idims.len();
        let d = self.out.dtype;
        let row: usize = od.iter().skip(1).product();
        let n_idx: usize = idims.iter().product();
        if axis != 0
            || od.first() != Some(&size)
            || size == 0
            || row == 0
            || row > ROWS_MAX_ROW
            || ud.len() != q + od.len() - 1
            || ud[q..] != od[1..]
            || !matches!(d, DType::F32 | DType::F16 | DType::BF16)
            || uty.dtype != d
            || !matches!(ity.dtype, DType::I64 | DType::I32)
        {
            return Ok(None);
        }
        let rows = (ROWS_ACC / row).clamp(1, 64).min(size);
        let ix = self.ix();
        let t = ix.ty();
        let mut h = Helpers::new();
        let mut w = Writer::new();
        let (pu, pi, po) = (self.in_param[0], self.in_param[1], self.out_param);
        w.open(format!(
            "extern \"C\" __global__ void __launch_bounds__({ROWS_BLOCK}) {}({})",
            cuda::ENTRY_PLACEHOLDER,
            self.params_decl()
        ));
        w.line(format!("__shared__ float acc[{}];", rows * row));
        // A match's position in the round (under 2^16) and its row in the block (under 64).
        w.line(format!("__shared__ unsigned short pos[{ROWS_CHUNK}];"));
        w.line(format!("__shared__ unsigned char prow[{ROWS_CHUNK}];"));
        w.line(format!("__shared__ int cnt[{ROWS_COUNTS}];"));
        w.line("__shared__ int total;");
        w.line(format!("const {t} r0 = ({t})blockIdx.x * {};", ix.lit(rows as i64)));
        w.line(format!(
            "const int rows = (int)({} - r0 < {} ? {} - r0 : {});",
            ix.lit(size as i64),
            ix.lit(rows as i64),
            ix.lit(size as i64),
            ix.lit(rows as i64)
        ));
        w.line("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;");
        w.line(format!(
            "for (int e = threadIdx.x; e < rows * {row}; e += {ROWS_BLOCK}) acc[e] = 0.0f;"
        ));
        // The positions of a k (its coordinates j0.. over the index dims), and the
        // address terms of an access over them.
        let coords = |w: &mut Writer, k: &str| {
            w.line(format!("{t} rem = {k};"));
            for m in (0..q).rev() {
                w.line(format!("const {t} j{m} = rem % {};", ix.lit(idims[m] as i64)));
                if m > 0 {
                    w.line(format!("rem /= {};", ix.lit(idims[m] as i64)));
                }
            }
        };
        let over_positions = |strides: &[i64], offset: i64| {
            let mut terms = vec![ix.lit(offset)];
            for (m, &st) in strides.iter().take(q).enumerate() {
                if st != 0 {
                    terms.push(format!("j{m} * {}", ix.lit(st)));
                }
            }
            terms.join(" + ")
        };
        w.open(format!(
            "for ({t} c0 = 0; c0 < {}; c0 += {ROWS_CHUNK})",
            ix.lit(n_idx as i64)
        ));
        // Position c0 + i * ROWS_BLOCK + threadIdx.x: its row in the block, or -1.
        w.line(format!("int r[{ROWS_PER_THREAD}];"));
        w.line(format!("unsigned hits[{ROWS_PER_THREAD}];"));
        w.line("#pragma unroll");
        w.open(format!("for (int i = 0; i < {ROWS_PER_THREAD}; ++i)"));
        w.line(format!("const {t} k = c0 + i * {ROWS_BLOCK} + ({t})threadIdx.x;"));
        w.line("r[i] = -1;");
        w.open(format!("if (k < {})", ix.lit(n_idx as i64)));
        coords(&mut w, "k");
        w.line(format!(
            "long long g = (long long)p{pi}[{}];",
            over_positions(&ia.strides, ia.offset)
        ));
        w.line(format!("if (g < 0) g += {size}LL;"));
        w.line("if (g >= (long long)r0 && g < (long long)r0 + rows) r[i] = (int)(g - (long long)r0);");
        w.close();
        w.line("hits[i] = __ballot_sync(0xffffffffu, r[i] >= 0);");
        w.line(format!(
            "if (lane == 0u) cnt[i * {} + warp] = __popc(hits[i]);",
            ROWS_BLOCK / 32
        ));
        w.close();
        w.line("__syncthreads();");
        compact_round(&mut w);
        w.open("for (int m = 0; m < n; ++m)");
        w.line(format!("const {t} k = c0 + pos[m];"));
        coords(&mut w, "k");
        w.line(format!("const {t} ub = {};", over_positions(&ua.strides, ua.offset)));
        w.line(format!("float* a = acc + prow[m] * {row};"));
        w.open(format!("for (int c = threadIdx.x; c < {row}; c += {ROWS_BLOCK})"));
        // The row's coordinates o1.. over the output's trailing dims.
        let tail = &od[1..];
        let mut uterms = vec!["ub".to_string()];
        let mut rem = "c".to_string();
        for (p, &e) in tail.iter().enumerate().rev() {
            let stride = ua.strides[q + p];
            let coord = if p == 0 { rem.clone() } else { format!("({rem} % {e})") };
            if stride != 0 {
                uterms.push(format!("({t}){coord} * {}", ix.lit(stride)));
            }
            if p > 0 {
                rem = format!("({rem} / {e})");
            }
        }
        w.line(format!(
            "a[c] += {};",
            cuda::load_conv(&mut h, d, &format!("p{pu}[{}]", uterms.join(" + ")))
        ));
        w.close();
        w.close();
        w.line("__syncthreads();");
        w.close();
        let st = cuda::storage_type(d);
        w.line(format!(
            "for (int e = threadIdx.x; e < rows * {row}; e += {ROWS_BLOCK}) p{po}[r0 * {} + e] = ({st}){};",
            ix.lit(row as i64),
            cuda::store_conv(&mut h, d, "acc[e]")
        ));
        w.close();
        let blocks =
            u32::try_from(size.div_ceil(rows)).map_err(|_| self.cx.malformed("scatter_add of too many rows"))?;
        Ok(Some((
            "scatter_add",
            (w.finish(), h),
            LaunchConfig {
                block: ROWS_BLOCK as u32,
                grid: GridSize::Fixed { blocks },
                shared_mem_bytes: 0,
            },
        )))
    }

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

/// The row kernel's compaction of a round: an exclusive prefix of the per-(slot, warp)
/// match counts `cnt` in that order (position order) by the first warp, two a lane,
/// the round's total in `total`, then each match's position and row written at its
/// slot of `pos` and `prow`; `n` the round's matches, all read before the last barrier.
fn compact_round(w: &mut Writer) {
    // Exclusive prefix of the counts in (slot, warp) order, which is position order.
    w.open("if (warp == 0u)");
    w.line("const int a = cnt[2 * lane], b = cnt[2 * lane + 1];");
    w.line("int s = a + b;");
    w.line("#pragma unroll");
    w.open("for (int off = 1; off < 32; off <<= 1)");
    w.line("const int y = __shfl_up_sync(0xffffffffu, s, off);");
    w.line("if ((int)lane >= off) s += y;");
    w.close();
    w.line("cnt[2 * lane] = s - a - b;");
    w.line("cnt[2 * lane + 1] = s - b;");
    w.line("if (lane == 31u) total = s;");
    w.close();
    w.line("__syncthreads();");
    w.line("#pragma unroll");
    w.open(format!("for (int i = 0; i < {ROWS_PER_THREAD}; ++i)"));
    w.open("if (r[i] >= 0)");
    w.line(format!(
        "const int slot = cnt[i * {} + warp] + __popc(hits[i] & ((1u << lane) - 1u));",
        ROWS_BLOCK / 32
    ));
    w.line(format!(
        "pos[slot] = (unsigned short)(i * {ROWS_BLOCK} + (int)threadIdx.x);"
    ));
    w.line("prow[slot] = (unsigned char)r[i];");
    w.close();
    w.close();
    w.line("const int n = total;");
    w.line("__syncthreads();");
}
