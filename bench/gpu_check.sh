#!/usr/bin/env bash
# The GPU check, run once on a lent GPU machine from the repository root:
#
#   bash bench/gpu_check.sh
#
# a. environment (GPU, driver, Python packages, graphc version); stops when graphc's CUDA
#    executor finds no driver or GPU (exit 3);
# b0. `graphc selftest --device cuda`: every kind of launch on small graphs; b0s. the same
#     cases on cuda-sim (the kernels' CUDA C on the host), and the cases where they differ;
# b. correctness: `graphc run MODEL --device cuda --check` (CUDA against graphc's CPU
#    executor on the same inputs), with and without CUDA graphs, for every
#    examples/models/*.gir, the builder models (write_models), the fusion kernels
#    (kernel_bench) and the ONNX fixtures, and the SDPA fixtures in bf16 with every layer
#    in 2 parts of the batch (--chunk-tokens 2);
# b1. training: graphc train --device cuda against PyTorch's references, and a GPT-2-small
#     training step against PyTorch eager and torch.compile (bench/train_check.py);
# c. bench/torch_compare.py: graphc against PyTorch eager and torch.compile;
# d. $OUT/gpu_check.md: both tables.
#
# Results go to $OUT (./target/gpu-check when unset), written as they come:
#   gpu_check.log, gpu_check.md, correctness.tsv, runs/*.txt (each graphc run's output),
#   torch_compare.{json,md}, torch_compare_logs/*.txt
# Every command runs under `timeout`; a failing model is recorded and the script goes on.
# The whole script is meant to take at most ~8 minutes (TOTAL_BUDGET seconds).
#
# Overrides (environment): GRAPHC (graphc binary), EXAMPLES (folder with kernel_bench and
# write_models), SCRATCH (large temporary files; default /tmp/gpu_check), RUN_TIMEOUT
# (seconds per correctness run), TOTAL_BUDGET (seconds for the whole script),
# CHECK_BUDGET (seconds after which no more correctness runs start), CHECK_JOBS
# (correctness runs at once, 6; 1 when the GPU's compute mode is not Default),
# SKIP_TRAIN=1 (skip step b1), TRAIN_TIMEOUT (seconds for step b1, 200), SKIP_TORCH=1 (skip step c), TORCH_ARGS (extra arguments for torch_compare.py, e.g.
# "--small" or "--only gpt_bf16"), PYTHON (default python3).

set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)

OUT=${OUT:-$ROOT/target/gpu-check}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
GRAPHC=${GRAPHC:-$ROOT/target/release/graphc}
EXAMPLES=${EXAMPLES:-$ROOT/target/release/examples}
SCRATCH=${SCRATCH:-/tmp/gpu_check}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
TOTAL_BUDGET=${TOTAL_BUDGET:-480}
CHECK_BUDGET=${CHECK_BUDGET:-150}
CHECK_JOBS_SET=${CHECK_JOBS:+yes}
CHECK_JOBS=${CHECK_JOBS:-6}
PYTHON=${PYTHON:-python3}
case "$GRAPHC" in /*) ;; */*) GRAPHC=$ROOT/$GRAPHC ;; esac
case "$EXAMPLES" in /*) ;; *) EXAMPLES=$ROOT/$EXAMPLES ;; esac
mkdir -p "$SCRATCH" "$OUT/runs"
export GRAPHC_CACHE_DIR=${GRAPHC_CACHE_DIR:-$SCRATCH/nvrtc-cache}
# graphc loads libcuda, libnvrtc and libcublasLt at run time. The CUDA toolkit's folders
# go on the loader path in case they are not on it already, and, last, the NVIDIA wheels
# PyTorch brings (nvidia/*/lib), so a missing toolkit library still has a fallback.
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
	[ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
NV_WHEELS=$(timeout 30 "$PYTHON" -c 'import nvidia, os; p = list(nvidia.__path__)[0]; print(":".join(sorted(os.path.join(p, d, "lib") for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "lib")))))' 2>/dev/null)
[ -n "$NV_WHEELS" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$NV_WHEELS"
export LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1

exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE_PID=$!
# At exit, let tee write the last lines before the results are collected.
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT

TSV=$OUT/correctness.tsv
MD=$OUT/gpu_check.md
SECONDS=0

say() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }
section() {
	echo
	say "==== $*"
}

# Markdown: header, environment, the correctness table, torch_compare's table, notes.
write_md() {
	{
		echo "# graphc GPU check"
		echo
		echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), ${SECONDS}s; graphc: $GRAPHC_VERSION; GPU: $GPU_NAME"
		echo
		echo "## Environment"
		echo
		echo '```'
		cat "$OUT/environment.txt" 2>/dev/null
		echo '```'
		echo
		echo "## Self-test: graphc selftest --device cuda (exit code ${SELFTEST_RC:-not run})"
		echo
		echo '```'
		grep -vE '^ok ' "$OUT/runs/selftest.txt" 2>/dev/null | tail -n 40
		echo '```'
		echo
		echo "## cuda-sim vs the GPU: the self-test cases whose outcome differs (cuda-sim exit code ${SIM_RC:-not run})"
		echo
		echo '```'
		cat "$OUT/runs/selftest_diff.txt" 2>/dev/null
		echo '```'
		echo
		echo "## Correctness: CUDA vs graphc's CPU executor (graphc run --device cuda --check)"
		echo
		correctness_md
		echo
		echo "## Training: graphc train on the GPU vs PyTorch (bench/train_check.py; ${TRAIN_STATUS:-not run})"
		echo
		cat "$OUT/train_check.md" 2>/dev/null || echo "(no results)"
		echo
		echo "## graphc vs PyTorch (bench/torch_compare.py)"
		echo
		if [ -s "$OUT/torch_compare.md" ]; then
			cat "$OUT/torch_compare.md"
			[ -n "${TORCH_STATUS:-}" ] && echo && echo "torch_compare.py: $TORCH_STATUS"
		else
			echo "(no results: ${TORCH_STATUS:-not run})"
		fi
		echo
		echo "Reference (same H200, torch 2.11, bf16, measured before): MLP 3.60 ms eager / 3.47 ms compiled;"
		echo "GPT-12 19.6 ms eager, 9.45 ms compiled, 5.9 ms with SDPA."
		echo "Targets: every model correct; MLP within 5% of torch.compile; GPT faster than torch.compile"
		echo "(without SDPA); graphc's planned memory below torch's peak."
	} >"$MD.tmp" && mv "$MD.tmp" "$MD"
}

# The correctness table from correctness.tsv: one row per model, a column per mode.
correctness_md() {
	if [ "$(wc -l <"$TSV" 2>/dev/null || echo 0)" -le 1 ]; then
		echo "(no runs)"
		return
	fi
	"$PYTHON" - "$TSV" <<'EOF' 2>/dev/null || { echo '```'; cat "$TSV"; echo '```'; }
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
rows.sort(key=lambda r: int(r[0]) if r[0].isdigit() else 0)
models, cells = [], {}
for r in rows:
    r += [""] * (9 - len(r))
    model, mode, result, checks, rel, secs, rc, note = r[1:9]
    if model not in models:
        models.append(model)
    cells[(model, mode)] = (result, checks, rel, secs, note)
def cell(m, mode):
    c = cells.get((m, mode))
    if not c:
        return "-"
    result, checks, rel, secs, _ = c
    s = f"**{result}**" if result != "ok" else "ok"
    if checks:
        s += f" {checks}"
    if rel:
        s += f", max rel_l2 {rel}"
    return s + f" ({secs}s)"
print("| model | CUDA graph | --no-graph | note |")
print("|---|---|---|---|")
npass = 0
for m in models:
    notes = "; ".join(dict.fromkeys(c[4] for k, c in cells.items() if k[0] == m and c[4]))
    ok = all(cells.get((m, mode), ("?",))[0] == "ok" for mode in ("graph", "no-graph"))
    npass += ok
    print(f"| {m} | {cell(m, 'graph')} | {cell(m, 'no-graph')} | {notes} |")
print()
print(f"{npass} of {len(models)} models pass in both modes.")
EOF
}

GRAPHC_VERSION=unknown
GPU_NAME=unknown
TORCH_STATUS=""

# ---------------------------------------------------------------------------- a. environment
section "a. environment"
say "repo $ROOT, OUT $OUT, SCRATCH $SCRATCH, graphc $GRAPHC"
{
	echo "host: $(uname -srm)"
	echo "repo: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" log -1 --format=%s 2>/dev/null)"
	echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
	for lib in libcuda.so.1 libnvrtc.so.13 libnvrtc.so.12 libcublasLt.so.13 libcublasLt.so.12; do
		echo "$lib: $(ldconfig -p 2>/dev/null | grep -m1 "$lib" | sed 's/.*=> //')"
	done
	timeout 20 nvidia-smi -L </dev/null 2>&1
	timeout 20 nvidia-smi --query-gpu=name,driver_version,compute_cap,compute_mode,memory.total,memory.used --format=csv </dev/null 2>&1
	timeout 60 "$PYTHON" - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0])
for m in ("torch", "numpy", "onnx", "onnxruntime", "onnxscript", "triton"):
    try:
        mod = __import__(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
try:
    import torch
    print("torch.cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as e:
    print("torch cuda probe failed:", e)
EOF
	if [ -x "$GRAPHC" ]; then
		echo "graphc: $(timeout 20 "$GRAPHC" --version </dev/null 2>&1)"
	else
		echo "graphc: MISSING at $GRAPHC"
	fi
	for b in kernel_bench write_models; do
		[ -x "$EXAMPLES/$b" ] || echo "example binary MISSING: $EXAMPLES/$b"
	done
} >"$OUT/environment.txt"
cat "$OUT/environment.txt"
GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader </dev/null 2>/dev/null | head -1)
GPU_NAME=${GPU_NAME:-unknown}
# Parallel correctness runs need a GPU that takes several processes at once.
COMPUTE_MODE=$(timeout 20 nvidia-smi --query-gpu=compute_mode --format=csv,noheader </dev/null 2>/dev/null | head -1)
if [ -z "$CHECK_JOBS_SET" ] && [ -n "$COMPUTE_MODE" ] && [ "$COMPUTE_MODE" != Default ]; then
	say "compute mode $COMPUTE_MODE: correctness runs one at a time"
	CHECK_JOBS=1
fi
printf 'idx\tmodel\tmode\tresult\tchecks\tmax_rel_l2\tseconds\trc\tnote\n' >"$TSV"

if [ ! -x "$GRAPHC" ]; then
	say "graphc binary missing at $GRAPHC: build it (cargo build --release --bin graphc --examples) and carry it"
	TORCH_STATUS="not run: graphc missing"
	write_md
	exit 1
fi
GRAPHC_VERSION=$(timeout 20 "$GRAPHC" --version </dev/null 2>&1 | head -1)

# Does graphc's CUDA executor find the GPU? (exit 3: no driver or no GPU)
PROBE_ARGS=(run "$ROOT/examples/models/transformer_block.gir" --device cuda)
[ -f "$ROOT/examples/models/transformer_block_inputs.npz" ] &&
	PROBE_ARGS+=(--inputs "$ROOT/examples/models/transformer_block_inputs.npz")
say "probe: graphc ${PROBE_ARGS[*]}"
timeout -k 5 120 "$GRAPHC" "${PROBE_ARGS[@]}" </dev/null >"$OUT/runs/probe.txt" 2>&1
rc=$?
tail -n 15 "$OUT/runs/probe.txt"
say "probe exit code $rc"
echo "probe (graphc run transformer_block --device cuda): exit code $rc" >>"$OUT/environment.txt"
[ "$rc" != 0 ] && grep -iE '^(error|thread .* panicked)' "$OUT/runs/probe.txt" | head -n 3 >>"$OUT/environment.txt"
if [ "$rc" = 3 ]; then
	say "graphc says there is no CUDA driver or no GPU (exit 3): stopping"
	TORCH_STATUS="not run: graphc found no CUDA driver or GPU (exit 3)"
	write_md
	cat "$MD"
	exit 3
fi

# ---------------------------------------------------------------------------- b0. selftest
section "b0. graphc selftest --device cuda (every kind of launch, small)"
timeout -k 5 150 "$GRAPHC" selftest --device cuda </dev/null >"$OUT/runs/selftest.txt" 2>&1
SELFTEST_RC=$?
cat "$OUT/runs/selftest.txt"
say "selftest exit code $SELFTEST_RC"

# ---------------------------------------------------------------------------- b0s. cuda-sim
# The same cases through cuda-sim for an H200 (each kernel's CUDA C built for the host):
# a case that passes on one and fails on the other is a bug in codegen or in cuda-sim.
section "b0s. graphc selftest --device cuda-sim --sim-gpu h200 (the same cases on the host)"
timeout -k 5 120 "$GRAPHC" selftest --device cuda-sim --sim-gpu h200 </dev/null >"$OUT/runs/selftest_sim.txt" 2>&1
SIM_RC=$?
tail -n 3 "$OUT/runs/selftest_sim.txt"
say "cuda-sim selftest exit code $SIM_RC"
outcomes() { awk '$1 == "ok" || $1 == "FAIL" { o = $1; $1 = ""; sub(/ +[0-9]+ kernels .*/, ""); print o "\t" $0 }' "$1" | sort -t "$(printf '\t')" -k2; }
outcomes "$OUT/runs/selftest.txt" >"$OUT/runs/selftest.outcomes"
outcomes "$OUT/runs/selftest_sim.txt" >"$OUT/runs/selftest_sim.outcomes"
join -t "$(printf '\t')" -1 2 -2 2 "$OUT/runs/selftest.outcomes" "$OUT/runs/selftest_sim.outcomes" |
	awk -F '\t' '$2 != $3 { print "differs: " $1 ": GPU " $2 ", cuda-sim " $3 }' >"$OUT/runs/selftest_diff.txt"
cat "$OUT/runs/selftest_diff.txt"
say "cases where the GPU and cuda-sim disagree: $(wc -l <"$OUT/runs/selftest_diff.txt")"

# ---------------------------------------------------------------------------- b. correctness
section "b. correctness"
MODELS_DIR=$SCRATCH/models
KERNELS_DIR=$SCRATCH/kernels
rm -rf "$MODELS_DIR" "$KERNELS_DIR"
if [ -x "$EXAMPLES/write_models" ]; then
	timeout -k 5 120 "$EXAMPLES/write_models" "$MODELS_DIR" </dev/null 2>&1 || say "write_models failed (rc $?)"
else
	say "no write_models binary at $EXAMPLES/write_models: builder models skipped"
fi
if [ -x "$EXAMPLES/kernel_bench" ]; then
	timeout -k 5 180 "$EXAMPLES/kernel_bench" "$KERNELS_DIR" </dev/null 2>&1 || say "kernel_bench failed (rc $?)"
else
	say "no kernel_bench binary at $EXAMPLES/kernel_bench: fusion kernels skipped"
fi

# check IDX LABEL MODE MODEL [ARGS...]: one `graphc run --check`, one line in correctness.tsv.
check() {
	local idx=$1 label=$2 mode=$3 model=$4
	shift 4
	local args=(run "$model" --device cuda --check "$@")
	[ "$mode" = no-graph ] && args+=(--no-graph)
	local log="$OUT/runs/${label//\//_}.$mode.txt"
	if [ "$SECONDS" -ge "$CHECK_BUDGET" ]; then
		printf '%s\t%s\t%s\tskipped\t\t\t0\t\tpast the correctness budget (%ss)\n' "$idx" "$label" "$mode" "$CHECK_BUDGET" >>"$TSV"
		say "skip $label ($mode): past the correctness budget"
		return
	fi
	local t0=$SECONDS
	echo "\$ graphc ${args[*]}" >"$log"
	timeout -k 5 "$RUN_TIMEOUT" "$GRAPHC" "${args[@]}" </dev/null >>"$log" 2>&1
	local rc=$?
	local secs=$((SECONDS - t0))
	local nok nfail rel result note
	nok=$(grep -cE '^check[[:space:]].*[[:space:]]ok[[:space:]]*$' "$log")
	nfail=$(grep -cE '^check[[:space:]].*FAIL[[:space:]]*$' "$log")
	rel=$(awk '$1 == "check" { for (i = 2; i < NF; i++) if ($i == "rel_l2") { v = $(i + 1) + 0; if (!seen || v > m) { m = v; seen = 1 } } }
		END { if (seen) printf "%.2e", m }' "$log")
	note=""
	case "$rc" in
	0) if [ "$nok" -gt 0 ] && [ "$nfail" = 0 ]; then result=ok; else
		result=error
		note="exit 0 but no 'check ... ok' line"
	fi ;;
	124 | 137) result=TIMEOUT note="killed after ${RUN_TIMEOUT}s" ;;
	3) result="no GPU" ;;
	*) if [ "$nfail" -gt 0 ]; then result=FAIL; else result=error; fi ;;
	esac
	if [ "$result" = FAIL ]; then
		note="failing: $(awk '$1 == "check" && $NF == "FAIL" { printf "%s%s", sep, $2; sep = ", " }' "$log" | cut -c1-200)"
	elif [ "$result" != ok ] && [ -z "$note" ]; then
		# The error message (graphc prints "error: ..." on stderr), else the last lines.
		note=$(grep -iE '^(error|thread .* panicked)' "$log" | head -n 2)
		[ -z "$note" ] && note=$(grep -v '^\$ ' "$log" | grep -v '^[[:space:]]*$' | tail -n 2)
		note=$(printf '%s' "$note" | tr '\t\n|' '  /' | cut -c1-300)
	fi
	local checks=""
	[ $((nok + nfail)) -gt 0 ] && checks="$nok/$((nok + nfail))"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$idx" "$label" "$mode" "$result" "$checks" "$rel" "$secs" "$rc" "$note" >>"$TSV"
	# One write, so that lines of parallel runs do not interleave.
	local lines
	lines="$(printf '[%4ds] %-48s %-9s %-8s %-6s rel_l2 %-9s %3ss %s' "$SECONDS" "$label" "$mode" "$result" "$checks" "${rel:--}" "$secs" "$note")"
	lines+=$'\n'"$(grep -E '^check[[:space:]]' "$log" | head -n 8 | sed 's/^/        /')"
	printf '%s\n' "$lines"
}

# The runs go CHECK_JOBS at a time (the CPU reference is single-threaded and takes most
# of a run's time; the GPU is lightly used), longest first.
IDX=0
PIDS=()
launch() {
	IDX=$((IDX + 1))
	while [ "$(jobs -rp | wc -l)" -ge "$CHECK_JOBS" ]; do wait -n 2>/dev/null || sleep 0.2; done
	check "$IDX" "$@" &
	PIDS+=($!)
}
# Every model, both modes: CUDA graphs (the default) and --no-graph.
check_both() {
	launch "$1" graph "${@:2}"
	launch "$1" no-graph "${@:2}"
}

# The fusion kernels first: big (64M elements), so their CPU reference is the slowest.
for gir in "$KERNELS_DIR"/*.gir; do
	[ -f "$gir" ] && check_both "kernel_bench/$(basename "$gir" .gir)" "$gir"
done
for gir in "$ROOT"/examples/models/*.gir; do
	[ -f "$gir" ] || continue
	stem=$(basename "$gir" .gir)
	extra=()
	[ -f "$ROOT/examples/models/${stem}_inputs.npz" ] && extra=(--inputs "$ROOT/examples/models/${stem}_inputs.npz")
	check_both "examples/$stem" "$gir" "${extra[@]}"
done
for gir in "$MODELS_DIR"/*.gir; do
	[ -f "$gir" ] && check_both "write_models/$(basename "$gir" .gir)" "$gir"
done
for dir in "$ROOT"/tests/fixtures/onnx/*/; do
	dir=${dir%/}
	[ -f "$dir/model.onnx" ] || continue
	name=$(basename "$dir")
	extra=()
	[ -f "$dir/inputs.npz" ] && extra+=(--inputs "$dir/inputs.npz")
	# Symbolic dims from meta.json (gpt2_dynamic: batch=2 seq=16).
	dims=$(timeout 20 "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])).get("symbolic_dims") or {}; print(" ".join(f"{k}={v}" for k,v in d.items()))' "$dir/meta.json" </dev/null 2>/dev/null)
	[ -z "$dims" ] && [ "$name" = gpt2_dynamic ] && dims="batch=2 seq=16"
	for d in $dims; do extra+=(--dim "$d"); done
	check_both "fixtures/$name" "$dir/model.onnx" "${extra[@]}"
	# Every layer in 2 parts of the batch (the slices, the parts' kernels and the last
	# concat), in bf16, for the SDPA exports (one per family).
	case "$name" in gpt2_sdpa | llama_sdpa | bert_sdpa | vit_sdpa)
		check_both "fixtures/${name}_bf16_2parts" "$dir/model.onnx" "${extra[@]}" --precision bf16 --chunk-tokens 2
		;;
	esac
done
[ "${#PIDS[@]}" -gt 0 ] && wait "${PIDS[@]}"
write_md
say "correctness done"
correctness_md

# ---------------------------------------------------------------------------- b1. training
# graphc train on the GPU against PyTorch's references (tests/fixtures/train), and one
# GPT-2-small training step against PyTorch eager and torch.compile (bench/train_check.py).
section "b1. training (bench/train_check.py)"
if [ "${SKIP_TRAIN:-0}" = 1 ]; then
	TRAIN_STATUS="skipped (SKIP_TRAIN=1)"
else
	timeout -k 10 "${TRAIN_TIMEOUT:-200}" "$PYTHON" "$ROOT/bench/train_check.py" --graphc "$GRAPHC" --out "$OUT" \
		--scratch "$SCRATCH/train" </dev/null
	rc=$?
	TRAIN_STATUS="exit code $rc"
	say "train_check.py exit code $rc"
fi
write_md

# ---------------------------------------------------------------------------- c. torch_compare
section "c. torch_compare.py"
if [ "${SKIP_TORCH:-0}" = 1 ]; then
	TORCH_STATUS="skipped (SKIP_TORCH=1)"
else
	left=$((TOTAL_BUDGET - SECONDS - 15))
	[ "$left" -lt 120 ] && left=120
	say "torch_compare.py with a timeout of ${left}s"
	# shellcheck disable=SC2086
	timeout -k 10 "$left" "$PYTHON" "$ROOT/bench/torch_compare.py" --graphc "$GRAPHC" --out "$OUT" \
		--scratch "$SCRATCH/torch" --deadline $((left - 40)) ${TORCH_ARGS:-} </dev/null
	rc=$?
	case "$rc" in
	0) TORCH_STATUS="" ;;
	124 | 137) TORCH_STATUS="killed after ${left}s (the rows above are what finished)" ;;
	*) TORCH_STATUS="exit code $rc (see gpu_check.log)" ;;
	esac
	say "torch_compare.py exit code $rc"
fi

# ---------------------------------------------------------------------------- d. report
section "d. report"
timeout 20 nvidia-smi --query-gpu=memory.used --format=csv </dev/null 2>&1 | tail -n 1 | sed 's/^/GPU memory used at the end: /'
# The ONNX exports and inputs stay in $SCRATCH/torch (never in $OUT) for follow-up commands.
write_md
echo
cat "$MD"
say "done: $MD"
exit 0
