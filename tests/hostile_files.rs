//! Hostile files: what graphc reads stays inside the model's folder and is a regular
//! file; what it writes replaces only regular files; memory is checked before it is
//! taken. Each refusal is an error naming the file and the rule (exit 1, no panic, no
//! hang), and leaves what it refused untouched.

mod common;

use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{repo_path, temp_dir};
use graphc::ir::onnx::proto::{
    data_type, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

/// Run graphc with a deadline: a hang is a test failure, not a stuck CI.
fn graphc(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("graphc starts");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("graphc {args:?} ran over 60 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Failed cleanly (exit 1, an `error:` line) with `fragment` in the message.
fn fails_with(o: &Output, fragment: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(1),
        "stderr: {err}\nstdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(fragment), "expected `{fragment}` in: {err}");
    err
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {}",
        path.display()
    );
}

fn is_fifo(path: &Path) -> bool {
    std::fs::symlink_metadata(path).unwrap().file_type().is_fifo()
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
    }
}

/// `y = x + w`, with `w` (u8[len]... as f32[4]) in external data at `location`.
fn external_model(dir: &Path, location: &str, length: Option<u64>) -> PathBuf {
    let entry = |k: &str, v: &str| StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    let mut external_data = vec![entry("location", location), entry("offset", "0")];
    if let Some(l) = length {
        external_data.push(entry("length", &l.to_string()));
    }
    let m = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                op_type: "Add".into(),
                name: "add".into(),
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            initializer: vec![TensorProto {
                dims: vec![4],
                data_type: data_type::FLOAT,
                name: "w".into(),
                data_location: 1,
                external_data,
                ..Default::default()
            }],
            input: vec![value_info("x", &[4])],
            output: vec![value_info("y", &[4])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn external_data_links_out_of_the_folder_are_refused() {
    let dir = temp_dir("hostile-extlink");
    let outside = temp_dir("hostile-extlink-outside");
    std::fs::write(outside.join("secret.bin"), [7u8; 16]).unwrap();
    // A link to a file outside, and a linked directory.
    symlink(outside.join("secret.bin"), dir.join("w.bin")).unwrap();
    symlink(&outside, dir.join("sub")).unwrap();
    for location in ["w.bin", "sub/secret.bin"] {
        let model = external_model(&dir, location, Some(16));
        let err = fails_with(&graphc(&["ir", s(&model)]), "outside the model's folder");
        assert!(err.contains("initializer `w`"), "{err}");
    }
    // The system's password file through a link: refused, its bytes never printed.
    std::fs::remove_file(dir.join("w.bin")).unwrap();
    symlink("/etc/passwd", dir.join("w.bin")).unwrap();
    let model = external_model(&dir, "w.bin", None);
    let o = graphc(&["ir", s(&model)]);
    fails_with(&o, "outside the model's folder");
    assert!(o.stdout.is_empty());
    // A link that stays inside the folder is fine.
    std::fs::remove_file(dir.join("w.bin")).unwrap();
    std::fs::write(dir.join("real.bin"), [0u8; 16]).unwrap();
    symlink("real.bin", dir.join("w.bin")).unwrap();
    let o = graphc(&["ir", s(&external_model(&dir, "w.bin", Some(16)))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn special_files_are_never_read_and_never_block() {
    let dir = temp_dir("hostile-special");
    mkfifo(&dir.join("w.fifo"));
    let model = external_model(&dir, "w.fifo", Some(16));
    fails_with(
        &graphc(&["ir", s(&model)]),
        "is a FIFO; graphc reads only regular files",
    );
    // The model path itself a FIFO, and a directory.
    mkfifo(&dir.join("m.onnx"));
    fails_with(&graphc(&["ir", s(&dir.join("m.onnx"))]), "is a FIFO");
    mkfifo(&dir.join("m.gir"));
    fails_with(&graphc(&["plan", s(&dir.join("m.gir"))]), "is a FIFO");
    std::fs::create_dir(dir.join("d.onnx")).unwrap();
    fails_with(&graphc(&["ir", s(&dir.join("d.onnx"))]), "is a directory");
    // A device through a link inside the folder is outside it; procfs is refused too.
    symlink("/dev/zero", dir.join("zero.bin")).unwrap();
    fails_with(
        &graphc(&["ir", s(&external_model(&dir, "zero.bin", Some(16)))]),
        "outside the model's folder",
    );
    fails_with(&graphc(&["ir", "/proc/self/status.gir"]), "No such file");
}

#[test]
fn external_data_reads_only_the_tensor_and_checks_the_range_first() {
    let dir = temp_dir("hostile-sparse");
    // A 20 GiB sparse file without a `length`: only the tensor's 16 bytes are read.
    let f = std::fs::File::create(dir.join("big.bin")).unwrap();
    f.set_len(20 << 30).unwrap();
    let start = Instant::now();
    let o = graphc(&["ir", s(&external_model(&dir, "big.bin", None))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(start.elapsed() < Duration::from_secs(20));
    // A `length` that is not the tensor's size, and a range past the end.
    fails_with(
        &graphc(&["ir", s(&external_model(&dir, "big.bin", Some(20 << 30)))]),
        "external data `length` is 21474836480 bytes but the tensor needs 16",
    );
    std::fs::write(dir.join("short.bin"), [0u8; 8]).unwrap();
    fails_with(
        &graphc(&["ir", s(&external_model(&dir, "short.bin", None))]),
        "bytes 0..16 are outside the file (8 bytes)",
    );
}

/// A copy of the example block with its `weights` line replaced.
fn gir_with_weights(dir: &Path, weights_line: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo_path("examples/models/transformer_block.gir")).unwrap();
    let text = text.replace(
        "weights \"transformer_block.safetensors\"",
        &format!("weights \"{weights_line}\""),
    );
    let path = dir.join("block.gir");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn gir_weights_stay_inside_the_folder_and_are_regular_files() {
    let dir = temp_dir("hostile-gir");
    let weights = repo_path("examples/models/transformer_block.safetensors");
    for line in [weights.to_str().unwrap(), "../transformer_block.safetensors", ""] {
        let model = gir_with_weights(&dir, line);
        fails_with(
            &graphc(&["ir", s(&model)]),
            "must be relative and inside the model's folder",
        );
    }
    symlink(&weights, dir.join("linked.safetensors")).unwrap();
    fails_with(
        &graphc(&["ir", s(&gir_with_weights(&dir, "linked.safetensors"))]),
        "outside the model's folder",
    );
    mkfifo(&dir.join("w.fifo"));
    fails_with(&graphc(&["ir", s(&gir_with_weights(&dir, "w.fifo"))]), "is a FIFO");
    // A copy inside the folder loads.
    std::fs::copy(&weights, dir.join("w.safetensors")).unwrap();
    let o = graphc(&["ir", s(&gir_with_weights(&dir, "w.safetensors"))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn safetensors_sizes_are_checked_from_the_header() {
    let dir = temp_dir("hostile-st");
    let model = gir_with_weights(&dir, "w.safetensors");
    let good = std::fs::read(repo_path("examples/models/transformer_block.safetensors")).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + n]).unwrap().to_string();
    let write = |header: &str, data: &[u8]| {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        std::fs::write(dir.join("w.safetensors"), b).unwrap();
    };
    // A header claiming more bytes than the file has.
    let mut b = good.clone();
    b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(dir.join("w.safetensors"), &b).unwrap();
    fails_with(&graphc(&["ir", s(&model)]), "the header declares 1099511627776 bytes");
    // The data cut short: offsets past the end, before anything is read.
    write(&header, &good[8 + n..good.len() / 2]);
    fails_with(&graphc(&["ir", s(&model)]), "is outside the file's");
    // A parameter with another shape in the header.
    let bad = header.replacen("[128]", "[64]", 1);
    write(&bad, &good[8 + n..]);
    let o = graphc(&["ir", s(&model)]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn outputs_replace_only_regular_files() {
    let dir = temp_dir("hostile-out");
    let block = "examples/models/transformer_block.gir";
    let inputs = "examples/models/transformer_block_inputs.npz";
    let run = |out: &Path| graphc(&["run", block, "--inputs", inputs, "--device", "cpu", "--output", s(out)]);
    // A FIFO, a link to a FIFO, a directory: refused and left as they are.
    mkfifo(&dir.join("out.fifo"));
    fails_with(
        &run(&dir.join("out.fifo")),
        "is a FIFO; graphc replaces only regular files",
    );
    assert!(is_fifo(&dir.join("out.fifo")));
    symlink("out.fifo", dir.join("link.npz")).unwrap();
    fails_with(&run(&dir.join("link.npz")), "is a FIFO");
    assert!(std::fs::symlink_metadata(dir.join("link.npz"))
        .unwrap()
        .file_type()
        .is_symlink());
    std::fs::create_dir(dir.join("d.npz")).unwrap();
    fails_with(&run(&dir.join("d.npz")), "is a directory");
    // The SVG of `plan` and the cubin folder follow the same rule.
    fails_with(
        &graphc(&["plan", block, "--svg", s(&dir.join("out.fifo"))]),
        "is a FIFO",
    );
    // A link to a regular file: the file is replaced, the link stays a link.
    std::fs::write(dir.join("target.npz"), b"old").unwrap();
    symlink("target.npz", dir.join("to-target.npz")).unwrap();
    let o = run(&dir.join("to-target.npz"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::symlink_metadata(dir.join("to-target.npz"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(graphc::npz::read_arrays(&dir.join("target.npz")).is_ok());
    // No temporary file is left behind.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A `.gir` whose one input is `f32[shape]`.
fn huge_input_gir(dir: &Path, dims: &str) -> PathBuf {
    let path = dir.join("huge.gir");
    std::fs::write(
        &path,
        format!("graph {{\n  %0 = input \"x\" : f32[{dims}]\n  %1 = neg (%0) : f32[{dims}]\n  output \"y\" = %1\n}}\n"),
    )
    .unwrap();
    path
}

#[test]
fn memory_is_checked_before_it_is_taken() {
    let dir = temp_dir("hostile-mem");
    let model = huge_input_gir(&dir, "1099511627776");
    // 8 TiB of input: the plan says so before any input is made.
    fails_with(&graphc(&["run", s(&model), "--device", "cpu"]), "over");
    fails_with(
        &graphc(&["random-inputs", s(&model), "-o", s(&dir.join("in.npz"))]),
        "over",
    );
    fails_with(
        &graphc(&[
            "random-inputs",
            s(&model),
            "-o",
            s(&dir.join("in.npz")),
            "--budget",
            "100TiB",
        ]),
        "host memory",
    );
    // Within a huge budget the host is the limit: an error, never an abort.
    let o = graphc(&["run", s(&model), "--device", "cpu", "--budget", "100TiB"]);
    fails_with(&o, "host memory");
}

/// An `.npz` with one array `name` whose header declares `dims` (f4) and whose data is
/// `data_len` zero bytes, deflated (a zip bomb when `data_len` is large).
fn npz_with(path: &Path, name: &str, dims: &str, data_len: usize) {
    use std::io::Write;
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims}), }}");
    while (header.len() + 11) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    zip.start_file(format!("{name}.npy"), opts).unwrap();
    zip.write_all(&npy).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = data_len;
    while left > 0 {
        let n = left.min(zeros.len());
        zip.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    zip.finish().unwrap();
}

#[test]
fn npz_headers_are_checked_before_inflating() {
    let dir = temp_dir("hostile-npz");
    let model = huge_input_gir(&dir, "4");
    let run = |npz: &Path| graphc(&["run", s(&model), "--device", "cpu", "--inputs", s(npz)]);
    // 256 MiB of zeros deflate to a few hundred KiB; the header's shape is refused first.
    let bomb = dir.join("bomb.npz");
    npz_with(&bomb, "x", "67108864,", 256 << 20);
    assert!(std::fs::metadata(&bomb).unwrap().len() < 4 << 20);
    let start = Instant::now();
    fails_with(&run(&bomb), "input \"x\" must be f32[4], the file has f32[67108864]");
    // An array that is not an input is never inflated.
    npz_with(&bomb, "other", "67108864,", 256 << 20);
    fails_with(&run(&bomb), "array \"other\" is not an input of the model");
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    // A header that declares its own length as 4 GiB.
    let mut npy = b"\x93NUMPY\x02\x00".to_vec();
    npy.extend_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(dir.join("x.npy"), &npy).unwrap();
    fails_with(&run(&dir.join("x.npy")), "the header declares 4294967295 bytes");
    // Data shorter than its header says.
    npz_with(&bomb, "x", "4,", 8);
    fails_with(&run(&bomb), "the data ends after 2 of 4 elements");
    // The right shape runs.
    npz_with(&bomb, "x", "4,", 16);
    let o = run(&bomb);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_kernel_cache_reads_and_replaces_only_regular_files() {
    use graphc_compiler::nvrtc::cache;
    let dir = temp_dir("hostile-cache");
    // A FIFO planted where an entry goes: a miss (no hang), and a write leaves it be.
    mkfifo(&dir.join("k1.cubin"));
    std::fs::write(dir.join("k1.log"), "log").unwrap();
    let start = Instant::now();
    assert!(cache::read(&dir, "k1", "cubin").is_none());
    assert!(start.elapsed() < Duration::from_secs(30), "a hang guard");
    let e = cache::write(&dir, "k1", "cubin", b"image", "log").unwrap_err();
    assert!(e.to_string().contains("is a FIFO"), "{e}");
    assert!(is_fifo(&dir.join("k1.cubin")));
    // A regular entry round-trips.
    cache::write(&dir, "k2", "cubin", b"image", "log").unwrap();
    assert_eq!(
        cache::read(&dir, "k2", "cubin"),
        Some((b"image".to_vec(), "log".to_string()))
    );
}
