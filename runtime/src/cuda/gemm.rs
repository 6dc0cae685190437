//! GEMM preparation at load: the cuBLASLt handle, and for every GEMM of the launch
//! plan its matmul descriptor (compute type, transposes, epilogue, bias), its four
//! matrix layouts (with batch count and stride) and the algorithm cuBLASLt's heuristic
//! picks under the workspace and the operands' alignment ([`PreparedGemm`]).

use std::ffi::c_void;
use std::panic::catch_unwind;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lts;

use graphc_compiler::codegen::{GemmCompute, GemmEpilogue};
use graphc_ir::DType;

use super::launch::{LtMatmul, LtMatrix, Region};
use super::CudaError;

/// Whether libcublasLt can be loaded (never panics).
pub(super) fn cublaslt_available() -> bool {
    // SAFETY: only tries to open the library.
    catch_unwind(|| unsafe { lts::is_culib_present() }).unwrap_or(false)
}

/// The cuBLASLt handle.
pub(super) struct LtHandle(pub(super) lts::cublasLtHandle_t);

impl LtHandle {
    pub(super) fn new() -> Result<LtHandle, CudaError> {
        Ok(LtHandle(
            lt::create_handle().map_err(|e| CudaError::NoCublasLt(format!("cublasLtCreate: {e}")))?,
        ))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once, after every descriptor.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// One GEMM's descriptors and algorithm, chosen at load.
pub(super) struct PreparedGemm {
    pub(super) desc: lts::cublasLtMatmulDesc_t,
    pub(super) layouts: [lts::cublasLtMatrixLayout_t; 4],
    pub(super) algo: lts::cublasLtMatmulAlgo_t,
    pub(super) a: u64,
    pub(super) b: u64,
    pub(super) c: u64,
    pub(super) d: u64,
    /// alpha and beta, as f32 or f64 (the scale type).
    pub(super) alpha: [u8; 8],
    pub(super) beta: [u8; 8],
}

impl Drop for PreparedGemm {
    fn drop(&mut self) {
        // SAFETY: created in `prepare_gemm`, destroyed once.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

fn lt_dtype(d: DType) -> Result<lts::cudaDataType, String> {
    Ok(match d {
        DType::F32 => lts::cudaDataType::CUDA_R_32F,
        DType::F16 => lts::cudaDataType::CUDA_R_16F,
        DType::BF16 => lts::cudaDataType::CUDA_R_16BF,
        DType::F64 => lts::cudaDataType::CUDA_R_64F,
        other => return Err(format!("cuBLASLt GEMM of {other}")),
    })
}

/// Largest power of two (up to 256) dividing `addr`.
fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        256
    } else {
        (1u64 << addr.trailing_zeros().min(8)) as u32
    }
}

/// A cuBLASLt error as (call, code).
fn e(call: &'static str) -> impl Fn(lt::CublasError) -> (String, String) {
    move |x| (call.to_string(), format!("{:?}", x.0))
}

/// Create one GEMM's cuBLASLt descriptors and pick its algorithm. Errors: (call, code).
pub(super) fn prepare_gemm(
    handle: lts::cublasLtHandle_t,
    g: &LtMatmul,
    tf32: bool,
    workspace_bytes: u64,
    base: &dyn Fn(Region) -> u64,
) -> Result<PreparedGemm, (String, String)> {
    let dt = lt_dtype(g.dtype).map_err(|m| ("cuBLASLt type".to_string(), m))?;
    let (compute, scale) = match g.compute {
        GemmCompute::F64 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            lts::cudaDataType::CUDA_R_64F,
        ),
        GemmCompute::F32 if tf32 && g.dtype == DType::F32 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            lts::cudaDataType::CUDA_R_32F,
        ),
        GemmCompute::F32 => (
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        ),
    };
    let addr = |m: &LtMatrix| base(m.addr.region) + m.addr.offset;
    let mut p = PreparedGemm {
        desc: std::ptr::null_mut(),
        layouts: [std::ptr::null_mut(); 4],
        // SAFETY: a plain-data struct; overwritten by the heuristic below.
        algo: unsafe { std::mem::zeroed() },
        a: addr(&g.a),
        b: addr(&g.b),
        c: g.c.as_ref().map(addr).unwrap_or(addr(&g.d)),
        d: addr(&g.d),
        alpha: [0; 8],
        beta: [0; 8],
    };
    if g.compute == GemmCompute::F64 {
        p.alpha = g.alpha.to_le_bytes();
        p.beta = g.beta.to_le_bytes();
    } else {
        p.alpha[..4].copy_from_slice(&(g.alpha as f32).to_le_bytes());
        p.beta[..4].copy_from_slice(&(g.beta as f32).to_le_bytes());
    }
    p.desc = lt::create_matmul_desc(compute, scale).map_err(e("cublasLtMatmulDescCreate"))?;
    set_desc_attributes(&p, g, base)?;
    create_layouts(&mut p, g, dt)?;
    p.algo = pick_algorithm(handle, &p, workspace_bytes)?;
    Ok(p)
}

/// The descriptor's transposes, epilogue and bias pointer.
fn set_desc_attributes(p: &PreparedGemm, g: &LtMatmul, base: &dyn Fn(Region) -> u64) -> Result<(), (String, String)> {
    use lts::cublasLtMatmulDescAttributes_t as D;
    // SAFETY: every attribute buffer is a live local of the size passed.
    unsafe {
        let set = |attr: D, ptr: *const c_void, size: usize| {
            lt::set_matmul_desc_attribute(p.desc, attr, ptr, size).map_err(e("cublasLtMatmulDescSetAttribute"))
        };
        let ta: i32 = g.transa as i32;
        let tb: i32 = g.transb as i32;
        set(D::CUBLASLT_MATMUL_DESC_TRANSA, &ta as *const i32 as *const c_void, 4)?;
        set(D::CUBLASLT_MATMUL_DESC_TRANSB, &tb as *const i32 as *const c_void, 4)?;
        let epi = match g.epilogue {
            GemmEpilogue::None => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            GemmEpilogue::Bias => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            GemmEpilogue::Relu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            GemmEpilogue::Gelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            GemmEpilogue::BiasRelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            GemmEpilogue::BiasGelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            GemmEpilogue::DGelu => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DGELU,
            // The bias pointer is then written: the operand summed over k.
            GemmEpilogue::BGradA => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADA,
            GemmEpilogue::BGradB => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADB,
        };
        set(
            D::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi as *const lts::cublasLtEpilogue_t as *const c_void,
            std::mem::size_of::<lts::cublasLtEpilogue_t>(),
        )?;
        if let Some(b) = g.bias {
            let ptr: u64 = base(b.region) + b.offset;
            set(
                D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr as *const u64 as *const c_void,
                8,
            )?;
        }
        // DGELU's aux matrix (its type is D's, cuBLASLt's default).
        if let Some(x) = &g.aux {
            let ptr: u64 = base(x.addr.region) + x.addr.offset;
            let ld: i64 = x.ld;
            let stride: i64 = x.batch_stride;
            set(
                D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                &ptr as *const u64 as *const c_void,
                8,
            )?;
            set(
                D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                &ld as *const i64 as *const c_void,
                8,
            )?;
            if g.batch > 1 {
                set(
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                    &stride as *const i64 as *const c_void,
                    8,
                )?;
            }
        }
    }
    Ok(())
}

/// The layouts of A, B, C and D (C is D when the GEMM has none), with the batch count
/// and stride of a batched GEMM.
fn create_layouts(p: &mut PreparedGemm, g: &LtMatmul, dt: lts::cudaDataType) -> Result<(), (String, String)> {
    let c = g.c.as_ref().unwrap_or(&g.d);
    for (i, m) in [&g.a, &g.b, c, &g.d].into_iter().enumerate() {
        p.layouts[i] = lt::create_matrix_layout(dt, m.rows, m.cols, m.ld).map_err(e("cublasLtMatrixLayoutCreate"))?;
        if g.batch > 1 {
            let count =
                i32::try_from(g.batch).map_err(|_| ("batch count".to_string(), format!("{} batches", g.batch)))?;
            let stride: i64 = m.batch_stride;
            use lts::cublasLtMatrixLayoutAttribute_t as L;
            // SAFETY: live locals of the sizes passed.
            unsafe {
                lt::set_matrix_layout_attribute(
                    p.layouts[i],
                    L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    4,
                )
                .map_err(e("cublasLtMatrixLayoutSetAttribute(batch count)"))?;
                lt::set_matrix_layout_attribute(
                    p.layouts[i],
                    L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride as *const i64 as *const c_void,
                    8,
                )
                .map_err(e("cublasLtMatrixLayoutSetAttribute(batch stride)"))?;
            }
        }
    }
    Ok(())
}

/// The heuristic's algorithm for `p` within `workspace_bytes` and the operands'
/// alignment.
fn pick_algorithm(
    handle: lts::cublasLtHandle_t,
    p: &PreparedGemm,
    workspace_bytes: u64,
) -> Result<lts::cublasLtMatmulAlgo_t, (String, String)> {
    let pref = lt::create_matmul_pref().map_err(e("cublasLtMatmulPreferenceCreate"))?;
    struct Pref(lts::cublasLtMatmulPreference_t);
    impl Drop for Pref {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { lt::destroy_matmul_pref(self.0) };
        }
    }
    let pref = Pref(pref);
    use lts::cublasLtMatmulPreferenceAttributes_t as P;
    let ws: u64 = workspace_bytes;
    let aligns = [alignment(p.a), alignment(p.b), alignment(p.c), alignment(p.d)];
    // SAFETY: live locals of the sizes passed.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )
        .map_err(e("cublasLtMatmulPreferenceSetAttribute(workspace)"))?;
        for (attr, v) in [
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ]
        .into_iter()
        .zip(aligns)
        {
            lt::set_matmul_pref_attribute(pref.0, attr, &v as *const u32 as *const c_void, 4)
                .map_err(e("cublasLtMatmulPreferenceSetAttribute(alignment)"))?;
        }
        let h = lt::get_matmul_algo_heuristic(
            handle,
            p.desc,
            p.layouts[0],
            p.layouts[1],
            p.layouts[2],
            p.layouts[3],
            pref.0,
        )
        .map_err(e("cublasLtMatmulAlgoGetHeuristic (no algorithm for this GEMM)"))?;
        Ok(h.algo)
    }
}
