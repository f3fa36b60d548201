#!/usr/bin/env bash
# The GPU kit on a node without network (python -m benchmarks.gpu_kit build DIR wrote this beside its parts).
#   bash run.sh receive [FROM_DIR]   store the parts found in FROM_DIR (default: this script's folder), verified
#   bash run.sh run [--cpu-dry-run] [--project DIR] [-- ARGS for gpu_serve]   assemble once, check, run gpu_check,
#                                     gpu_decode, then gpu_serve (--project: a checkout's code instead of the kit's)
# Needs bash, coreutils, tar and the node's Python (KIT_PYTHON, default python3). The store is
# ${APP_KIT_HOME:-/root/app-gpu-kit}: parts/, the assembled root/, results/ (or $OUT).
# Exit status of run: 0 both steps passed; 4 gpu_check failed, 5 gpu_serve failed, 6 both; 3 a requirement is not
# met; 2 parts missing; 1 the kit could not be assembled.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STORE=${APP_KIT_HOME:-/root/app-gpu-kit}
PY=${KIT_PYTHON:-python3}
CHECK_TIMEOUT=${KIT_CHECK_TIMEOUT_S:-240}
SERVE_TIMEOUT=${KIT_SERVE_TIMEOUT_S:-420}
DECODE_TIMEOUT=${KIT_DECODE_TIMEOUT_S:-120}
TARGETS=${KIT_TARGETS:-cuda-fp32,cuda-fp32-graphs,cuda-fp16,cuda-fp16-graphs,trt-int8,trt-fp16}
PROJECT=''  # run: --project DIR, a checkout of the project to run instead of the kit's copy (its code, the kit's rest)
export PYTHONUNBUFFERED=1

say() { printf '%s run.sh: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { say "error: $2" >&2; exit "$1"; }

usage() {
  cat <<EOF
usage: bash run.sh receive [FROM_DIR]       store the parts in FROM_DIR (default $HERE), sha256 checked
       bash run.sh run [--cpu-dry-run] [--project DIR] [-- ARGS]   assemble, check the requirements, run gpu_check
                                     and gpu_serve (--project: a checkout's code instead of the kit's copy)
store: $STORE (APP_KIT_HOME); Python: $PY (KIT_PYTHON); results: \${OUT:-$STORE/results}
timeouts: KIT_CHECK_TIMEOUT_S=$CHECK_TIMEOUT, KIT_DECODE_TIMEOUT_S=$DECODE_TIMEOUT, KIT_SERVE_TIMEOUT_S=$SERVE_TIMEOUT
gpu_check targets: KIT_TARGETS=$TARGETS
EOF
}

# manifest.json fields, read with the node's Python (json): one part per line "NAME BYTES SHA256", or one value
parts_of() {
  "$PY" -c 'import json, sys
for p in json.load(open(sys.argv[1]))["parts"]: print(p["name"], p["bytes"], p["sha256"])' "$1"
}
field_of() { "$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m[sys.argv[2]][sys.argv[3]] if len(sys.argv) > 3 else m[sys.argv[2]])' "$@"; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }

missing_parts() {
  local name size sum
  while read -r name size sum; do [ -f "$STORE/parts/$name" ] || echo "$name"; done < <(parts_of "$STORE/manifest.json")
}

report_parts() {
  local total missing
  total=$(parts_of "$STORE/manifest.json" | wc -l)
  missing=$(missing_parts | tr '\n' ' ')
  if [ -z "$missing" ]; then
    say "all $total parts stored in $STORE/parts: bash $STORE/run.sh run"
  else
    say "stored $((total - $(wc -w <<<"$missing"))) of $total parts; still missing: $missing"
  fi
}

receive() {
  local from=${1:-$HERE} manifest name size sum got refused=0
  [ -d "$from" ] || fail 2 "no folder $from"
  manifest=$from/manifest.json
  [ -f "$manifest" ] || manifest=$HERE/manifest.json
  [ -f "$manifest" ] || fail 2 "no manifest.json in $from or $HERE"
  mkdir -p "$STORE/parts"
  if [ -f "$STORE/manifest.json" ] && [ "$(field_of "$STORE/manifest.json" build_id)" != "$(field_of "$manifest" build_id)" ]; then
    say "the store held another kit ($(field_of "$STORE/manifest.json" built)): its parts and assembly are removed"
    rm -rf "$STORE/parts" "$STORE/root" "$STORE/root.tmp"
    mkdir -p "$STORE/parts"
  fi
  cp "$manifest" "$STORE/manifest.json.tmp" && mv "$STORE/manifest.json.tmp" "$STORE/manifest.json"
  [ "$HERE/run.sh" -ef "$STORE/run.sh" ] || { cp "$HERE/run.sh" "$STORE/run.sh.tmp" && mv "$STORE/run.sh.tmp" "$STORE/run.sh"; }
  while read -r name size sum; do
    [ -f "$from/$name" ] || continue
    if [ -f "$STORE/parts/$name" ]; then say "$name: already stored, skipped"; continue; fi
    cp "$from/$name" "$STORE/parts/$name.tmp"
    got=$(sha256 "$STORE/parts/$name.tmp")
    if [ "$got" != "$sum" ]; then
      rm -f "$STORE/parts/$name.tmp"
      say "refused: $name: its sha256 is $got, the manifest says $sum (a damaged copy: send it again)" >&2
      refused=1
      continue
    fi
    mv "$STORE/parts/$name.tmp" "$STORE/parts/$name"
    say "$name: stored ($size bytes, sha256 verified)"
  done < <(parts_of "$STORE/manifest.json")
  report_parts
  return "$refused"
}

assemble() {
  local want root=$STORE/root files expected t0=$SECONDS
  want=$(field_of "$STORE/manifest.json" build_id)
  if [ -f "$root/.assembled" ] && [ "$(cat "$root/.assembled")" = "$want" ]; then
    say "the kit is assembled already ($root): reused"
    return 0
  fi
  local -a parts=()
  while read -r name _ _; do parts+=("$STORE/parts/$name"); done < <(parts_of "$STORE/manifest.json")
  say "verifying the archive (${#parts[@]} parts)"
  [ "$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)" = "$(field_of "$STORE/manifest.json" archive sha256)" ] ||
    fail 1 "the parts together do not make the archive the manifest names: receive them again"
  rm -rf "$root" "$STORE/root.tmp"
  mkdir -p "$STORE/root.tmp"
  say "unpacking into $root"
  cat "${parts[@]}" |
    "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)' |
    tar -x -C "$STORE/root.tmp" || fail 1 "unpacking failed (lzma or tar above says why)"
  [ "$(field_of "$STORE/root.tmp/kit.json" build_id)" = "$want" ] || fail 1 "the unpacked kit.json is another build's"
  files=$(find "$STORE/root.tmp" \( -type f -o -type l \) | wc -l)
  expected=$(field_of "$STORE/root.tmp/kit.json" files)
  [ "$files" -eq "$expected" ] || fail 1 "unpacked $files files, the kit has $expected"
  echo "$want" >"$STORE/root.tmp/.assembled"
  mv "$STORE/root.tmp" "$root"
  say "assembled $files files in $((SECONDS - t0)) s"
}

# the environment of the checks: the kit's site first (its onnxruntime-gpu shadows the node's onnxruntime), then the
# project; the node Python's own CUDA 13 / cuDNN 9 libraries; the kit's wrk and the site's console scripts on PATH
environment() {
  local root=$STORE/root libdirs
  libdirs=$(cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node libdirs --exclude "$root/site")
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$root/site:$PROJECT${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$root/bin:$root/site/bin:$PATH"
  export APP_MODEL_DIR=$root/models
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node scripts "$root/site")
}

# step NAME LIMIT CMD...: run CMD in the project under timeout; its exit status in RC
step() {
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  say "$name: start (at most ${limit} s): $*"
  RC=0
  (cd "$PROJECT" && timeout --kill-after=30 "$limit" "$@") || RC=$?
  say "$name: exit $RC after $((SECONDS - t0)) s$([ "$RC" -eq 124 ] && echo ' (timed out)' || true)"
}

known_targets() {  # the targets of $TARGETS that gpu_check's --help names; the others said and left out
  local help t known=()
  help=$(cd "$PROJECT" && "$PY" -m benchmarks.gpu_check --help 2>&1) || true
  for t in ${TARGETS//,/ }; do
    if grep -qw -- "$t" <<<"$help"; then known+=("$t"); else say "gpu_check does not know the target $t: left out" >&2; fi
  done
  (IFS=,; echo "${known[*]}")
}

run_kit() {
  local dry=() extra=() check_rc serve_rc targets out marker
  while [ $# -gt 0 ]; do
    case $1 in
      --cpu-dry-run) dry=(--cpu-dry-run) ;;
      --project) shift; [ -d "${1:-}" ] || fail 2 "--project: no folder ${1:-}"; PROJECT=$(cd "$1" && pwd) ;;
      --) shift; extra=("$@"); break ;;
      *) usage >&2; fail 2 "unknown argument $1" ;;
    esac
    shift
  done
  [ -f "$STORE/manifest.json" ] || fail 2 "nothing received yet in $STORE: bash run.sh receive FOLDER, once per part"
  local missing
  missing=$(missing_parts | tr '\n' ' ')
  [ -z "$missing" ] || fail 2 "parts missing from $STORE/parts: $missing(bash run.sh receive FOLDER for each)"
  assemble
  PROJECT=${PROJECT:-$STORE/root/project}
  say "project: $PROJECT"
  environment
  say "checking the project's requirements against what $PY imports now"
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node check "$STORE/root") || fail 3 "requirements not met (above)"
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node env)
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; else say "no nvidia-smi on this node"; fi
  marker=$(mktemp)
  targets=$(known_targets)
  if [ -n "$targets" ]; then
    step gpu_check "$CHECK_TIMEOUT" "$PY" -m benchmarks.gpu_check --targets "$targets" "${dry[@]}"
  else
    say "gpu_check: none of $TARGETS is known to it"; RC=2
  fi
  check_rc=$RC
  # decode_in: gpu's decode with the app's own code, and its pixels against the CPU path's (reported, not in the exit
  # status: a node without nvImageCodec still measures the rest)
  if [ -f "$PROJECT/benchmarks/gpu_decode.py" ]; then
    step gpu_decode "$DECODE_TIMEOUT" "$PY" -m benchmarks.gpu_decode "${dry[@]}"
    say "gpu_decode exit $RC"
  fi
  if [ -f "$PROJECT/benchmarks/gpu_serve.py" ] || [ -d "$PROJECT/benchmarks/gpu_serve" ]; then
    step gpu_serve "$SERVE_TIMEOUT" "$PY" -m benchmarks.gpu_serve "${dry[@]}" --models "$APP_MODEL_DIR" "${extra[@]}"
  else
    say "gpu_serve: missing from the kit's project (no benchmarks/gpu_serve.py in the tree it was built from)"; RC=127
  fi
  serve_rc=$RC
  out=${OUT:-$STORE/results}
  mkdir -p "$out"
  find "$PROJECT/benchmarks/results" -maxdepth 1 -type f -name '*gpu*' -newer "$marker" \
    -exec cp -t "$out" {} + 2>/dev/null || true
  rm -f "$marker"
  say "results in $out: $(cd "$out" && ls | tr '\n' ' ')"
  say "gpu_check exit $check_rc, gpu_serve exit $serve_rc"
  if [ "$check_rc" -ne 0 ] && [ "$serve_rc" -ne 0 ]; then exit 6; fi
  if [ "$check_rc" -ne 0 ]; then exit 4; fi
  if [ "$serve_rc" -ne 0 ]; then exit 5; fi
}

case ${1:-} in
  receive) shift; receive "$@" ;;
  run) shift; run_kit "$@" ;;
  *) usage ;;
esac
