#!/usr/bin/env bash
# One call that proves the Triton kernels on a CUDA GPU: the GPU tests of tests.py
# (every kernel against float64 at the model's sizes, determinism, training with
# --kernels=triton against --kernels=torch, torch.compile), then bench.py's GPU
# tables. About 7 minutes on one H200; each stage is capped so the whole stays
# under 8. Prints a pass/fail summary first, then the details; exits 1 on any failure.
#
#     bash gpu_check.sh                  # writes to $OUT (default gpu-check/)
#     GPU_TESTS_ON_CPU=1 GPU_CHECK_K="gpu and deterministic" bash gpu_check.sh
#                                        # a dry run on a CPU: the interpreter, tiny sizes
#
# It installs nothing: requirements.txt pins a CPU build of torch, and the machine's
# own CUDA torch and triton are the ones to test (a GPU machine may have no network).
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ "${GPU_TESTS_ON_CPU:-0}" != 1 ] && ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "error: torch sees no CUDA GPU; run this on a GPU machine with a CUDA build of torch (GPU_TESTS_ON_CPU=1 for a dry run)" >&2
    exit 1
fi
if ! missing=$(python3 -c 'import importlib.util as u; print(" ".join(m for m in ("triton", "numpy", "tiktoken", "tqdm", "pytest") if not u.find_spec(m)))') || [ -n "$missing" ]; then
    echo "error: missing Python packages: ${missing:-?}; install them without touching torch (pip install --no-deps NAME)" >&2
    exit 1
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt" 2>&1

# Stage 1: the GPU tests, kernels compiled (TRITON_INTERPRET=0), every skip named (-rs).
start=$(date +%s)
interpret=0; [ "${GPU_TESTS_ON_CPU:-0}" = 1 ] && interpret=1
timeout -k 10 330 env TRITON_INTERPRET=$interpret python3 -m pytest tests.py -k "${GPU_CHECK_K:-gpu}" \
    -q -rs -p no:cacheprovider > "$out/tests.txt" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - start ))
tests_line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|no tests ran' "$out/tests.txt" | tail -1 | tr -d '=')
if [ $tests_rc -eq 124 ] || [ $tests_rc -eq 137 ]; then tests_verdict="FAIL (timed out after ${tests_s}s)"
elif [ $tests_rc -ne 0 ] || echo "$tests_line" | grep -q skipped; then tests_verdict="FAIL"
else tests_verdict="pass"; fi

# Stage 2: bench.py's GPU tables (bytes per token, each op against --kernels=torch's, training steps).
start=$(date +%s)
timeout -k 10 120 python3 bench.py --device=cuda > "$out/bench.txt" 2>&1
bench_rc=$?
bench_s=$(( $(date +%s) - start ))
case $bench_rc in
    0) bench_verdict="pass" ;;
    124|137) bench_verdict="FAIL (timed out after ${bench_s}s; the rows measured are in bench.txt)" ;;
    *) bench_verdict="FAIL (exit $bench_rc: $(tail -1 "$out/bench.txt"))" ;;
esac

{ echo "SUMMARY gpu_check.sh on $(head -1 "$out/env.txt")"
  echo "  tests  $tests_verdict: ${tests_line:-no pytest summary} (${tests_s}s; $out/tests.txt)"
  echo "  bench  $bench_verdict (${bench_s}s; $out/bench.txt)"
  echo; echo "=== $out/env.txt"; cat "$out/env.txt"
  echo; echo "=== $out/tests.txt (failures and skips)"; grep -E '^(FAILED|ERROR|SKIPPED)|^E ' "$out/tests.txt" | head -60
  echo; echo "=== $out/bench.txt"; cat "$out/bench.txt"; } | tee "$out/summary.txt"
[ "$tests_verdict" = pass ] && [ "$bench_verdict" = pass ]
