//! The prelude helpers behind which codegen puts every PTX-only construct: each has an
//! inline-PTX GPU body and a CPU body (`#ifdef __CUDA_ARCH__` ... `#else` ... `#endif`);
//! the GPU bodies compile with NVRTC for sm_89 and sm_90 without warnings; the small
//! kernels of `ptx_cases` (one per helper, with their checkers) are well formed.
//!
//! The CPU bodies run under `--device cuda-sim`. Until that runtime runs the cases
//! itself, an external simulator can: with `GRAPHC_PTX_DUMP=<dir>` set,
//! `cases_round_trip_through_an_external_runner` writes each case to `<dir>/<name>.cu`,
//! `<name>.meta` (`entry block grid buffers output` on one line) and `<name>.in<i>.bin`;
//! with `GRAPHC_PTX_CHECK=<dir>` it reads each `<dir>/<name>.out.bin` (the output buffer
//! after the launch) and runs the case's checker on it (`GRAPHC_PTX_EXEC=gpu` for a
//! GPU's results; the simulator's by default).

mod ptx_cases;

use std::path::PathBuf;

use graphc_compiler::codegen::{prelude_source, CudaKernel, GridSize, Helper, LaunchConfig};
use graphc_compiler::nvrtc::{self, NvrtcOptions, OutputKind};
use graphc_testkit::{skip, Need};

use ptx_cases::{cases, Case, Exec};

fn kernel(c: &Case) -> CudaKernel {
    CudaKernel {
        name: c.name.clone(),
        source: c.source.clone(),
        entry: c.entry.clone(),
        params: Vec::new(),
        launch: LaunchConfig {
            block: c.block_threads,
            grid: GridSize::Fixed { blocks: c.grid_blocks },
            shared_mem_bytes: 0,
        },
        gemm: None,
    }
}

/// The lines of `src` that are inside an `#ifdef __CUDA_ARCH__` branch (not its `#else`),
/// with a check that every such block has an `#else` and an `#endif`.
fn gpu_only_lines(src: &str) -> Result<Vec<bool>, String> {
    // Per open conditional: Some(in_gpu_branch) for `#ifdef __CUDA_ARCH__`, None otherwise.
    let mut stack: Vec<(Option<bool>, bool)> = Vec::new(); // (kind, saw #else)
    let mut out = Vec::new();
    for (n, line) in src.lines().enumerate() {
        let l = line.trim();
        if l.starts_with("#if") {
            let arch = l == "#ifdef __CUDA_ARCH__";
            stack.push((arch.then_some(true), false));
        } else if l.starts_with("#else") {
            let top = stack.last_mut().ok_or(format!("line {}: #else without #if", n + 1))?;
            top.1 = true;
            if let Some(gpu) = top.0.as_mut() {
                *gpu = false;
            }
        } else if l.starts_with("#endif") {
            let (kind, saw_else) = stack.pop().ok_or(format!("line {}: #endif without #if", n + 1))?;
            if kind.is_some() && !saw_else {
                return Err(format!(
                    "line {}: #ifdef __CUDA_ARCH__ without a CPU (#else) body",
                    n + 1
                ));
            }
        }
        out.push(stack.iter().any(|(k, _)| *k == Some(true)));
    }
    if !stack.is_empty() {
        return Err("unterminated #if".to_string());
    }
    Ok(out)
}

#[test]
fn inline_ptx_is_only_in_gpu_bodies() {
    for &h in Helper::ALL {
        let src = prelude_source(&[h]);
        let gpu = gpu_only_lines(&src).unwrap_or_else(|e| panic!("{h:?}: {e}\n{src}"));
        for (line, in_gpu) in src.lines().zip(gpu) {
            let asm = line.contains("asm(") || line.contains("asm volatile(");
            assert!(!asm || in_gpu, "{h:?}: inline PTX outside #ifdef __CUDA_ARCH__: {line}");
            assert!(!line.contains("__cvta_generic_to") || in_gpu, "{h:?}: {line}");
        }
    }
    // The helpers that stand for PTX all have both bodies.
    for h in [Helper::F16, Helper::Mma, Helper::Ldmatrix, Helper::CpAsync] {
        let src = prelude_source(&[h]);
        assert!(src.contains("#ifdef __CUDA_ARCH__") && src.contains("#else"), "{h:?}");
    }
}

#[test]
fn helpers_bring_their_dependencies_in_order() {
    let s = prelude_source(&[Helper::Mma]);
    let (f16, bf16, mma) = (
        s.find("g_f16_to_f32(").unwrap(),
        s.find("g_bf16_to_f32(").unwrap(),
        s.find("g_mma_m16n8k16_bf16_f32(").unwrap(),
    );
    assert!(f16 < bf16 && bf16 < mma);
    assert!(s.contains("g_mma_m16n8k16_f16_f32("));
    // Only what is asked for.
    let c = prelude_source(&[Helper::CpAsync]);
    assert!(!c.contains("g_f16_to_f32") && !c.contains("ldmatrix") && c.contains("cp.async.wait_all"));
    assert_eq!(
        prelude_source(&[Helper::Ldmatrix, Helper::Ldmatrix]),
        prelude_source(&[Helper::Ldmatrix])
    );
    // The GPU text of the f16 conversions is what it was, inside the #ifdef.
    let f = prelude_source(&[Helper::F16]);
    assert!(f.starts_with("#ifdef __CUDA_ARCH__\n__device__ __forceinline__ float g_f16_to_f32(unsigned short h) {\n"));
    assert!(f.contains("  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));\n"));
}

#[test]
fn cases_are_well_formed() {
    let cs = cases();
    assert_eq!(cs.len(), 12);
    let mut names: Vec<&str> = cs.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cs.len(), "case names are unique");
    for c in &cs {
        assert!(
            c.source.contains(&format!("extern \"C\" __global__ void {}(", c.entry)),
            "{}",
            c.name
        );
        let sig = c.source.split(&format!("void {}(", c.entry)).nth(1).unwrap();
        let params = sig[..sig.find(')').unwrap()].split(',').count();
        assert_eq!(params, c.buffers.len(), "{}: one buffer per parameter", c.name);
        assert!(c.output < c.buffers.len());
        assert!(c.block_threads % 32 == 0 && c.block_threads <= 1024 && c.grid_blocks >= 1);
        gpu_only_lines(&c.source).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        // A kernel that wrote nothing fails its check, on either target.
        for exec in [Exec::Sim, Exec::Gpu] {
            assert!(
                (c.check)(&c.buffers[c.output], exec).is_err(),
                "{}: untouched output passes",
                c.name
            );
        }
        assert!((c.check)(&[], Exec::Sim).is_err());
    }
}

#[test]
fn gpu_bodies_compile_for_sm89_and_sm90_without_warnings() {
    if !nvrtc::available() {
        skip(Need::Nvrtc, "libnvrtc is not available (set LD_LIBRARY_PATH to use it)");
        return;
    }
    let ks: Vec<CudaKernel> = cases().iter().map(kernel).collect();
    for arch in ["sm_89", "sm_90"] {
        for output in [OutputKind::Cubin, OutputKind::Ptx] {
            let opts = NvrtcOptions {
                arch: arch.to_string(),
                output,
                use_cache: false,
                cache_dir: None,
                ..NvrtcOptions::default()
            };
            let out = nvrtc::compile(&ks, &opts).unwrap_or_else(|e| panic!("{arch}: {e}"));
            for (c, k) in out.iter().zip(&ks) {
                assert!(!c.has_warnings(), "{arch} {}: {}\n{}", k.name, c.log, k.source);
                assert!(!c.image.is_empty(), "{arch} {}", k.name);
            }
            if output == OutputKind::Ptx {
                let ptx: String = out.iter().map(|c| c.ptx().unwrap().to_string()).collect();
                for want in [
                    "cvt.rn.f16.f32",
                    "cvt.f32.f16",
                    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                    "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                    "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                    "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                    "cp.async.cg.shared.global",
                    "cp.async.ca.shared.global",
                    "cp.async.commit_group",
                    "cp.async.wait_group 2",
                    "cp.async.wait_group 0",
                    "cp.async.wait_all",
                ] {
                    assert!(ptx.contains(want), "{arch}: no {want} in the PTX");
                }
            }
        }
    }
}

/// See the file's doc: hands the cases to an external runner and checks its outputs.
#[test]
fn cases_round_trip_through_an_external_runner() {
    let dump = std::env::var_os("GRAPHC_PTX_DUMP").map(PathBuf::from);
    let check = std::env::var_os("GRAPHC_PTX_CHECK").map(PathBuf::from);
    if dump.is_none() && check.is_none() {
        return;
    }
    let exec = match std::env::var("GRAPHC_PTX_EXEC").as_deref() {
        Ok("gpu") => Exec::Gpu,
        _ => Exec::Sim,
    };
    let cs = cases();
    if let Some(d) = &dump {
        std::fs::create_dir_all(d).unwrap();
        for c in &cs {
            std::fs::write(d.join(format!("{}.cu", c.name)), &c.source).unwrap();
            let meta = format!(
                "{} {} {} {} {}\n",
                c.entry,
                c.block_threads,
                c.grid_blocks,
                c.buffers.len(),
                c.output
            );
            std::fs::write(d.join(format!("{}.meta", c.name)), meta).unwrap();
            for (i, b) in c.buffers.iter().enumerate() {
                std::fs::write(d.join(format!("{}.in{i}.bin", c.name)), b).unwrap();
            }
        }
    }
    if let Some(d) = &check {
        let mut bad = Vec::new();
        for c in &cs {
            let out = std::fs::read(d.join(format!("{}.out.bin", c.name)))
                .unwrap_or_else(|e| panic!("{}: no output: {e}", c.name));
            match (c.check)(&out, exec) {
                Ok(()) => eprintln!("{}: ok ({exec:?})", c.name),
                Err(e) => bad.push(e),
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
