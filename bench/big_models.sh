#!/usr/bin/env bash
# The big-model benchmark (CPU, this machine): compile time and peak host memory of
# graphc on real-size exports, per stage, against the size of the weights file.
#
#   python scripts/export_models.py --out target/models gpt2_medium llama_1b   # once
#   cargo build --release --bin graphc
#   bash bench/big_models.sh [MODEL ...]        # default: every exported one of these
#
# For each model (target/models/<name>/model.onnx with its external data) it runs, each
# under /usr/bin/time (wall seconds, peak RSS):
#   ir    graphc ir               (import: the weights mapped, not read)
#   opt   graphc opt              (import, optimize, fuse)
#   plan  graphc plan             (everything, fp32, batch 1)
#   plan  graphc plan --precision bf16
#   fit   graphc fit --dim batch  (fp32 and bf16, 24 GiB)
#   plan  graphc plan --precision bf16 --weights int8 / int4, and fit --weights int4
# and prints a table: seconds, peak RSS, RSS / weights file, and fit time / plan time,
# then the planned weights of each --weights against fp32's.
# The fold cache starts empty for each model (a fresh $GRAPHC_FOLD_CACHE): a stage
# marked "warm" runs again with what the cold one stored (the bf16 casts, the
# quantized weights), as a second compile of the same model would.
# The issue's targets: plan <= 2 s and RSS <= 1.2x the weights; fit <= 3x one plan;
# int8 weights <= 0.27x and int4 <= 0.15x of f32's bytes.
# Benchmarks, not tests: nothing here fails on a number.
set -u
cd "$(dirname "$0")/.."
GRAPHC=${GRAPHC:-target/release/graphc}
MODELS_DIR=${MODELS_DIR:-target/models}
SEQ=${SEQ:-1024}
[ -x "$GRAPHC" ] || { echo "no $GRAPHC: cargo build --release --bin graphc" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 2; }
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(gpt2_medium llama_1b)

# measure LABEL CMD...: prints "LABEL seconds rss_kib rc"
measure() {
  local label=$1; shift
  local t; t=$(mktemp)
  /usr/bin/time -f "%e %M" -o "$t" "$@" > /dev/null 2> "$t.err"
  local rc=$?
  read -r secs rss < "$t"
  echo "$label $secs $rss $rc"
  if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then sed -n 1,3p "$t.err" | sed "s/^/    $label: /" >&2; fi
  rm -f "$t" "$t.err"
}

printf '%-12s %-20s %9s %10s %8s %s\n' model stage seconds "peak RSS" "RSS/w" note
for name in "${names[@]}"; do
  m="$MODELS_DIR/$name/model.onnx"
  if [ ! -f "$m" ]; then
    echo "$name: not exported ($m); python scripts/export_models.py --out $MODELS_DIR $name" >&2
    continue
  fi
  wbytes=$(du -bc "$MODELS_DIR/$name"/*.data 2>/dev/null | tail -1 | cut -f1)
  [ -n "$wbytes" ] && [ "$wbytes" -gt 0 ] || wbytes=$(stat -c %s "$m")
  dims=(--dim batch=1 --dim "seq=$SEQ")
  declare -A sec=()
  GRAPHC_FOLD_CACHE=$(mktemp -d)
  export GRAPHC_FOLD_CACHE
  while read -r label secs rss rc; do
    sec[$label]=$secs
    ratio=$(awk -v r="$rss" -v w="$wbytes" 'BEGIN { printf "%.2f", r * 1024 / w }')
    note=""
    [ "$rc" != 0 ] && note="exit $rc"
    printf '%-12s %-20s %9s %8.0f MiB %7sx %s\n' "$name" "$label" "$secs" "$(awk -v r="$rss" 'BEGIN { print r / 1024 }')" "$ratio" "$note"
  done < <(
    measure ir "$GRAPHC" ir "$m" "${dims[@]}"
    measure opt "$GRAPHC" opt "$m" "${dims[@]}"
    measure plan-fp32 "$GRAPHC" plan "$m" "${dims[@]}"
    measure plan-bf16 "$GRAPHC" plan "$m" "${dims[@]}" --precision bf16
    measure plan-bf16-warm "$GRAPHC" plan "$m" "${dims[@]}" --precision bf16
    measure fit-fp32 "$GRAPHC" fit "$m" --dim batch --dim "seq=$SEQ"
    measure fit-bf16-warm "$GRAPHC" fit "$m" --dim batch --dim "seq=$SEQ" --precision bf16
    measure plan-int8 "$GRAPHC" plan "$m" "${dims[@]}" --weights int8
    measure plan-int4 "$GRAPHC" plan "$m" "${dims[@]}" --weights int4
    measure plan-int4-warm "$GRAPHC" plan "$m" "${dims[@]}" --weights int4
    measure plan-bf16-int4 "$GRAPHC" plan "$m" "${dims[@]}" --precision bf16 --weights int4
    measure plan-bf16-int4-warm "$GRAPHC" plan "$m" "${dims[@]}" --precision bf16 --weights int4
    measure fit-bf16-int4-warm "$GRAPHC" fit "$m" --dim batch --dim "seq=$SEQ" --precision bf16 --weights int4
  )
  # The planned weights (bytes) of each weight format against fp32's.
  wf32=$("$GRAPHC" plan "$m" "${dims[@]}" 2>/dev/null | awk '$1 == "weights" && $5 == "B" { print $4; exit }')
  for wq in int8 int4; do
    wq_bytes=$("$GRAPHC" plan "$m" "${dims[@]}" --weights $wq 2>/dev/null | awk '$1 == "weights" && $5 == "B" { print $4; exit }')
    printf '%-12s planned weights --weights %s: %s B of %s B (%sx)\n' "$name" "$wq" "${wq_bytes:-?}" "${wf32:-?}" \
      "$(awk -v a="${wq_bytes:-0}" -v b="${wf32:-1}" 'BEGIN { printf "%.3f", a / (b > 0 ? b : 1) }')"
  done
  printf '%-12s weights file %.2f GiB; fit / plan: fp32 %sx, bf16 (warm) %sx, bf16 int4 (warm) %sx\n' "$name" \
    "$(awk -v w="$wbytes" 'BEGIN { print w / 2^30 }')" \
    "$(awk -v a="${sec[fit-fp32]:-0}" -v b="${sec[plan-fp32]:-1}" 'BEGIN { printf "%.1f", a / (b > 0 ? b : 1) }')" \
    "$(awk -v a="${sec[fit-bf16-warm]:-0}" -v b="${sec[plan-bf16-warm]:-1}" 'BEGIN { printf "%.1f", a / (b > 0 ? b : 1) }')" \
    "$(awk -v a="${sec[fit-bf16-int4-warm]:-0}" -v b="${sec[plan-bf16-int4-warm]:-1}" 'BEGIN { printf "%.1f", a / (b > 0 ? b : 1) }')"
  rm -rf "$GRAPHC_FOLD_CACHE"
  unset sec
done
