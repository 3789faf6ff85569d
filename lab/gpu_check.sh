#!/usr/bin/env bash
# One call that proves the Triton kernels on a CUDA GPU: the GPU tests of tests.py
# (every kernel against float64, determinism, training with --kernels=triton against
# --kernels=fused, torch.compile), then lab/bench.py's GPU tables. Prints a verdict per
# stage first, then the details; exits 1 unless every stage passed.
#
#     bash lab/gpu_check.sh              # writes to $OUT (default lab/results/gpu/, to commit)
#     GPU_TESTS_ON_CPU=1 bash lab/gpu_check.sh
#                                        # the dry run on a CPU: the interpreter, tiny sizes
#     PYTHON=.venv/bin/python bash lab/gpu_check.sh
#                                        # that interpreter, not the python3 first on PATH
#
# Verdicts: pass; FAIL (failed); FAIL (nothing ran: every test skipped or none
# selected); FAIL (some skipped); FAIL (timed out), with the tests that finished
# (pytest -v writes one line per test as it ends, unbuffered, to tests-NAME.txt).
#
# Budget: one 10-minute command. Measured on one H200 (lab/results/gpu/run1 and run2,
# torch 2.11 + triton 3.6): the kernel stage, 53 tests, 101 s (compiling ~86 kernel
# specializations is most of it; the float64 references and the 2^31-element states
# move < 5 TB, ~1 s at 4.25 TB/s); the training stage's compile test 57 s; the bench
# 258 s (torch.compile of 5 reference ops and of 3 models of 6 x 384). Caps: the two
# test stages side by side, 220 s each (2x the kernel stage), then the bench, 330 s
# (1.3x: a time-out still leaves every row measured, each printed as it is): 550 s of
# caps, 570 s with the kill margins.
#   kernels  53 tests (-k "kernels_gpu and not training and not compiled"): read 7 n in
#            float32 + bf16 at n = 4 (8); write 7 n x 3 mixes in the model's dtypes + 3
#            mixes x {float32, bf16} at n = 4 (27); sinkhorn 7 n + 3 scales + bf16 at
#            n = 4 (11); determinism 5; a state past 2^31 elements 2.
#   training 7 train.py runs at once (mhc, gated_ihc, ihc x triton, fused; one fused
#            rerun), 20 iterations of 6 x 384 at batch 64 x 256, eager; then one
#            torch.compile (inductor, fullgraph: 2 x 64, mhc, in-process, 11 steps).
#   bench    lab/bench.py --device=cuda: the stream ops and a training step, each three
#            ways (residuals.py eager and compiled, kernels.py).
#
# It installs nothing: requirements.txt pins a CPU build of torch, and the machine's
# own CUDA torch and triton are the ones to test (a GPU machine may have no network).
set -uo pipefail
cd "$(dirname "$0")/.."  # the repository's root: tests.py, and lab/ as a package
python=${PYTHON:-python3}  # every Python below: the one with torch and the packages, e.g. a venv's
out=${OUT:-lab/results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
dry=${GPU_TESTS_ON_CPU:-0}
if [ "$dry" != 1 ] && ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "error: torch sees no CUDA GPU; run this on a GPU machine with a CUDA build of torch (GPU_TESTS_ON_CPU=1 for a dry run)" >&2
    exit 1
fi
if ! missing=$("$python" -c 'import importlib.util as u; print(" ".join(m for m in ("triton", "numpy", "tiktoken", "tqdm", "pytest") if not u.find_spec(m)))') || [ -n "$missing" ]; then
    echo "error: missing Python packages in $python: ${missing:-?}; install them without touching torch (pip install --no-deps NAME)" >&2
    exit 1
fi
{ if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  else echo "no nvidia-smi (GPU_TESTS_ON_CPU=$dry)"; fi
  "$python" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt" 2>&1

# The stages' selections (by name: every GPU test is test_kernels_gpu_*, and no other
# test's name holds kernels_gpu) and caps; lab/tests.py's test of this script narrows them.
kernels_k=${GPU_CHECK_KERNELS_K:-"kernels_gpu and not training and not compiled"}
training_k=${GPU_CHECK_TRAINING_K:-"kernels_gpu and (training or compiled)"}
tests_cap=${GPU_CHECK_TESTS_S:-220}
bench_cap=${GPU_CHECK_BENCH_S:-330}
interpret=0; bench_default="--device=cuda"
[ "$dry" = 1 ] && interpret=1 && bench_default="--device=cuda --dry_run=True"  # the GPU tables' code, tiny, on the CPU
bench_args=${GPU_CHECK_BENCH_ARGS-$bench_default}

tests() {  # NAME, -k expression: tests-NAME.txt (pytest -v, a line per test as it ends) and tests-NAME.verdict
    local start=$(date +%s) rc counts verdict
    timeout -k 10 "$tests_cap" env TRITON_INTERPRET=$interpret "$python" -m pytest tests.py -k "$2" -v -rs \
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

# lab/bench.py's GPU tables (the dry run: the same code on the CPU, interpreter, tiny sizes)
start=$(date +%s)
timeout -k 10 "$bench_cap" "$python" -m lab.bench $bench_args > "$out/bench.txt" 2>&1
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
