//! Every hand-built kernel compiles with NVRTC for sm_89 and sm_90, with no error and
//! no warning; the cache and deduplication work; ptxas reports no register spills.
//!
//! Without libnvrtc these tests say they skipped (`graphc_testkit::skip`), unless
//! `GRAPHC_REQUIRE` lists nvrtc (ptxas for the spill check),
//! when they fail. Set LD_LIBRARY_PATH to the NVRTC wheel's folder, e.g.
//! `.venv-cuda/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib` (see
//! scripts/requirements-cuda.txt).

mod codegen_common;

use std::path::{Path, PathBuf};

use graphc_compiler::codegen::{generate_all, CudaKernel};
use graphc_compiler::nvrtc::{self, Compiled, NvrtcError, NvrtcOptions, OutputKind};

use graphc_testkit::{skip, Need};

/// Whether to run: NVRTC is there, or (skip) it is not and not required.
fn have_nvrtc() -> bool {
    if nvrtc::available() {
        return true;
    }
    skip(Need::Nvrtc, "libnvrtc is not available (set LD_LIBRARY_PATH to use it)");
    false
}

fn kernels() -> Vec<CudaKernel> {
    let mut v = Vec::new();
    for (name, p) in codegen_common::all() {
        let mut ks = generate_all(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        for k in &mut ks {
            k.name = format!("{name}_{}", k.name);
        }
        v.extend(ks);
    }
    v
}

/// A fresh folder under the system temp folder.
fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!("graphc-nvrtc-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn opts(arch: &str, output: OutputKind, cache: Option<&Path>) -> NvrtcOptions {
    NvrtcOptions {
        arch: arch.to_string(),
        output,
        cache_dir: cache.map(Path::to_path_buf),
        use_cache: cache.is_some(),
        ..NvrtcOptions::default()
    }
}

fn check_clean(compiled: &[Compiled], kernels: &[CudaKernel], what: &str) {
    let mut bad = Vec::new();
    for (c, k) in compiled.iter().zip(kernels) {
        assert_eq!(c.entry, k.entry);
        if k.has_source() {
            assert!(!c.image.is_empty(), "{what} {}: empty image", k.name);
        }
        if c.has_warnings() {
            bad.push(format!("{} ({what}):\n{}\n--- source ---\n{}", k.name, c.log, k.source));
        }
    }
    assert!(bad.is_empty(), "NVRTC warnings:\n{}", bad.join("\n\n"));
}

#[test]
fn version_is_reported() {
    if !have_nvrtc() {
        assert_eq!(nvrtc::version(), None);
        return;
    }
    let (major, minor) = nvrtc::version().unwrap();
    assert!(major >= 11, "NVRTC {major}.{minor}");
    eprintln!("NVRTC {major}.{minor}");
}

#[test]
fn every_kernel_compiles_without_warnings() {
    if !have_nvrtc() {
        return;
    }
    let ks = kernels();
    assert!(ks.iter().filter(|k| k.has_source()).count() >= 20);
    for arch in ["sm_89", "sm_90"] {
        let out = match nvrtc::compile(&ks, &opts(arch, OutputKind::Cubin, None)) {
            Ok(o) => o,
            Err(e) => {
                let src = match &e {
                    NvrtcError::Compile { kernel, .. } => ks
                        .iter()
                        .find(|k| &k.name == kernel)
                        .map(|k| k.source.clone())
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                panic!("{arch}: {e}\n--- source ---\n{src}");
            }
        };
        assert_eq!(out.len(), ks.len());
        check_clean(&out, &ks, arch);
        for c in out.iter().filter(|c| !c.image.is_empty()) {
            // An ELF image.
            assert_eq!(&c.image[..4], b"\x7fELF", "{}", c.name);
        }
    }
    let out = nvrtc::compile(&ks, &opts("sm_89", OutputKind::Ptx, None)).unwrap_or_else(|e| panic!("ptx: {e}"));
    check_clean(&out, &ks, "ptx");
    for (c, k) in out.iter().zip(&ks) {
        if k.has_source() {
            let ptx = c.ptx().unwrap();
            assert!(ptx.contains(".target sm_89"), "{}", c.name);
            assert!(ptx.contains(&format!(".entry {}", k.entry)), "{}", c.name);
        }
    }
}

#[test]
fn compile_errors_carry_the_log() {
    if !have_nvrtc() {
        return;
    }
    let mut k = kernels().remove(0);
    k.source.push_str("\nthis is not C\n");
    let e = nvrtc::compile(&[k], &opts("sm_89", OutputKind::Cubin, None)).unwrap_err();
    match e {
        NvrtcError::Compile { kernel, log } => {
            assert!(kernel.starts_with("ew_contiguous_f32"));
            assert!(log.contains("error"), "{log}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn cache_hits_bypass_and_dedupe() {
    if !have_nvrtc() {
        return;
    }
    let dir = temp_dir("cache");
    let k = kernels()
        .into_iter()
        .find(|k| k.name.starts_with("row_layernorm"))
        .unwrap();
    let o = opts("sm_89", OutputKind::Cubin, Some(&dir));
    let first = nvrtc::compile(std::slice::from_ref(&k), &o).unwrap();
    assert!(!first[0].cached);
    let second = nvrtc::compile(std::slice::from_ref(&k), &o).unwrap();
    assert!(second[0].cached, "second compile should hit the cache");
    assert_eq!(first[0].image, second[0].image);
    let bypass = NvrtcOptions {
        use_cache: false,
        ..o.clone()
    };
    assert!(!nvrtc::compile(std::slice::from_ref(&k), &bypass).unwrap()[0].cached);
    // Another arch is another entry.
    let other = nvrtc::compile(std::slice::from_ref(&k), &opts("sm_90", OutputKind::Cubin, Some(&dir))).unwrap();
    assert!(!other[0].cached);
    std::fs::remove_dir_all(&dir).ok();

    // Identical sources compile once: one image and one log in a fresh cache.
    let dir = temp_dir("dedupe");
    let mut k2 = k.clone();
    k2.name = "another_name".to_string();
    let out = nvrtc::compile(&[k.clone(), k2], &opts("sm_89", OutputKind::Cubin, Some(&dir))).unwrap();
    assert_eq!(out[0].image, out[1].image);
    assert_eq!(out[1].name, "another_name");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 2, "{files:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unavailable_nvrtc_is_an_error_not_a_panic() {
    if nvrtc::available() {
        return;
    }
    let ks = kernels();
    match nvrtc::compile(&ks, &NvrtcOptions::default()) {
        Err(NvrtcError::Unavailable(_)) => {}
        other => panic!("{other:?}"),
    }
}

/// ptxas from the nvidia-cuda-nvcc-cu12 wheel in the repository's .venv-cuda, or
/// $GRAPHC_PTXAS.
fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GRAPHC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.to_path_buf();
    let lib = root.join(".venv-cuda").join("lib");
    for py in std::fs::read_dir(lib).ok()?.flatten() {
        let p = py.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    None
}

#[test]
fn ptxas_reports_no_spills() {
    if !have_nvrtc() {
        return;
    }
    let Some(ptxas) = find_ptxas() else {
        skip(
            Need::Ptxas,
            "no ptxas (install scripts/requirements-cuda.txt into .venv-cuda or set GRAPHC_PTXAS)",
        );
        return;
    };
    let ks = kernels();
    let out = nvrtc::compile(&ks, &opts("sm_89", OutputKind::Ptx, None)).unwrap();
    let dir = temp_dir("ptxas");
    let mut spills = Vec::new();
    for (c, k) in out.iter().zip(&ks) {
        if !k.has_source() {
            continue;
        }
        let f = dir.join(format!("{}.ptx", k.name));
        std::fs::write(&f, &c.image).unwrap();
        let r = std::process::Command::new(&ptxas)
            .args(["-v", "--gpu-name", "sm_89", "-o"])
            .arg(dir.join(format!("{}.cubin", k.name)))
            .arg(&f)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&r.stderr).into_owned() + &String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "ptxas failed on {}:\n{text}", k.name);
        for line in text.lines() {
            // "..., N bytes spill stores, M bytes spill loads"
            let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
            for w in words.windows(4) {
                if w[1] == "bytes" && w[2] == "spill" && w[3] == "stores" && w[0].parse::<u64>().is_ok_and(|n| n > 0) {
                    spills.push(format!("{}: {line}", k.name));
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(spills.is_empty(), "register spills:\n{}", spills.join("\n"));
}
