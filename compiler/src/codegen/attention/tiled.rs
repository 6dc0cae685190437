//! Attention on CUDA cores, tiled as FlashAttention-2 does it: the forward,
//! `attention_lse` and `attention_grad` for f32, f64, and the bf16 / f16 head dims the
//! tensor-core kernels ([`super::mma`], [`super::mma_backward`]) do not take.
//!
//! A block of [`THREADS`] threads (a 16 x 16 grid, `tx` fastest) owns a tile of `t`
//! rows (64, 32 or 16: the largest whose tiles fit [`SMEM_LIMIT`]) and streams the other
//! side's tiles of `t` rows through shared memory, every tile converted to the
//! accumulation type on load:
//!
//! - **forward** and **lse**: the block's query rows (their q) stay in shared memory;
//!   per key tile (k, and v for the forward) the scores `s = q kᵀ scale + mask`, each
//!   row's online-softmax update (its max and sum over the 16 threads that share the
//!   row, by shuffles) with `p` into shared memory, and `o += p v`. The output is `o /
//!   l`, the log-sum-exp `m + log l`.
//! - **dq** (`wrt` q): the block's query rows (their q, dout, lse and delta) stay in
//!   shared memory; per key tile (k and v) it computes `s = q kᵀ` and `dp = dout vᵀ`,
//!   `ds = p (dp - delta) scale` with `p = exp(s scale + mask - lse)`, stores ds in
//!   shared memory, and accumulates `dq += ds k`.
//! - **dk / dv** (`wrt` k, v): the block's key rows (k, and v for dk) stay; the query
//!   tiles of every query head of the kv head's group stream through (q, dout, lse,
//!   delta), giving `dk += dsᵀ q` or `dv += pᵀ dout`.
//!
//! Thread `(ty, tx)` computes the scores of rows `ty + 16a` and columns `tx + 16b`
//! (`a, b < t / 16`) of a tile pair, and accumulates output rows `ty + 16a`, columns
//! `tx + 16e`: register tiles, each shared-memory value read once per `t / 16`
//! products; rows are padded to an odd pitch so the 16 rows a warp reads sit in
//! distinct banks. With `causal`, tile pairs wholly above the diagonal are skipped. The
//! sums over keys (dq) and over query heads then rows (dk, dv) run in the reference's
//! order.

use graphc_ir::{AttentionOperand, DType};

use super::super::cuda::{self, Writer};
use super::super::prelude::Helpers;
use super::super::{GridSize, LaunchConfig};
use super::backward::{Gen, Role};

/// Threads per block: a 16 x 16 grid.
const THREADS: usize = 256;

/// The kernels generated here.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    /// Attention's output (operands q, k, v, maybe a mask).
    Forward,
    /// `attention_lse` (operands q, k, k again in v's place and unread, maybe a mask).
    Lse,
    /// `attention_grad` of an operand.
    Grad(AttentionOperand),
}

impl Kernel {
    /// Whether the kernel's blocks own query rows (else key rows).
    fn by_query(self) -> bool {
        !matches!(self, Kernel::Grad(AttentionOperand::K | AttentionOperand::V))
    }
}
/// Shared memory a block may take (opted into above 48 KiB at launch): 99 KiB, what
/// every target from sm_80 allows.
const SMEM_LIMIT: usize = 99 * 1024;

/// The shared-memory layout: each buffer's offset (in accumulator elements) and pitch.
struct Layout {
    t: usize,
    /// Pitches of the q / k rows and the v / dout rows (head dims rounded up to 16, plus
    /// one), and of the score tile.
    kp: usize,
    vp: usize,
    tp: usize,
    /// Buffers present, in order, with their element counts.
    bufs: Vec<(&'static str, usize)>,
}

impl Layout {
    fn new(d: usize, dv: usize, t: usize, kind: Kernel) -> Layout {
        let (kp, vp, tp) = (d.next_multiple_of(16) + 1, dv.next_multiple_of(16) + 1, t + 1);
        let grad = matches!(kind, Kernel::Grad(_));
        let dv_grad = kind == Kernel::Grad(AttentionOperand::V);
        let mut bufs = vec![("qs", t * kp), ("ks", t * kp)];
        if grad {
            bufs.push(("os", t * vp));
        }
        if kind == Kernel::Forward || grad && !dv_grad {
            bufs.push(("vs", t * vp));
        }
        bufs.push(("ps", t * tp));
        if grad {
            bufs.push(("ls", t));
        }
        if grad && !dv_grad {
            bufs.push(("dls", t));
        }
        Layout { t, kp, vp, tp, bufs }
    }

    fn elems(&self) -> usize {
        self.bufs.iter().map(|(_, n)| n).sum()
    }
}

/// The tile for head dims `d`, `dv` and accumulators of `size` bytes: 64, 32 or 16 rows,
/// the largest whose buffers fit [`SMEM_LIMIT`].
fn layout(d: usize, dv: usize, size: usize, kind: Kernel) -> Layout {
    let mut l = Layout::new(d, dv, 64, kind);
    while l.t > 16 && l.elems() * size > SMEM_LIMIT {
        l = Layout::new(d, dv, l.t / 2, kind);
    }
    l
}

struct Tiled<'a, 'b> {
    g: &'b Gen<'a>,
    l: Layout,
    kind: Kernel,
    /// Register tile: `t / 16` rows and columns per thread; output columns per thread.
    r: usize,
    e: usize,
}

impl Tiled<'_, '_> {
    /// Loads `rows` rows of operand `n` (head `head`, rows from `base`, `len` valid) into
    /// shared buffer `dst` of pitch `pitch`, `width` columns, zeros past the row's end
    /// and past `len`, up to `pitch - 1` columns.
    #[allow(clippy::too_many_arguments)]
    fn load_tile(
        &self,
        w: &mut Writer,
        h: &mut Helpers,
        n: usize,
        dst: &str,
        head: &str,
        base: &str,
        len: usize,
        width: usize,
        pitch: usize,
    ) {
        let (t, wp) = (self.l.t, pitch - 1);
        let zero = self.g.lit(0.0);
        w.open(format!("for (int e = threadIdx.x; e < {}; e += {THREADS})", t * wp));
        w.line(format!("const int rr = e / {wp}, cc = e % {wp};"));
        w.line(format!("const long long row = {base} + rr;"));
        let v = self.g.load(h, n, head, &["row", "cc"]);
        w.line(format!(
            "{dst}[rr * {pitch} + cc] = (row < {len}LL && cc < {width}) ? {v} : {zero};"
        ));
        w.close();
    }

    /// Loads a row statistic (lse or delta, operand `n`) of rows from `base` into `dst`.
    fn load_stat(&self, w: &mut Writer, h: &mut Helpers, n: usize, dst: &str, head: &str, base: &str) {
        let (t, sq) = (self.l.t, self.g.dims.sq);
        w.open(format!("for (int e = threadIdx.x; e < {t}; e += {THREADS})"));
        w.line(format!("const long long row = {base} + e;"));
        let v = self.g.load(h, n, head, &["row"]);
        w.line(format!("{dst}[e] = (row < {sq}LL) ? {v} : {};", self.g.lit(0.0)));
        w.close();
    }

    /// `out[a][b] = sum_c x[ty + 16a][c] y[tx + 16b][c]` over `width` columns.
    fn products(&self, w: &mut Writer, out: &str, x: &str, y: &str, pitch: usize, width: usize) {
        let (r, acc_t) = (self.r, self.g.acc_t);
        w.line(format!("{acc_t} {out}[{r}][{r}];"));
        unrolled2(w, ("a", r), ("b", r), &format!("{out}[a][b] = {};", self.g.lit(0.0)));
        w.open(format!("for (int c = 0; c < {width}; ++c)"));
        w.line(format!("{acc_t} xa[{r}], yb[{r}];"));
        w.line("#pragma unroll");
        w.line(format!(
            "for (int a = 0; a < {r}; ++a) {{ xa[a] = {x}[(ty + 16 * a) * {pitch} + c]; yb[a] = {y}[(tx + 16 * a) * {pitch} + c]; }}"
        ));
        unrolled2(w, ("a", r), ("b", r), &format!("{out}[a][b] += xa[a] * yb[b];"));
        w.close();
    }

    /// Each score's `p` (and `ds` with `dp`), written to `ps[i][j]` (`i` the tile's query
    /// row, `j` its key): 0 outside the rows and keys. Query head `hq_`, the query tile
    /// from `i0`, the key tile from `j0`.
    fn probabilities(&self, w: &mut Writer, h: &mut Helpers, hq_: &str, dp: Option<&str>) {
        let (g, r, tp) = (self.g, self.r, self.l.tp);
        let (acc_t, dims) = (g.acc_t, &g.dims);
        let exp = if g.d == DType::F64 { "exp" } else { "expf" };
        let (zero, ninf) = (g.lit(0.0), g.lit(f64::NEG_INFINITY));
        w.line("#pragma unroll");
        w.open(format!("for (int a = 0; a < {r}; ++a)"));
        w.line("#pragma unroll");
        w.open(format!("for (int b = 0; b < {r}; ++b)"));
        w.line("const int ii = ty + 16 * a, jj = tx + 16 * b;");
        w.line("const long long i = i0 + ii, j = j0 + jj;");
        w.line(format!("{acc_t} v = {zero};"));
        w.open(format!("if (i < {}LL && j < {}LL)", dims.sq, dims.sk));
        w.line(format!("{acc_t} s = sc[a][b] * {};", g.lit(g.a.scale)));
        if let Some(m) = g.idx(Role::Mask) {
            let lm = g.load(h, m, hq_, &["i", "j"]);
            w.line(format!("s = s + {lm};"));
        }
        if g.a.causal {
            w.line(format!("if (j > i) s = {ninf};"));
        }
        w.line(format!("const {acc_t} lse = ls[ii];"));
        if g.a.zero_masked_rows {
            w.line(format!("const {acc_t} p = (lse > {ninf}) ? {exp}(s - lse) : {zero};"));
        } else {
            w.line(format!("const {acc_t} p = {exp}(s - lse);"));
        }
        match dp {
            Some(dp) => w.line(format!("v = p * ({dp}[a][b] - dls[ii]) * {};", g.lit(g.a.scale))),
            None => w.line("v = p;"),
        }
        w.close();
        w.line(format!("ps[ii * {tp} + jj] = v;"));
        w.close();
        w.close();
    }

    /// `acc[a][e] += sum_k ps(row ty + 16a, k) y[k][tx + 16e]` over the tile's `t`
    /// products, `ps` read as stored (`dq`: by query row) or transposed (`dk`, `dv`).
    fn accumulate(&self, w: &mut Writer, y: &str, pitch: usize, transposed: bool) {
        let (r, e, t, tp, acc_t) = (self.r, self.e, self.l.t, self.l.tp, self.g.acc_t);
        let p = if transposed {
            format!("ps[k * {tp} + ty + 16 * a]")
        } else {
            format!("ps[(ty + 16 * a) * {tp} + k]")
        };
        w.open(format!("for (int k = 0; k < {t}; ++k)"));
        w.line(format!("{acc_t} pa[{r}], ye[{e}];"));
        w.line("#pragma unroll");
        w.line(format!("for (int a = 0; a < {r}; ++a) pa[a] = {p};"));
        w.line("#pragma unroll");
        w.line(format!(
            "for (int c = 0; c < {e}; ++c) ye[c] = {y}[k * {pitch} + tx + 16 * c];"
        ));
        unrolled2(w, ("a", r), ("c", e), "acc[a][c] += pa[a] * ye[c];");
        w.close();
    }

    /// The accumulated rows into the (contiguous) output `[b.., heads, len, od]` (query
    /// or kv heads and rows), rows from `base` of head `hd`; the forward's divided by
    /// the row's sum (see [`Self::forward`]).
    fn store(&self, w: &mut Writer, h: &mut Helpers, base: &str) {
        let (dims, dt) = (&self.g.dims, self.g.a.out.dtype);
        let (heads, len, od) = match self.kind {
            Kernel::Grad(AttentionOperand::Q) => (dims.hq, dims.sq, dims.d),
            Kernel::Grad(AttentionOperand::K) => (dims.hkv, dims.sk, dims.d),
            Kernel::Grad(AttentionOperand::V) => (dims.hkv, dims.sk, dims.dv),
            Kernel::Forward | Kernel::Lse => (dims.hq, dims.sq, dims.dv),
        };
        let zero = self.g.lit(0.0);
        let val = match self.kind {
            Kernel::Forward if dims.sk == 0 => zero,
            // `l` is 0 when every key is masked (0 / 0: NaN, as the definition), NaN
            // when a score is: with zero_masked_rows such rows give 0.
            Kernel::Forward if self.g.a.zero_masked_rows => format!("(lr[a] > {zero} ? acc[a][c] / lr[a] : {zero})"),
            Kernel::Forward => "acc[a][c] / lr[a]".to_string(),
            _ => "acc[a][c]".to_string(),
        };
        let val = match dt {
            DType::F16 | DType::BF16 => cuda::cast_c(h, DType::F32, dt, &val),
            _ => val,
        };
        let val = cuda::store_conv(h, dt, &val);
        w.line("#pragma unroll");
        w.open(format!("for (int a = 0; a < {}; ++a)", self.r));
        w.line(format!("const long long row = {base} + ty + 16 * a;"));
        w.line("#pragma unroll");
        w.open(format!("for (int c = 0; c < {}; ++c)", self.e));
        w.line("const int col = tx + 16 * c;");
        w.open(format!("if (row < {len}LL && col < {od})"));
        w.line(format!(
            "p{}[((b * {heads}LL + hd) * {len}LL + row) * {od}LL + col] = {val};",
            self.g.a.out_param
        ));
        w.close();
        w.close();
        w.close();
    }

    /// Opens the loop over key tiles `j0` of the block's query rows from `i0` (with
    /// `causal`, up to the tile of its last row), with the barrier before the tile's
    /// loads.
    fn key_tiles(&self, w: &mut Writer) {
        let t = self.l.t;
        let tiles = self.g.dims.sk.div_ceil(t);
        let end = if self.g.a.causal {
            format!("min({tiles}LL, (i0 + {}LL) / {t}LL + 1)", t - 1)
        } else {
            format!("{tiles}LL")
        };
        w.open(format!("for (long long jt = 0; jt < {end}; ++jt)"));
        w.line(format!("const long long j0 = jt * {t}LL;"));
        w.line("__syncthreads();");
    }

    /// The forward's (or `attention_lse`'s) tile body: the block's query rows from `i0`
    /// of head `hd`, their q staged once; per key tile (k, and v for the forward) the
    /// scores, each row's online-softmax update (running max `mr`, sum `lr`, the
    /// output rescaled when the max grows) and `acc += p v`. The output is `acc / lr`;
    /// `attention_lse`'s `mr + log lr` (`-inf` when every key is masked).
    fn forward(&self, w: &mut Writer, h: &mut Helpers) {
        let (g, l, r) = (self.g, &self.l, self.r);
        let (dims, acc_t) = (&g.dims, g.acc_t);
        w.line(format!("const long long kvh = hd / {}LL;", dims.group()));
        w.line(format!("const long long i0 = tile * {}LL;", l.t));
        self.load_tile(w, h, 0, "qs", "hd", "i0", dims.sq, dims.d, l.kp);
        w.line(format!("{acc_t} mr[{r}], lr[{r}];"));
        w.line("#pragma unroll");
        w.line(format!(
            "for (int a = 0; a < {r}; ++a) {{ mr[a] = {}; lr[a] = {}; }}",
            g.lit(f64::NEG_INFINITY),
            g.lit(0.0)
        ));
        self.key_tiles(w);
        self.load_tile(w, h, 1, "ks", "kvh", "j0", dims.sk, dims.d, l.kp);
        if self.kind == Kernel::Forward {
            self.load_tile(w, h, 2, "vs", "kvh", "j0", dims.sk, dims.dv, l.vp);
        }
        w.line("__syncthreads();");
        self.products(w, "sc", "qs", "ks", l.kp, dims.d);
        self.online_softmax(w, h);
        if self.kind == Kernel::Forward {
            w.line("__syncthreads();");
            self.accumulate(w, "vs", l.vp, false);
        }
        w.close();
        if self.kind == Kernel::Forward {
            self.store(w, h, "i0");
            return;
        }
        let log = if g.d == DType::F64 { "log" } else { "logf" };
        let val = format!(
            "(mr[a] == {ninf} ? mr[a] : mr[a] + {log}(lr[a]))",
            ninf = g.lit(f64::NEG_INFINITY)
        );
        let val = cuda::store_conv(h, g.a.out.dtype, &format!("({acc_t})({val})"));
        w.line("#pragma unroll");
        w.open(format!("for (int a = 0; a < {r}; ++a)"));
        w.line("const long long i = i0 + ty + 16 * a;");
        w.open(format!("if (tx == 0 && i < {}LL)", dims.sq));
        w.line(format!(
            "p{}[(b * {}LL + hd) * {}LL + i] = {val};",
            g.a.out_param, dims.hq, dims.sq
        ));
        w.close();
        w.close();
    }

    /// Each of the thread's rows: its scores of the tile (`-inf` past the keys, after
    /// the row with `causal`), the row's max over the 16 threads sharing it (`fmax`: a
    /// NaN score does not raise it, its exponential makes the row NaN), the running
    /// max and sum updated, `p = exp(s - max)` into `ps`, the output rescaled.
    fn online_softmax(&self, w: &mut Writer, h: &mut Helpers) {
        let (g, r, tp) = (self.g, self.r, self.l.tp);
        let (dims, acc_t) = (&g.dims, g.acc_t);
        let (exp, fmax) = if g.d == DType::F64 {
            ("exp", "fmax")
        } else {
            ("expf", "fmaxf")
        };
        let (zero, one, ninf) = (g.lit(0.0), g.lit(1.0), g.lit(f64::NEG_INFINITY));
        w.line("#pragma unroll");
        w.open(format!("for (int a = 0; a < {r}; ++a)"));
        w.line("const int ii = ty + 16 * a;");
        w.line("const long long i = i0 + ii;");
        w.line(format!("{acc_t} sv[{r}];"));
        w.line(format!("{acc_t} tmax = {ninf};"));
        w.line("#pragma unroll");
        w.open(format!("for (int b = 0; b < {r}; ++b)"));
        w.line("const long long j = j0 + tx + 16 * b;");
        w.line(format!("{acc_t} s = {ninf};"));
        let causal = if g.a.causal { " && j <= i" } else { "" };
        w.open(format!("if (i < {}LL && j < {}LL{causal})", dims.sq, dims.sk));
        w.line(format!("s = sc[a][b] * {};", g.lit(g.a.scale)));
        if let Some(m) = g.idx(Role::Mask) {
            let lm = g.load(h, m, "hd", &["i", "j"]);
            w.line(format!("s += {lm};"));
        }
        w.close();
        w.line("sv[b] = s;");
        w.line(format!("tmax = {fmax}(tmax, s);"));
        w.close();
        w.line("#pragma unroll");
        w.line(format!(
            "for (int off = 8; off > 0; off >>= 1) tmax = {fmax}(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));"
        ));
        w.line(format!("const {acc_t} mnew = {fmax}(mr[a], tmax);"));
        // Every key so far masked: nothing to add, nothing to rescale.
        w.line(format!("const bool none = mnew == {ninf};"));
        w.line(format!("const {acc_t} corr = none ? {one} : {exp}(mr[a] - mnew);"));
        w.line(format!("{acc_t} psum = {zero};"));
        w.line("#pragma unroll");
        w.open(format!("for (int b = 0; b < {r}; ++b)"));
        w.line(format!("const {acc_t} p = none ? {zero} : {exp}(sv[b] - mnew);"));
        w.line("psum += p;");
        w.line(format!("ps[ii * {tp} + tx + 16 * b] = p;"));
        w.close();
        w.line("#pragma unroll");
        w.line("for (int off = 8; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);");
        w.line("lr[a] = lr[a] * corr + psum;");
        w.line("mr[a] = mnew;");
        if self.e > 0 {
            w.line("#pragma unroll");
            w.line(format!("for (int c = 0; c < {}; ++c) acc[a][c] *= corr;", self.e));
        }
        w.close();
    }

    /// The dq kernel's tile body: the block's query rows from `i0` of head `hd`.
    fn dq(&self, w: &mut Writer, h: &mut Helpers) {
        let (g, l) = (self.g, &self.l);
        let dims = &g.dims;
        let (q, k, v, o) = (0, 1, 2, g.idx(Role::Dout).unwrap_or(3));
        let (lse, delta) = (g.idx(Role::Lse).unwrap_or(4), g.idx(Role::Delta).unwrap_or(5));
        w.line(format!("const long long kvh = hd / {}LL;", dims.group()));
        w.line(format!("const long long i0 = tile * {}LL;", l.t));
        self.load_tile(w, h, q, "qs", "hd", "i0", dims.sq, dims.d, l.kp);
        self.load_tile(w, h, o, "os", "hd", "i0", dims.sq, dims.dv, l.vp);
        self.load_stat(w, h, lse, "ls", "hd", "i0");
        self.load_stat(w, h, delta, "dls", "hd", "i0");
        self.key_tiles(w);
        self.load_tile(w, h, k, "ks", "kvh", "j0", dims.sk, dims.d, l.kp);
        self.load_tile(w, h, v, "vs", "kvh", "j0", dims.sk, dims.dv, l.vp);
        w.line("__syncthreads();");
        self.products(w, "sc", "qs", "ks", l.kp, dims.d);
        self.products(w, "dp", "os", "vs", l.vp, dims.dv);
        self.probabilities(w, h, "hd", Some("dp"));
        w.line("__syncthreads();");
        self.accumulate(w, "ks", l.kp, false);
        w.close();
        self.store(w, h, "i0");
    }

    /// The dk or dv kernel's tile body: the block's key rows from `j0` of kv head `hd`.
    fn dkv(&self, w: &mut Writer, h: &mut Helpers) {
        let (g, l) = (self.g, &self.l);
        let dims = &g.dims;
        let (q, k, v, o) = (0, 1, 2, g.idx(Role::Dout).unwrap_or(3));
        let (lse, delta) = (g.idx(Role::Lse).unwrap_or(4), g.idx(Role::Delta).unwrap_or(5));
        let dk = self.kind == Kernel::Grad(AttentionOperand::K);
        let group = dims.group();
        w.line(format!("const long long j0 = tile * {}LL;", l.t));
        self.load_tile(w, h, k, "ks", "hd", "j0", dims.sk, dims.d, l.kp);
        if dk {
            self.load_tile(w, h, v, "vs", "hd", "j0", dims.sk, dims.dv, l.vp);
        }
        let tiles = dims.sq.div_ceil(l.t);
        let start = if g.a.causal {
            format!("j0 / {}LL", l.t)
        } else {
            "0".into()
        };
        w.open(format!("for (long long hh = 0; hh < {group}LL; ++hh)"));
        w.line(format!("const long long hq_ = hd * {group}LL + hh;"));
        w.open(format!("for (long long it = {start}; it < {tiles}LL; ++it)"));
        w.line(format!("const long long i0 = it * {}LL;", l.t));
        w.line("__syncthreads();");
        self.load_tile(w, h, q, "qs", "hq_", "i0", dims.sq, dims.d, l.kp);
        self.load_tile(w, h, o, "os", "hq_", "i0", dims.sq, dims.dv, l.vp);
        self.load_stat(w, h, lse, "ls", "hq_", "i0");
        if dk {
            self.load_stat(w, h, delta, "dls", "hq_", "i0");
        }
        w.line("__syncthreads();");
        self.products(w, "sc", "qs", "ks", l.kp, dims.d);
        if dk {
            self.products(w, "dp", "os", "vs", l.vp, dims.dv);
        }
        self.probabilities(w, h, "hq_", dk.then_some("dp"));
        w.line("__syncthreads();");
        if dk {
            self.accumulate(w, "qs", l.kp, true);
        } else {
            self.accumulate(w, "os", l.vp, true);
        }
        w.close();
        w.close();
        self.store(w, h, "j0");
    }
}

/// `body` over `outer` x `inner` (a variable and its constant trip count each), both
/// loops under `#pragma unroll` (each pragma takes the one loop after it).
fn unrolled2(w: &mut Writer, outer: (&str, usize), inner: (&str, usize), body: &str) {
    let ((a, na), (b, nb)) = (outer, inner);
    w.line("#pragma unroll");
    w.open(format!("for (int {a} = 0; {a} < {na}; ++{a})"));
    w.line("#pragma unroll");
    w.line(format!("for (int {b} = 0; {b} < {nb}; ++{b}) {body}"));
    w.close();
}

/// The kernel `kind` for `g`'s operands on CUDA cores.
pub(super) fn generate(g: &Gen<'_>, kind: Kernel) -> (String, Helpers, LaunchConfig) {
    let dims = &g.dims;
    let size = if g.d == DType::F64 { 8 } else { 4 };
    let l = layout(dims.d, dims.dv, size, kind);
    let od = match kind {
        Kernel::Grad(AttentionOperand::Q | AttentionOperand::K) => dims.d,
        Kernel::Grad(AttentionOperand::V) | Kernel::Forward => dims.dv,
        Kernel::Lse => 0,
    };
    let tl = Tiled {
        g,
        r: l.t / 16,
        e: od.div_ceil(16),
        l,
        kind,
    };
    let nb: usize = dims.batch.iter().product();
    let (heads, len) = if kind.by_query() {
        (dims.hq, dims.sq)
    } else {
        (dims.hkv, dims.sk)
    };
    let per = len.div_ceil(tl.l.t);
    let tiles = nb * heads * per;
    let mut h = Helpers::new();
    let mut w = Writer::new();
    w.line(format!(
        "// {}: {nb} x {} heads ({} kv), sq {}, sk {}, d {}, dv {}, scale {}, {}{}{}; CUDA cores, {} {} rows per block, {} per streamed tile",
        match kind {
            Kernel::Forward => "attention".to_string(),
            Kernel::Lse => "attention_lse".to_string(),
            Kernel::Grad(wrt) => format!("attention_grad of {}", wrt.name()),
        },
        dims.hq,
        dims.hkv,
        dims.sq,
        dims.sk,
        dims.d,
        dims.dv,
        g.a.scale,
        if g.a.causal { "causal" } else { "not causal" },
        if dims.masked { ", additive mask" } else { "" },
        if g.a.zero_masked_rows { ", fully masked rows give 0" } else { "" },
        tl.l.t,
        if kind.by_query() { "query" } else { "key" },
        tl.l.t,
    ));
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}, 2) {}({})",
        cuda::ENTRY_PLACEHOLDER,
        g.a.params_decl
    ));
    w.line("extern __shared__ __align__(16) unsigned char smem[];");
    let mut off = 0;
    for (name, n) in &tl.l.bufs {
        w.line(format!(
            "{0}* const {name} = reinterpret_cast<{0}*>(smem) + {off};",
            g.acc_t
        ));
        off += n;
    }
    w.line("const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;");
    w.open(format!("for (long long t = blockIdx.x; t < {tiles}LL; t += gridDim.x)"));
    w.line(format!("const long long b = t / {}LL;", heads * per));
    w.line(format!("const long long hd = (t / {per}LL) % {heads}LL;"));
    w.line(format!("const long long tile = t % {per}LL;"));
    super::backward::batch_coords(&mut w, &dims.batch);
    if tl.e > 0 {
        w.line(format!("{} acc[{}][{}];", g.acc_t, tl.r, tl.e));
        unrolled2(
            &mut w,
            ("a", tl.r),
            ("c", tl.e),
            &format!("acc[a][c] = {};", g.lit(0.0)),
        );
    }
    match kind {
        Kernel::Forward | Kernel::Lse => tl.forward(&mut w, &mut h),
        Kernel::Grad(AttentionOperand::Q) => tl.dq(&mut w, &mut h),
        Kernel::Grad(_) => tl.dkv(&mut w, &mut h),
    }
    // The next tile's loads overwrite what this one's last products read.
    w.line("__syncthreads();");
    w.close();
    w.close();
    let bytes = tl.l.elems() * size;
    (
        w.finish(),
        h,
        LaunchConfig {
            block: THREADS as u32,
            grid: GridSize::PerSm {
                blocks_per_sm: (2048 / THREADS) as u32,
                max_blocks: tiles.clamp(1, u32::MAX as usize) as u32,
            },
            shared_mem_bytes: bytes as u32,
        },
    )
}
