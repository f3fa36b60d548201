#!/usr/bin/env bash
# The GPU kit on a node without network (python -m benchmarks.gpu_kit build DIR wrote this into each call folder).
#   bash run.sh call FOLDER       store the part in FOLDER, then run what the stored parts now allow and has not run
#                                 yet: the engines once their segment is whole, the served app once everything is
#   bash run.sh receive [FOLDER]  store the parts found in FOLDER (default: this script's folder), sha256 checked
#   bash run.sh run [PHASES] [--cpu-dry-run] [--project DIR] [-- ARGS for gpu_serve]
#                                 unpack what PHASES need and run them again (engines, serve, gpu-decode; comma-
#                                 separated; default engines,serve); --project: a checkout's code instead of the kit's
# Needs bash, coreutils and the node's Python (KIT_PYTHON, default python3). The store is
# ${APP_KIT_HOME:-/root/app-gpu-kit}: parts/, the unpacked root/, results/ (each step's). What comes back from a call
# goes to $OUT as each step ends (benchmarks/gpu_kit/runner.py); outside a device call, $STORE/out.
# Exit status: 0 every step run passed; 4 a step failed (its archive in $OUT says why); 3 a requirement is not met;
# 2 parts missing or refused; 1 the kit could not be unpacked.
set -euo pipefail

STARTED=$(date +%s)  # the command's start: the steps' timeouts count from it (one device command runs 600 s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STORE=${APP_KIT_HOME:-/root/app-gpu-kit}
PY=${KIT_PYTHON:-python3}
PROJECT=''  # run: --project DIR, a checkout of the project to run instead of the kit's copy (its code, the kit's rest)
export PYTHONUNBUFFERED=1

say() { printf '%s run.sh: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { say "error: $2" >&2; exit "$1"; }

usage() {
  cat <<EOF
usage: bash run.sh call FOLDER           store the part in FOLDER, then run what the stored parts now allow
       bash run.sh receive [FOLDER]      store the parts in FOLDER (default $HERE), sha256 checked
       bash run.sh run [PHASES] [--cpu-dry-run] [--project DIR] [-- ARGS]   PHASES: engines, serve, gpu-decode
store: $STORE (APP_KIT_HOME); Python: $PY (KIT_PYTHON); results: \${OUT:-$STORE/out}
EOF
}

# manifest.json, read with the node's Python (json): one part per line "NAME BYTES SHA256"; a field; a segment's parts
parts_of() {
  "$PY" -c 'import json, sys
for p in json.load(open(sys.argv[1]))["parts"]: print(p["name"], p["bytes"], p["sha256"])' "$1"
}
field_of() { "$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m[sys.argv[2]][sys.argv[3]] if len(sys.argv) > 3 else m[sys.argv[2]])' "$@"; }
segment_parts() { "$PY" -c 'import json, sys; print(*json.load(open(sys.argv[1]))["segments"][sys.argv[2]]["parts"])' "$STORE/manifest.json" "$1"; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }
build_id() { field_of "$STORE/manifest.json" build_id; }

missing_parts() {  # of all parts, or of one segment's
  local name
  if [ $# -gt 0 ]; then
    for name in $(segment_parts "$1"); do [ -f "$STORE/parts/$name" ] || echo "$name"; done
  else
    while read -r name _ _; do [ -f "$STORE/parts/$name" ] || echo "$name"; done < <(parts_of "$STORE/manifest.json")
  fi
}

report_parts() {
  local total missing
  total=$(parts_of "$STORE/manifest.json" | wc -l)
  missing=$(missing_parts | tr '\n' ' ')
  if [ -z "$missing" ]; then
    say "all $total parts stored in $STORE/parts"
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
  if [ -f "$STORE/manifest.json" ] && [ "$(build_id)" != "$(field_of "$manifest" build_id)" ]; then
    say "the store held another kit ($(field_of "$STORE/manifest.json" built)): its parts, unpacked files and results are removed"
    rm -rf "$STORE/parts" "$STORE/root" "$STORE/results" "$STORE"/done-*
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

# unpack SEGMENT: its streams, read from the stored parts at their offsets, each checked against its sha256, then
# decompressed (the node Python's lzma) and extracted (tarfile) into $STORE/root; once per build
unpack() {
  local segment=$1 root=$STORE/root t0=$SECONDS
  if [ "$(cat "$root/.unpacked-$segment" 2>/dev/null || true)" = "$(build_id)" ]; then
    say "segment $segment: unpacked already ($root)"
    return 0
  fi
  say "segment $segment: verifying and unpacking into $root"
  mkdir -p "$root"
  "$PY" - "$STORE" "$segment" <<'PY' || fail 1 "unpacking the segment $segment failed (above)"
import hashlib, io, json, lzma, sys, tarfile

store, segment = sys.argv[1], sys.argv[2]
manifest = json.load(open(f"{store}/manifest.json"))
parts, starts, at = manifest["parts"], [], 0
for p in parts:
    starts.append(at)
    at += p["bytes"]


def chunks(offset, length, size=1 << 20):
    """The bytes [offset, offset + length) of the parts' concatenation."""
    for p, start in zip(parts, starts):
        lo, hi = max(offset, start), min(offset + length, start + p["bytes"])
        if lo < hi:
            with open(f"{store}/parts/{p['name']}", "rb") as f:
                f.seek(lo - start)
                left = hi - lo
                while left:
                    data = f.read(min(size, left))
                    if not data:
                        sys.exit(f"{p['name']} is shorter than the manifest says")
                    left -= len(data)
                    yield data


class Stream(io.RawIOBase):
    def __init__(self, offset, length):
        self.source, self.rest = chunks(offset, length), b""

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self.rest:
            self.rest = next(self.source, None)
            if self.rest is None:
                self.rest = b""
                return 0
        n = min(len(buffer), len(self.rest))
        buffer[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


streams = [s for s in manifest["archive"]["streams"] if s["segment"] == segment]
for s in streams:
    digest = hashlib.sha256()
    for data in chunks(s["offset"], s["bytes"]):
        digest.update(data)
    if digest.hexdigest() != s["sha256"]:
        sys.exit(f"stream {s['kind']} of {segment}: its sha256 is not the manifest's: receive the parts again")
files, extract = 0, {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
for s in streams:
    with lzma.open(io.BufferedReader(Stream(s["offset"], s["bytes"]), 1 << 20)) as xz:
        with tarfile.open(fileobj=xz, mode="r|") as tar:
            for member in tar:
                tar.extract(member, f"{store}/root", **extract)
                files += 1
expected = manifest["segments"][segment]["files"]
if files != expected:
    sys.exit(f"unpacked {files} files of {segment}, the kit has {expected}")
print(f"{files} files")
PY
  [ "$(field_of "$root/kit.json" build_id)" = "$(build_id)" ] || fail 1 "the unpacked kit.json is another build's"
  build_id >"$root/.unpacked-$segment"
  say "segment $segment: unpacked in $((SECONDS - t0)) s"
}

# the environment of the steps: the kit's site first (its onnxruntime-gpu shadows the node's onnxruntime), then the
# project; the node Python's own CUDA 13 / cuDNN 9 libraries; the kit's wrk and the site's console scripts on PATH
environment() {
  local root=$STORE/root libdirs
  libdirs=$(cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node libdirs --exclude "$root/site")
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$root/site:$PROJECT${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$root/bin:$root/site/bin:$PATH"
  export APP_MODEL_DIR=$root/models
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node scripts "$root/site")
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node nvidia "$root/site")
}

needs() {  # the segments a list of phases needs
  case ,$1, in *,serve,*|*,gpu-decode,*) echo engines serving ;; *) echo engines ;; esac
}

# run_phases PHASES [--cpu-dry-run] [-- ARGS]: unpack, check, then the runner (benchmarks/gpu_kit/runner.py)
run_phases() {
  local phases=$1 segment missing check_phase=engines rc=0
  shift
  for segment in $(needs "$phases"); do
    missing=$(missing_parts "$segment" | tr '\n' ' ')
    [ -z "$missing" ] || fail 2 "the $segment segment's parts are not all stored: $missing(bash run.sh call FOLDER)"
  done
  for segment in $(needs "$phases"); do unpack "$segment"; done
  [ "$(needs "$phases")" = "engines" ] || check_phase=serve
  PROJECT=${PROJECT:-$STORE/root/project}
  say "project: $PROJECT"
  environment
  say "checking what the $check_phase phase requires against what $PY imports now"
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node check "$STORE/root" --phase "$check_phase") ||
    fail 3 "requirements not met (above)"
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.node env)
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; else say "no nvidia-smi on this node"; fi
  (cd "$PROJECT" && "$PY" -m benchmarks.gpu_kit.runner "$phases" --store "$STORE" --out "$OUT" \
    --models "$APP_MODEL_DIR" --started "$STARTED" "$@") || rc=$?
  for p in ${phases//,/ }; do build_id >"$STORE/done-$p"; done
  say "results in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  if [ "$rc" -ne 0 ]; then say "a step failed (exit $rc): its archive in $OUT says why"; return 4; fi
}

parse_run_args() {  # sets DRY and EXTRA; PROJECT from --project
  DRY=() EXTRA=()
  while [ $# -gt 0 ]; do
    case $1 in
      --cpu-dry-run) DRY=(--cpu-dry-run) ;;
      --project) shift; [ -d "${1:-}" ] || fail 2 "--project: no folder ${1:-}"; PROJECT=$(cd "$1" && pwd) ;;
      --) shift; EXTRA=("$@"); break ;;
      *) usage >&2; fail 2 "unknown argument $1" ;;
    esac
    shift
  done
}

start_log() {  # this command's console also in $OUT/run.log (it comes back with the results)
  OUT=${OUT:-$STORE/out}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/run.log") 2>&1
  TEE=$!
  trap 'exec >&- 2>&-; wait "$TEE" 2>/dev/null || true' EXIT  # the log complete before the command returns
}

call() {
  local folder=${1:-} phases=() done_engines done_serve
  [ -n "$folder" ] || fail 2 "call FOLDER: the folder this call carried"
  shift
  parse_run_args "$@"
  start_log
  receive "$folder" || fail 2 "a part was refused (above): repeat this call"
  done_engines=$(cat "$STORE/done-engines" 2>/dev/null || true)
  done_serve=$(cat "$STORE/done-serve" 2>/dev/null || true)
  if [ -z "$(missing_parts engines)" ] && [ "$done_engines" != "$(build_id)" ]; then phases+=(engines); fi
  if [ -z "$(missing_parts)" ] && [ "$done_serve" != "$(build_id)" ]; then phases+=(serve); fi
  if [ ${#phases[@]} -eq 0 ]; then
    if [ -n "$(missing_parts)" ]; then
      say "nothing new to run yet: the next call carries the next part"
    else
      say "every phase of this kit ran already (bash $STORE/run.sh run PHASES runs one again)"
    fi
    return 0
  fi
  run_phases "$(IFS=,; echo "${phases[*]}")" "${DRY[@]}" -- "${EXTRA[@]}"
}

run_kit() {
  local phases=engines,serve
  case ${1:-} in engines*|serve*|gpu-decode*) phases=$1; shift ;; esac
  parse_run_args "$@"
  start_log
  [ -f "$STORE/manifest.json" ] || fail 2 "nothing received yet in $STORE: bash run.sh call FOLDER, once per call"
  run_phases "$phases" "${DRY[@]}" -- "${EXTRA[@]}"
}

case ${1:-} in
  call) shift; call "$@" ;;
  receive) shift; receive "$@" ;;
  run) shift; run_kit "$@" ;;
  *) usage ;;
esac
