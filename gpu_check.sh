#!/usr/bin/env bash
# One call that proves the Triton kernels on a CUDA GPU: the GPU tests of tests.py
# (every kernel against float64, determinism, training with --kernels=triton against
# --kernels=fused, torch.compile), then bench.py's GPU tables. Prints a verdict per
# stage first, then the details; exits 1 unless every stage passed.
#
#     bash gpu_check.sh                  # writes to $OUT (default results/gpu/, to commit)
#     GPU_TESTS_ON_CPU=1 bash gpu_check.sh
#                                        # the dry run on a CPU: the interpreter, tiny sizes
#
# Verdicts: pass; FAIL (failed); FAIL (nothing ran: every test skipped or none
# selected); FAIL (some skipped); FAIL (timed out), with the tests that finished
# (pytest -v writes one line per test as it ends, unbuffered, to tests-NAME.txt).
#
# Budget (one H200: ~4 TB/s; this must fit one 10-minute command). The kernel and the
# training stages run side by side, then the bench: 330 + 120 = 450 s of caps, 150 s
# left for start-up and the summary.
#   kernels  117 tests (read 7 n x 2 dtypes, write 7 x 3 mixes x 3 dtypes, sinkhorn
#            7 x 5, determinism 5) at 64 x 1024 tokens. Bytes: at most ~9 GB through
#            the kernel (n = 8, full mix, float32: ~43 C x 4 B per token, fwd + bwd)
#            and ~10x that through the float64 reference, chunked over 8 batch rows:
#            < 100 GB per test, < 12 TB for all = 3 s at 4 TB/s; gpu_poison writes
#            half the free memory (~70 GB) before each: 117 x 18 ms = 2 s. The cost is
#            compiling: ~180 kernels (n x mix x dtypes), ~1 s each measured on a CPU
#            core here (tests.py compile test: 140 kernels in ~125 s) = ~180 s, plus
#            ~15 s of start-up: ~200 s expected, cap 330 s (65% headroom).
#   training 8 train.py runs at once, 20 iterations of 6 x 384 at batch 64 x 256
#            (~1.4e13 flops each, ~0.5 s of an H200's bf16 at 30% use), dominated by
#            start-up and one torch.compile (~60-90 s): ~120 s expected, cap 330 s.
#   bench    cap 120 s (bench.py sizes its tables for it).
# No number above was measured on a GPU: the first run replaces these estimates.
#
# It installs nothing: requirements.txt pins a CPU build of torch, and the machine's
# own CUDA torch and triton are the ones to test (a GPU machine may have no network).
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
dry=${GPU_TESTS_ON_CPU:-0}
if [ "$dry" != 1 ] && ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "error: torch sees no CUDA GPU; run this on a GPU machine with a CUDA build of torch (GPU_TESTS_ON_CPU=1 for a dry run)" >&2
    exit 1
fi
if ! missing=$(python3 -c 'import importlib.util as u; print(" ".join(m for m in ("triton", "numpy", "tiktoken", "tqdm", "pytest") if not u.find_spec(m)))') || [ -n "$missing" ]; then
    echo "error: missing Python packages: ${missing:-?}; install them without touching torch (pip install --no-deps NAME)" >&2
    exit 1
fi
{ if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  else echo "no nvidia-smi (GPU_TESTS_ON_CPU=$dry)"; fi
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt" 2>&1

# The stages' selections (by name: every GPU test is test_gpu_*, and no other test's
# name holds that) and caps; tests.py's test of this script narrows them.
kernels_k=${GPU_CHECK_KERNELS_K:-"test_gpu_ and not training and not compiled"}
training_k=${GPU_CHECK_TRAINING_K:-"test_gpu_ and (training or compiled)"}
tests_cap=${GPU_CHECK_TESTS_S:-330}
bench_cap=${GPU_CHECK_BENCH_S:-120}
interpret=0; bench_default="--device=cuda"
[ "$dry" = 1 ] && interpret=1 && bench_default="--device=cpu --warmup=1 --rounds=1"  # no GPU tables without a GPU
bench_args=${GPU_CHECK_BENCH_ARGS-$bench_default}

tests() {  # NAME, -k expression: tests-NAME.txt (pytest -v, a line per test as it ends) and tests-NAME.verdict
    local start=$(date +%s) rc counts verdict
    timeout -k 10 "$tests_cap" env TRITON_INTERPRET=$interpret python3 -m pytest tests.py -k "$2" -v -rs \
        -p no:cacheprovider > "$out/tests-$1.txt" 2>&1
    rc=$?
    # every test's own line: "tests.py::test_x[...] PASSED", also when the stage was killed
    local passed=$(grep -cE '^tests\.py::.* PASSED' "$out/tests-$1.txt")
    local failed=$(grep -cE '^tests\.py::.* (FAILED|ERROR)' "$out/tests-$1.txt")
    local skipped=$(grep -cE '^tests\.py::.* SKIPPED' "$out/tests-$1.txt")
    counts="$passed passed, $failed failed, $skipped skipped"
    if [ $rc = 124 ] || [ $rc = 137 ]; then verdict="FAIL (timed out after ${tests_cap}s; finished: $counts)"
    elif [ $rc != 0 ] && [ $rc != 5 ]; then verdict="FAIL ($counts)"
    elif [ "$passed" = 0 ]; then verdict="FAIL (nothing ran: $counts)"
    elif [ "$skipped" != 0 ]; then verdict="FAIL (some skipped: $counts)"
    else verdict="pass ($counts)"; fi
    echo "$verdict in $(( $(date +%s) - start ))s; $out/tests-$1.txt" > "$out/tests-$1.verdict"
}
tests kernels "$kernels_k" &
tests training "$training_k" &
wait

# bench.py's GPU tables (the dry run: its CPU section, the same script end to end)
start=$(date +%s)
timeout -k 10 "$bench_cap" python3 bench.py $bench_args > "$out/bench.txt" 2>&1
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
      echo; echo "=== $out/tests-$t.txt (every test's verdict, then failures and skips)"
      grep -E '^tests\.py::.* (PASSED|FAILED|ERROR|SKIPPED)' "$out/tests-$t.txt" | sed 's/ *\[ *[0-9]*%\]$//'
      grep -E '^(FAILED|ERROR|SKIPPED)|^E ' "$out/tests-$t.txt" | head -40
  done
  echo; echo "=== $out/bench.txt"; cat "$out/bench.txt"; } | tee "$out/summary.txt"
! grep -q FAIL "$out"/tests-*.verdict && [ "$bench_verdict" = pass ]
