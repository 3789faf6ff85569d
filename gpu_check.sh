#!/usr/bin/env bash
# One call that proves the Triton kernels on a CUDA GPU: the GPU tests of tests.py
# (every kernel against float64, determinism, training with --kernels=triton against
# --kernels=fused, torch.compile), then bench.py's GPU tables. Prints a verdict per
# stage first, then the details; exits 1 unless every stage passed.
#
#     bash gpu_check.sh                  # writes to $OUT (default results/gpu/, to commit)
#     GPU_TESTS_ON_CPU=1 bash gpu_check.sh
#                                        # the dry run on a CPU: the interpreter, tiny sizes
#     PYTHON=.venv/bin/python bash gpu_check.sh
#                                        # that interpreter, not the python3 first on PATH
#
# Verdicts: pass; FAIL (failed); FAIL (nothing ran: every test skipped or none
# selected); FAIL (some skipped); FAIL (timed out), with the tests that finished
# (pytest -v writes one line per test as it ends, unbuffered, to tests-NAME.txt).
#
# Budget (one H200: ~4 TB/s; all of it inside one 10-minute command, >= 40% to spare).
# The kernel and the training stages run side by side (cap 300 s each), then the bench
# (cap 260 s): 560 s of caps with the kill margins under 600; expected ~120 + ~160 +
# ~10 s of start-up and summary = ~290 s, 48% of the command (52% to spare).
#   kernels  53 tests (tests.py counts them: -k "test_gpu_ and not training and not
#            compiled"): read 7 n in float32 + bf16 at n = 4 (8); write 7 n x 3 mixes in
#            the model's dtypes + 3 mixes x {float32, bf16} at n = 4 (27); sinkhorn 7 n
#            + 3 scales + bf16 at n = 4 (11); determinism 5; a state past 2^31 elements 2.
#            Bytes: at 8 x 1024 tokens, C = 768, the largest case (n = 8, full mix,
#            float32) moves ~132 KB per token through the kernel, fwd + bwd (bench.py's
#            op_bytes): 1.1 GB, ~11 GB through the float64 reference; gpu_poison writes
#            half the free memory, <= ~70 GB: < 85 GB a test, < 4.5 TB for 51 tests;
#            the 2^31 cases (704 x 1024 x 4 x 768 float32 = 8.9 GB a state) draw ~20 GB
#            and move ~50 GB each: < 4.7 TB in all = ~1.2 s at 4 TB/s. The cost is
#            compiling: 86 kernel specializations (read 16, write 54, sinkhorn 16; the
#            2^31 and determinism cases reuse n = 4's), ~1 s each measured on a CPU core
#            here = ~90 s, plus ~15 s of start-up: ~105 s expected, cap 300 s (65% spare).
#   training 7 train.py runs at once (mhc, gated_ihc, ihc x triton, fused; one fused
#            rerun), 20 iterations of 6 x 384 at batch 64 x 256 (~1.4e13 flops each,
#            ~0.5 s of an H200's bf16 at 30% use), eager: start-up, data, the Triton
#            kernels' first compiles and 4 evaluations of 20 batches, ~60 s; then the
#            check's one torch.compile (inductor, fullgraph: 2 x 64, mhc, in-process,
#            11 steps, ~40 s): ~100 s expected, cap 300 s (67% spare).
#   bench    bench.py --device=cuda: torch.compile of 5 reference ops (~6 s each) and of
#            3 models of 6 x 384 (~30 s each), ~120 s; each timing a few hundred ms (the
#            ops' bytes: < 3 GB a run at 64 x 1024 tokens, < 1 ms at 4 TB/s); start-up
#            and the kernels' first compiles ~20 s: ~160 s expected, cap 260 s (38% spare:
#            a time-out still leaves every row measured, each printed as it is).
# No number above was measured on a GPU: the first run replaces these estimates.
#
# It installs nothing: requirements.txt pins a CPU build of torch, and the machine's
# own CUDA torch and triton are the ones to test (a GPU machine may have no network).
set -uo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}  # every Python below: the one with torch and the packages, e.g. a venv's
out=${OUT:-results/gpu}
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

# The stages' selections (by name: every GPU test is test_gpu_*, and no other test's
# name holds that) and caps; tests.py's test of this script narrows them.
kernels_k=${GPU_CHECK_KERNELS_K:-"test_gpu_ and not training and not compiled"}
training_k=${GPU_CHECK_TRAINING_K:-"test_gpu_ and (training or compiled)"}
tests_cap=${GPU_CHECK_TESTS_S:-300}
bench_cap=${GPU_CHECK_BENCH_S:-260}
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

# bench.py's GPU tables (the dry run: the same code on the CPU, interpreter, tiny sizes)
start=$(date +%s)
timeout -k 10 "$bench_cap" "$python" bench.py $bench_args > "$out/bench.txt" 2>&1
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
