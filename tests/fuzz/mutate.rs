//! Mutations of model files as a hostile user would make them: bytes (flips,
//! interesting integers, inserts, deletes, splices, truncation), ONNX structure (dims,
//! attributes, opsets, node order and names, external data), `.gir` text (lines and
//! tokens), each seeded so a failure replays.

use graphc::ir::onnx::proto::{self, attribute_type, ModelProto, StringStringEntryProto};
use graphc::ir::Rng;
use prost::Message;

/// Integers that break size arithmetic.
const INTERESTING: [i64; 14] = [
    0,
    1,
    -1,
    2,
    255,
    65_535,
    i32::MAX as i64,
    i32::MIN as i64,
    1 << 32,
    1 << 40,
    1 << 62,
    i64::MAX,
    i64::MIN,
    16_777_216,
];

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> Option<&'a T> {
    if items.is_empty() {
        None
    } else {
        items.get(rng.below(items.len() as u64) as usize)
    }
}

/// A random element to change (drawing one number even when there is none, so the
/// sequence does not depend on emptiness).
fn pick_mut<'a, T>(rng: &mut Rng, items: &'a mut [T]) -> Option<&'a mut T> {
    let n = items.len().max(1) as u64;
    items.get_mut(rng.below(n) as usize)
}

fn interesting(rng: &mut Rng) -> i64 {
    *pick(rng, &INTERESTING).unwrap_or(&0)
}

/// One byte-level mutation.
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>) {
    let len = data.len().max(1) as u64;
    let at = rng.below(len) as usize;
    match rng.below(8) {
        0 => {
            if let Some(b) = data.get_mut(at) {
                *b ^= 1 << rng.below(8);
            }
        }
        1 => {
            if let Some(b) = data.get_mut(at) {
                *b = *pick(rng, &[0u8, 0xff, 0x7f, 0x80, 0x01]).unwrap_or(&0);
            }
        }
        2 => {
            let v = interesting(rng).to_le_bytes();
            let n = if rng.bool() { 8 } else { 4 };
            for (i, b) in v.iter().take(n).enumerate() {
                if let Some(d) = data.get_mut(at + i) {
                    *d = *b;
                }
            }
        }
        3 => {
            let n = 1 + rng.below(16) as usize;
            let ins: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
            let at = at.min(data.len());
            data.splice(at..at, ins);
        }
        4 => {
            let end = (at + 1 + rng.below(64) as usize).min(data.len());
            if at < end {
                data.drain(at..end);
            }
        }
        5 => {
            // Duplicate a range somewhere else.
            let end = (at + 1 + rng.below(256) as usize).min(data.len());
            if at < end {
                let chunk = data[at..end].to_vec();
                let to = rng.below(data.len() as u64 + 1) as usize;
                data.splice(to..to, chunk);
            }
        }
        6 => data.truncate(at),
        _ => {
            // A varint field value replaced by a huge one (protobuf lengths and ints).
            let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
            let at = at.min(data.len());
            data.splice(at..at, huge.iter().copied());
        }
    }
}

/// A structural mutation of an ONNX model (applied to a decoded copy).
pub fn onnx(rng: &mut Rng, m: &mut ModelProto) {
    let Some(g) = m.graph.as_mut() else {
        return;
    };
    match rng.below(12) {
        0 => {
            if let Some(o) = m.opset_import.first_mut() {
                o.version = *pick(rng, &[0, -1, 1, 7, 12, 13, 18, 21, 22, 99, 1 << 62]).unwrap_or(&0);
            }
        }
        1 => {
            // A dim of an initializer.
            if let Some(t) = pick_mut(rng, &mut g.initializer) {
                if let Some(d) = pick_mut(rng, &mut t.dims) {
                    *d = interesting(rng);
                }
            }
        }
        2 => {
            // A dim of an input.
            if let Some(i) = pick_mut(rng, &mut g.input) {
                if let Some(proto::type_proto::Value::TensorType(t)) = i.r#type.as_mut().and_then(|t| t.value.as_mut())
                {
                    if let Some(s) = t.shape.as_mut() {
                        if let Some(d) = pick_mut(rng, &mut s.dim) {
                            d.value = Some(proto::tensor_shape_proto::dimension::Value::DimValue(interesting(rng)));
                        }
                    }
                }
            }
        }
        3 => {
            // An attribute's ints or int.
            if let Some(node) = pick_mut(rng, &mut g.node) {
                if let Some(a) = pick_mut(rng, &mut node.attribute) {
                    let v = interesting(rng);
                    if let Some(x) = a.ints.first_mut() {
                        *x = v;
                    } else {
                        a.i = v;
                    }
                    if rng.below(4) == 0 {
                        a.r#type = rng.below(16) as i32;
                    }
                    if rng.below(4) == 0 {
                        a.r#type = attribute_type::INTS;
                        a.ints = vec![v, v.wrapping_neg(), 0];
                    }
                }
            }
        }
        4 => {
            // Two nodes swapped (use before definition).
            let n = g.node.len();
            if n >= 2 {
                let a = rng.below(n as u64) as usize;
                let b = rng.below(n as u64) as usize;
                g.node.swap(a, b);
            }
        }
        5 => {
            // A node duplicated (two writers of one name).
            let n = g.node.len() as u64;
            if let Some(node) = g.node.get(rng.below(n.max(1)) as usize).cloned() {
                g.node.push(node);
            }
        }
        6 => {
            // An operand renamed to another value's name.
            let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).collect();
            let name = pick(rng, &names).cloned().unwrap_or_default();
            if let Some(node) = pick_mut(rng, &mut g.node) {
                if let Some(i) = pick_mut(rng, &mut node.input) {
                    *i = name;
                }
            }
        }
        7 => {
            // External data pointed somewhere else.
            if let Some(t) = pick_mut(rng, &mut g.initializer) {
                let (key, value) = match rng.below(8) {
                    0 => ("location", "../outside/secret.bin".to_string()),
                    1 => ("location", "/etc/passwd".to_string()),
                    2 => ("location", "data.link".to_string()),
                    3 => ("offset", interesting(rng).to_string()),
                    4 => ("length", interesting(rng).to_string()),
                    5 => ("location", "dir.link/secret.bin".to_string()),
                    6 => ("location", "out.fifo".to_string()),
                    _ => ("location", "model.onnx".to_string()),
                };
                t.data_location = 1;
                t.external_data.retain(|e| e.key != key);
                t.external_data.push(StringStringEntryProto { key: key.into(), value });
            }
        }
        8 => {
            // A node's op type replaced by another node's.
            let types: Vec<String> = g.node.iter().map(|n| n.op_type.clone()).collect();
            let t = pick(rng, &types).cloned().unwrap_or_default();
            if let Some(node) = pick_mut(rng, &mut g.node) {
                node.op_type = t;
            }
        }
        9 => {
            // A node dropped.
            let n = g.node.len() as u64;
            if n > 0 {
                g.node.remove(rng.below(n) as usize);
            }
        }
        10 => {
            // An initializer's element type changed.
            if let Some(t) = pick_mut(rng, &mut g.initializer) {
                t.data_type = rng.below(24) as i32;
            }
        }
        _ => {
            // A graph output renamed to an input's name.
            let first_input = g.input.first().map(|i| i.name.clone()).unwrap_or_default();
            if let Some(o) = g.output.first_mut() {
                o.name = first_input;
            }
        }
    }
}

/// Mutated ONNX bytes: structural mutations through a decode (when the bytes decode),
/// else byte mutations.
pub fn onnx_bytes(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    let rounds = 1 + rng.below(3);
    let mut out = data.to_vec();
    for _ in 0..rounds {
        if rng.below(3) != 0 {
            if let Ok(mut m) = ModelProto::decode(out.as_slice()) {
                onnx(rng, &mut m);
                out = m.encode_to_vec();
                continue;
            }
        }
        bytes(rng, &mut out);
    }
    out
}

/// Tokens a hostile `.gir` might hold in place of a number or a name.
const GIR_TOKENS: [&str; 20] = [
    "data.link",
    "dir.link/secret.bin",
    "../outside/secret.bin",
    "out.fifo",
    "0",
    "-1",
    "4294967296",
    "18446744073709551616",
    "1099511627776",
    "1e308",
    "nan",
    "%0",
    "%999999",
    "[]",
    "[0]",
    "{",
    "}",
    "\"",
    "f32[1099511627776,1099511627776]",
    "(%1, %1, %1, %1)",
];

/// One text mutation of a `.gir`.
pub fn gir(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len().max(1) as u64;
    let a = rng.below(n) as usize;
    let b = rng.below(n) as usize;
    match rng.below(6) {
        0 if a < lines.len() && b < lines.len() => lines.swap(a, b),
        1 if a < lines.len() => {
            lines.remove(a);
        }
        2 if a < lines.len() => {
            let l = lines[a].clone();
            lines.insert(b.min(lines.len()), l);
        }
        3 if a < lines.len() => {
            // A number or identifier token replaced.
            let line = &lines[a];
            let starts: Vec<usize> = line
                .char_indices()
                .filter(|(i, c)| {
                    c.is_ascii_alphanumeric()
                        && line[..*i]
                            .chars()
                            .last()
                            .is_none_or(|p| !p.is_ascii_alphanumeric() && p != '.')
                })
                .map(|(i, _)| i)
                .collect();
            if let Some(&s) = pick(rng, &starts) {
                let e = line[s..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
                    .map_or(line.len(), |k| s + k);
                let tok = pick(rng, &GIR_TOKENS).copied().unwrap_or("0");
                lines[a] = format!("{}{tok}{}", &line[..s], &line[e..]);
            }
        }
        4 if a < lines.len() => {
            // A line repeated many times (wide inputs).
            let l = lines[a].clone();
            let k = 1 + rng.below(200) as usize;
            for _ in 0..k {
                lines.insert(a, l.clone());
            }
        }
        _ => {
            let mut raw = lines.join("\n").into_bytes();
            bytes(rng, &mut raw);
            return String::from_utf8_lossy(&raw).into_owned();
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}
