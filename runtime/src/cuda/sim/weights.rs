//! The instructions of each basic block of a counting build's kernel object, so the
//! performance model's issue term counts instructions, not blocks.
//!
//! A counting kernel calls `__sanitizer_cov_trace_pc` at the start of every basic block
//! (`-fsanitize-coverage=trace-pc`); the runner adds the block's weight, found by the
//! call's return address, to the lane's instructions. The weights come from the built
//! object's disassembly (`objdump -d`): the instructions from one `trace_pc` call to the
//! next, without what the host build adds and a GPU does not execute:
//!
//! - the instrumentation: calls to `__tsan_*` and `__sanitizer_*`, and the
//!   immediates and address computations that only set up a call's arguments (a GPU
//!   folds the address into its load);
//! - register spills and reloads around those calls (moves to or from `(%rsp)`) and
//!   moves from register to register (x86's two-operand arithmetic copies where a
//!   GPU's three-operand form does not), the frame (`push` / `pop`, changes of `%rsp`,
//!   `ret`), padding (`nop`, `endbr64`);
//! - calls to the kernel's own functions (their blocks count themselves) and to
//!   `g_sim_note` (bookkeeping), and after `g_sim_note(3, ..)` the rest of its block
//!   (an emulated instruction's body, counted as one by the runner); a call to another
//!   runner entry (`g_sim_*`: a shuffle, a vote, a barrier) is one instruction.
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
const HEADER: &str = "# graphc block weights 3\n";

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

/// Whether `i` is host-only: a spill, a register copy, the frame or padding (calls
/// are weighed where [`parse`] meets them).
fn host_only(i: &Insn<'_>) -> bool {
    let op = i.op;
    op.starts_with("push")
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

/// `(offset, weight)` of every block of `objdump -d`'s output (see the module doc).
pub fn parse(text: &str) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    let mut in_text = false;
    // The open block's index in `out`, and whether the next instruction starts one.
    let mut open: Option<usize> = None;
    let mut starts = false;
    // The counted instructions just before, that only set up a call's arguments; the
    // value last put in `%edi`; and whether the rest of the block is an emulated
    // instruction's body (after `g_sim_note(3, ..)`, its start).
    let mut args = 0u32;
    let mut edi = None;
    let mut muted = false;
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
            (starts, args, edi, muted) = (false, 0, None, false);
        }
        if callee(&i) == Some("__sanitizer_cov_trace_pc") {
            starts = true;
        }
        let Some(b) = open else { continue };
        if muted {
            continue;
        }
        if i.op.starts_with("call") {
            let f = callee(&i);
            // A runner entry (a shuffle, a vote) is one instruction; its arguments are
            // operands, as are any other call's.
            out[b].1 -= args.min(out[b].1);
            if f.is_some_and(|f| f.starts_with("g_sim_") && f != "g_sim_note") {
                out[b].1 += 1;
            }
            muted = f == Some("g_sim_note") && edi == Some(3);
            (args, edi) = (0, None);
            continue;
        }
        if host_only(&i) {
            continue;
        }
        out[b].1 += 1;
        match argument(&i) {
            Some(v) => {
                args += 1;
                if i.args.ends_with(",%edi") {
                    edi = v;
                }
            }
            None => (args, edi) = (0, None),
        }
    }
    out
}

/// Whether `i` only puts an immediate or an address into an integer argument register
/// (`Some`, with the immediate when there is one).
fn argument(i: &Insn<'_>) -> Option<Option<u64>> {
    const REGS: [&str; 12] = [
        "%rdi", "%edi", "%rsi", "%esi", "%rdx", "%edx", "%rcx", "%ecx", "%r8", "%r8d", "%r9", "%r9d",
    ];
    let (src, dst) = i.args.rsplit_once(',')?;
    if !REGS.contains(&dst) {
        return None;
    }
    if i.op.starts_with("lea") {
        return Some(None);
    }
    let imm = src.strip_prefix('$')?;
    (i.op.starts_with("mov")).then(|| u64::from_str_radix(imm.trim_start_matches("0x"), 16).ok())
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
    1270:\tmov    $0x10,%esi
    1271:\tcall   1080 <g_sim_warp@plt>
    1275:\tcall   1090 <g_sim_note@plt>
    127a:\tcall   1239 <g_k>
    127f:\tadd    $0xd38,%rsp
    1286:\tpop    %r15
    1288:\tret
    1289:\tcall   1060 <__sanitizer_cov_trace_pc@plt>
    128e:\tor     $0x43004300,%eax
    1293:\tmov    $0x0,%edx
    1298:\tmov    $0x0,%esi
    129d:\tmov    $0x3,%edi
    12a2:\tcall   1090 <g_sim_note@plt>
    12a7:\tshr    %cl,%eax
    12a9:\tjmp    1243 <g_k+0xa>
";

    #[test]
    fn blocks_count_the_kernels_own_instructions() {
        // Block 1: the load, the multiply, the add, the compare and the branch (the
        // argument move, the tsan call, the spill and the register copy are the
        // host's); block 2: the
        // runner call (its argument, the note, the call of a function and the frame are
        // the host's); block 3: the `or` (the note's arguments, and after the note an
        // emulated instruction's body, are the host's).
        assert_eq!(parse(DUMP), vec![(0x1248, 5), (0x1270, 1), (0x128e, 1)]);
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
