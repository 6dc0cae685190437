//! The instructions of each basic block of a counting build's kernel object, so the
//! performance model's issue term counts instructions, not blocks.
//!
//! A counting kernel calls `__sanitizer_cov_trace_pc` at the start of every basic block
//! (`-fsanitize-coverage=trace-pc`); the runner adds the block's weight, found by the
//! call's return address, to the lane's instructions. The weights come from the built
//! object's disassembly (`objdump -d`): the instructions from one `trace_pc` call to the
//! next, without what the host build adds and a GPU does not execute:
//!
//! - the instrumentation: calls to `__tsan_*` and `__sanitizer_*`, and the move or
//!   address computation into `%rdi` that only feeds such a call (a GPU folds the
//!   address into its load);
//! - register spills and reloads around those calls (moves to or from `(%rsp)`) and
//!   moves from register to register (x86's two-operand arithmetic copies where a
//!   GPU's three-operand form does not), the frame (`push` / `pop`, changes of `%rsp`,
//!   `ret`), padding (`nop`, `endbr64`);
//! - calls to the kernel's own functions (their blocks count themselves) and to
//!   `g_sim_note` (bookkeeping); a call to another runner entry (`g_sim_*`: a shuffle,
//!   a vote, a barrier) is one instruction.
//!
//! What remains is the host's arithmetic, loads, stores, compares and branches: one
//! x86 instruction to one SASS instruction (an uncalibrated assumption, with
//! `-ffp-contract=off` a multiply-add is two). Loops under `#pragma unroll` are unrolled
//! by the host compiler too ([`honor_unroll`]), as NVCC unrolls them, so their loop
//! control is not counted on every iteration.
//!
//! The weights are written beside the object (`<object>.w`: a `#` header line naming
//! the rules' version, then `offset weight` lines, the offset of the block's first
//! instruction in the object); without `objdump` none are written and the model falls
//! back to basic blocks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The weights file of a kernel object.
pub fn path_of(object: &Path) -> PathBuf {
    PathBuf::from(format!("{}.w", object.display()))
}

/// The weights file's first line: which rules wrote it (a file another version of
/// [`parse`] wrote is written again).
const HEADER: &str = "# graphc block weights 2\n";

/// Writes `object`'s weights file when it is missing or stale; `false` when it could
/// not be made (no `objdump`, or it failed).
pub fn ensure(object: &Path) -> bool {
    let out = path_of(object);
    if std::fs::read_to_string(&out).is_ok_and(|t| t.starts_with(HEADER)) {
        return true;
    }
    let Ok(r) = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "att"])
        .arg(object)
        .stdin(Stdio::null())
        .output()
    else {
        return false;
    };
    if !r.status.success() {
        return false;
    }
    let blocks = parse(&String::from_utf8_lossy(&r.stdout));
    let text: String = std::iter::once(HEADER.to_string())
        .chain(blocks.iter().map(|(o, w)| format!("{o:x} {w}\n")))
        .collect();
    let tmp = PathBuf::from(format!("{}.tmp{}", out.display(), std::process::id()));
    std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &out).is_ok()
}

/// A disassembled instruction: its offset, mnemonic and operands.
struct Insn<'a> {
    at: u64,
    op: &'a str,
    args: &'a str,
}

fn insn(line: &str) -> Option<Insn<'_>> {
    let (addr, rest) = line.split_once(":\t")?;
    let at = u64::from_str_radix(addr.trim(), 16).ok()?;
    let rest = rest.trim();
    let (op, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    Some(Insn {
        at,
        op,
        args: args.trim(),
    })
}

/// The called symbol of a `call` (`call 1060 <__tsan_read4@plt>`), without `@plt`.
fn callee<'a>(i: &Insn<'a>) -> Option<&'a str> {
    if !i.op.starts_with("call") {
        return None;
    }
    let s = i.args.split_once('<')?.1.split_once('>')?.0;
    Some(s.split('@').next().unwrap_or(s))
}

/// Whether `i` is host-only: instrumentation, a spill, frame or padding.
fn host_only(i: &Insn<'_>) -> bool {
    let op = i.op;
    if let Some(f) = callee(i) {
        return !f.starts_with("g_sim_") || f == "g_sim_note";
    }
    op.starts_with("call")
        || op.starts_with("push")
        || op.starts_with("pop")
        || op.starts_with("ret")
        || op.starts_with("nop")
        || op == "endbr64"
        || op == "leave"
        || op == "xchg" && i.args == "%ax,%ax"
        || op.starts_with("data16")
        || op.starts_with("cs")
        || op.starts_with("mov") && (i.args.contains("(%rsp)") || !i.args.contains(['(', '$']))
        || i.args.ends_with(",%rsp")
}

/// Instrumentation calls (`__tsan_*`, `__sanitizer_*`).
fn instrumentation(i: &Insn<'_>) -> bool {
    callee(i).is_some_and(|f| f.starts_with("__tsan_") || f.starts_with("__sanitizer_"))
}

/// `(offset, weight)` of every block of `objdump -d`'s output (see the module doc).
pub fn parse(text: &str) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    let mut in_text = false;
    // The open block's index in `out`, and whether the next instruction starts one.
    let mut open: Option<usize> = None;
    let mut starts = false;
    // The last counted instruction wrote `%rdi` (an argument, maybe the next call's).
    let mut last_rdi = false;
    for line in text.lines() {
        if let Some(s) = line.strip_prefix("Disassembly of section ") {
            in_text = s.trim_end_matches(':') == ".text";
            open = None;
            continue;
        }
        if line.ends_with(">:") {
            open = None;
            starts = false;
            continue;
        }
        let Some(i) = (if in_text { insn(line) } else { None }) else {
            continue;
        };
        if starts {
            out.push((i.at, 0));
            open = Some(out.len() - 1);
            starts = false;
            last_rdi = false;
        }
        if callee(&i) == Some("__sanitizer_cov_trace_pc") {
            starts = true;
        }
        let Some(b) = open else { continue };
        if instrumentation(&i) {
            if last_rdi && out[b].1 > 0 {
                out[b].1 -= 1;
            }
            last_rdi = false;
            continue;
        }
        if host_only(&i) {
            continue;
        }
        out[b].1 += 1;
        last_rdi = i.args.ends_with(",%rdi") && (i.op.starts_with("mov") || i.op.starts_with("lea"));
    }
    out
}

/// The host source of a counting build: `#pragma unroll` (NVCC: unroll completely
/// when the trip count is constant) as `#pragma GCC unroll 64`, `#pragma unroll N` as
/// `#pragma GCC unroll N`, so the host's loops are shaped as the GPU's.
pub fn honor_unroll(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 64);
    for line in source.lines() {
        let t = line.trim_start();
        match t.strip_prefix("#pragma unroll") {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => {
                let n = rest.trim();
                let n = if n.is_empty() { "64" } else { n };
                out.push_str(&line[..line.len() - t.len()]);
                out.push_str("#pragma GCC unroll ");
                out.push_str(n);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "\
Disassembly of section .plt:

0000000000001060 <__sanitizer_cov_trace_pc@plt>:
    1060:\tjmp    *0x5fb2(%rip)
    1066:\tpush   $0x3

Disassembly of section .text:

0000000000001239 <g_k>:
    1239:\tpush   %r15
    123b:\tsub    $0xd38,%rsp
    1243:\tcall   1060 <__sanitizer_cov_trace_pc@plt>
    1248:\tmov    %r13,%rdi
    124b:\tcall   1070 <__tsan_read4@plt>
    1250:\tmovss  0x0(%r13),%xmm1
    1256:\tmovss  %xmm1,0xc(%rsp)
    125a:\tmovaps %xmm1,%xmm2
    125c:\tmulss  0x30(%rsp),%xmm1
    1262:\taddss  %xmm0,%xmm1
    1266:\tcmp    %r15,%rbx
    1269:\tjne    1243 <g_k+0xa>
    126b:\tcall   1060 <__sanitizer_cov_trace_pc@plt>
    1270:\tcall   1080 <g_sim_warp@plt>
    1275:\tcall   1090 <g_sim_note@plt>
    127a:\tcall   1239 <g_k>
    127f:\tadd    $0xd38,%rsp
    1286:\tpop    %r15
    1288:\tret
";

    #[test]
    fn blocks_count_the_kernels_own_instructions() {
        // Block 1: the load, the multiply, the add, the compare and the branch (the
        // argument move, the tsan call, the spill and the register copy are the
        // host's); block 2: the
        // runner call (the note, the call of a function and the frame are the host's).
        assert_eq!(parse(DUMP), vec![(0x1248, 5), (0x1270, 1)]);
    }

    #[test]
    fn unroll_pragmas_become_gccs() {
        let s = "  #pragma unroll\nfor (;;) {}\n#pragma unroll 1\n#pragma unrolled\n";
        assert_eq!(
            honor_unroll(s),
            "  #pragma GCC unroll 64\nfor (;;) {}\n#pragma GCC unroll 1\n#pragma unrolled\n"
        );
    }
}
