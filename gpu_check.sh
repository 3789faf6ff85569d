#!/usr/bin/env bash
# One call that proves the Triton kernels on a CUDA GPU: the GPU tests of tests.py
# (every kernel against float64 at the model's sizes, determinism, training with
# --kernels=triton against --kernels=fused, torch.compile), then bench.py's GPU
# tables. About 7 minutes on one H200; each stage is capped so the whole stays
# under 8. Prints a pass/fail summary first, then the details; exits 1 on any failure.
#
#     bash gpu_check.sh                  # writes to $OUT (default results/gpu/, to commit)
#     GPU_TESTS_ON_CPU=1 GPU_CHECK_K="gpu and deterministic" bash gpu_check.sh
#                                        # a dry run on a CPU: the interpreter, tiny sizes
#
# It installs nothing: requirements.txt pins a CPU build of torch, and the machine's
# own CUDA torch and triton are the ones to test (a GPU machine may have no network).
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-results/gpu}
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
# The kernel tests and the training runs go side by side: together they fit the time.
interpret=0; [ "${GPU_TESTS_ON_CPU:-0}" = 1 ] && interpret=1
k=${GPU_CHECK_K:-gpu}
tests() {  # name, -k expression: tests-NAME.txt, and the verdict in tests-NAME.verdict
    local start=$(date +%s) rc line verdict
    timeout -k 10 330 env TRITON_INTERPRET=$interpret python3 -m pytest tests.py -k "$2" -q -rs -p no:cacheprovider \
        > "$out/tests-$1.txt" 2>&1
    rc=$?
    line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|deselected)|no tests ran' "$out/tests-$1.txt" | tail -1 | tr -d '=')
    case $rc in
        0) verdict=pass; echo "$line" | grep -q skipped && verdict="FAIL (skipped: see -rs lines)" ;;
        5) verdict="none selected"; [ -n "${GPU_CHECK_K:-}" ] || verdict="FAIL (no tests selected)" ;;
        124|137) verdict="FAIL (timed out)" ;;
        *) verdict=FAIL ;;
    esac
    echo "$verdict: ${line:-no pytest summary} ($(( $(date +%s) - start ))s; $out/tests-$1.txt)" > "$out/tests-$1.verdict"
}
tests kernels "($k) and not training and not compiled" &
tests training "($k) and (training or compiled)" &
wait

# Stage 2: bench.py's GPU tables (bytes per token, each op against --kernels=fused's, training steps).
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
  echo "  kernel tests    $(cat "$out/tests-kernels.verdict")"
  echo "  training tests  $(cat "$out/tests-training.verdict")"
  echo "  bench           $bench_verdict (${bench_s}s; $out/bench.txt)"
  echo; echo "=== $out/env.txt"; cat "$out/env.txt"
  for t in kernels training; do
      echo; echo "=== $out/tests-$t.txt (failures and skips)"
      grep -E '^(FAILED|ERROR|SKIPPED)|^E ' "$out/tests-$t.txt" | head -40
  done
  echo; echo "=== $out/bench.txt"; cat "$out/bench.txt"; } | tee "$out/summary.txt"
! grep -q FAIL "$out"/tests-*.verdict && [ "$bench_verdict" = pass ]
