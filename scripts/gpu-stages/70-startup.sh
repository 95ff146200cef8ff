# Stages of scripts/gpu-check.sh: sealedstart, libload. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

# Start-up to first token: plaintext and a sealed copy (development profile, key file), page
# cache warm for both. One discarded plaintext run first fills the NVRTC kernel cache; then the
# two alternate, twice each. Prints seconds from launch to the first completion's last byte;
# each run's log (RUST_LOG=info: the timeline of opening, loading and uploading) is kept.
if has sealedstart; then
  S8=/tmp/llama8b.sealed
  rm -rf $S8 /tmp/llama8b.key
  $RUN "$G/inferno" seal --model $M8 --out $S8 --key-file /tmp/llama8b.key \
    >"$OUT/seal.log" 2>&1
  note "inferno seal (8B-shaped): rc=$? $(head -1 "$OUT/seal.log")"
  cat $M8/* $S8/* >/dev/null
  # Reading a cached shard into a fresh buffer in 4 KiB pages against advised huge pages
  # (src/model/buffer.rs), on every core.
  note "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"
  if gcc -O2 -o /tmp/read-buffer-bench "$G/read-buffer-bench.c" -lpthread 2>"$OUT/read-buffer-bench.log"; then
    largest=$(ls -S $M8/*.safetensors | head -1)
    /tmp/read-buffer-bench "$largest" "$(nproc)" 2>&1 | tee -a "$OUT/read-buffer-bench.log" | tee -a "$SUMMARY"
  else
    note "read-buffer-bench: gcc failed"
  fi
  printf '[attestation]\nprofile = "development"\n' >/tmp/sealed-dev.toml
  first_token() { # LOG MODEL_DIR EXTRA_ARGS... -> seconds to the first completion
    local t0 t1 log=$1
    shift
    t0=$(date +%s.%N)
    RUST_LOG=info $RUN "${FT_BIN:-$G/inferno}" serve --model "$1" --device cuda --listen 127.0.0.1:8445 \
      --config /tmp/sealed-dev.toml "${@:2}" >"$OUT/$log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 1200); do
      curl -ksf https://127.0.0.1:8445/health >/dev/null 2>&1 && break
      sleep 0.05
    done
    curl -ksf https://127.0.0.1:8445/v1/completions -H 'content-type: application/json' \
      -d '{"model":"'"$(basename "$1")"'","prompt":"Hello","max_tokens":1}' >/dev/null
    t1=$(date +%s.%N)
    kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
    python3 -c "print(round($t1 - $t0, 3))"
  }
  warm=$(first_token sealedstart-warmup.log $M8)
  note "start-up to first token, warm-up (kernel cache): plaintext ${warm} s"
  # COLD_BINS names more binaries of .gpu (say "inferno inferno-base") to start in turn, warm
  # here (WARM_RUNS rounds, default 2, binaries alternating) and cold below.
  plain=(); sealed=(); declare -A other=()
  for i in $(seq 1 "${WARM_RUNS:-2}"); do
    plain+=("$(first_token sealedstart-plain-$i.log $M8)")
    sealed+=("$(first_token sealedstart-sealed-$i.log $S8 --model-key-file /tmp/llama8b.key)")
    for b in ${COLD_BINS:-inferno}; do
      [ "$b" = inferno ] && continue
      other[$b]+=" $(FT_BIN="$G/$b" first_token sealedstart-plain-$b-$i.log $M8)"
    done
  done
  best() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:]))" "$@"; }
  note "start-up to first token: plaintext ${plain[*]} s, sealed ${sealed[*]} s (ratio of the bests $(python3 -c "print(round($(best "${sealed[@]}") / $(best "${plain[@]}"), 3))"))"
  for b in ${COLD_BINS:-inferno}; do
    [ "$b" = inferno ] && continue
    note "start-up to first token, $b: plaintext${other[$b]} s"
  done
  for f in "$OUT"/sealedstart-plain-1.log "$OUT"/sealedstart-sealed-1.log; do
    note "$(basename "$f"):"
    grep -E 'listening|platform passed|sealed model opened|model loaded|backend prepared|CUDA backend ready|weights placed|weights uploaded|KV cache allocated|decode graphs captured|sequence limit|engine ready|ready$' "$f" | cut -c1-260 | tee -a "$SUMMARY"
  done
  # From a cold page cache (issue 13 target 2: within 1 s of the disk's sequential read time):
  # the model's files read in order by one reader, then the start-ups, each after dropping caches.
  # The disk's rate drifts by several percent within a call, so every round first times its own
  # sequential read and its start-ups are compared with that.
  if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    bytes=$(stat -c %s $M8/* | awk '{s += $1} END {print s}')
    # COLD_ROUNDS (default 1) repeats the cold start-ups, binaries alternating.
    for r in $(seq 1 "${COLD_ROUNDS:-1}"); do
      sync && echo 3 >/proc/sys/vm/drop_caches
      t0=$(date +%s.%N)
      cat $M8/* >/dev/null
      t1=$(date +%s.%N)
      seq_read=$(python3 -c "print(round($t1 - $t0, 3))")
      note "cold page cache, round $r: sequential read of the model ${seq_read} s ($(python3 -c "print(round($bytes / ($t1 - $t0) / 1e9, 2))") GB/s)"
      for b in ${COLD_BINS:-inferno}; do
        sync && echo 3 >/proc/sys/vm/drop_caches
        log=sealedstart-cold
        [ "$b" = inferno ] || log=$log-$b
        [ "$r" = 1 ] || log=$log-r$r
        cold=$(FT_BIN="$G/$b" first_token $log.log $M8)
        note "cold page cache, $b, round $r: start-up to first token ${cold} s ($(python3 -c "print(round($cold - $seq_read, 3))") s over the round's sequential read)"
        grep -E 'platform passed|backend prepared|CUDA backend ready|weights placed|weights uploaded' "$OUT/$log.log" | cut -c1-400 | tee -a "$SUMMARY"
      done
    done
  else
    note "cold page cache: not measured (cannot drop the page cache here)"
  fi
  # The one-line start-up timeline (src/cli/startup.rs) of every timed run, phases in ms.
  for f in "$OUT"/sealedstart-plain-*.log "$OUT"/sealedstart-sealed-*.log "$OUT"/sealedstart-cold*.log; do
    note "$(basename "$f" .log) timeline: $(sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -o 'start-up timeline.*' | tail -1)"
  done
fi

# What a cold start-up pays for the CUDA libraries (issue 13 target 2): .gpu/libload-probe.py's
# dlopen, driver initialisation, context and cuBLASLt handle, each mode after dropping the page
# cache: alone; after the libraries were read whole (cat); beside eight parallel readers of the
# model (as the server reads it); beside one sequential reader; beside eight readers after the
# libraries were read whole. Needs the 8B-shaped model of the sealedstart stage.
if has libload && [ -d "$M8" ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  lib_files=()
  for name in libcuda.so.1 libnvrtc.so.13 libcublasLt.so.13; do
    for dir in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
      [ -e "$dir/$name" ] && { lib_files+=("$(readlink -f "$dir/$name")"); break; }
    done
  done
  note "libload: $(for f in "${lib_files[@]}"; do printf '%s %s MB; ' "$(basename "$f")" $(($(stat -c %s "$f") / 1000000)); done)"
  seconds_since() { python3 -c "import time; print(round(time.time() - $1, 3))"; }
  for mode in alone libs-read-first beside-8-readers beside-1-reader libs-read-beside-8-readers; do
    sync && echo 3 >/proc/sys/vm/drop_caches
    readers=()
    t0=$(date +%s.%N)
    case $mode in
      beside-8-readers | libs-read-beside-8-readers)
        for f in "$M8"/*.safetensors; do cat "$f" >/dev/null & readers+=($!); done ;;
      beside-1-reader) cat "$M8"/* >/dev/null & readers+=($!) ;;
    esac
    if [[ $mode == libs-read* ]]; then
      t1=$(date +%s.%N)
      cat "${lib_files[@]}" >/dev/null
      note "libload $mode: libraries read whole in $(seconds_since "$t1") s"
    fi
    $RUN python3 "$G/libload-probe.py" "$mode" 2>&1 | tee -a "$SUMMARY"
    if [ ${#readers[@]} -gt 0 ]; then
      wait "${readers[@]}"
      note "libload $mode: the model's readers finished $(seconds_since "$t0") s after they started"
    fi
  done
fi
