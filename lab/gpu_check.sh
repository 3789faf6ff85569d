#!/usr/bin/env bash
# Proves the repository on one CUDA GPU in two calls, each sized for 4 minutes on an
# 80 GB H100 (a lent GPU session has 15 minutes of device time, a start-up included:
# two calls of 4 leave room to rerun one). Each prints a verdict per stage as the stage
# ends, then a summary; a skip or a time-out is a failure; it exits 1 unless every
# stage passed.
#
#     bash lab/gpu_check.sh correctness  # (a) every kernel against float64, compiled Blocks, a 2^31-element state
#     bash lab/gpu_check.sh headline     # (b) train.py's headline run, resume, sample.py, every topology, the bench
#     GPU_TESTS_ON_CPU=1 bash lab/gpu_check.sh correctness
#                                        # the dry run on a CPU: the interpreter, tiny sizes
#     PYTHON=.venv/bin/python bash lab/gpu_check.sh headline
#                                        # that interpreter, not the python3 first on PATH
#
# (a) correctness, caps 150 + 60 s:
#   kernels   tests.py's GPU kernel tests (-k "kernels_gpu and not training and not compiled
#             and not past_2_31"): read, write and Sinkhorn against float64 at n = 2..8, in the
#             model's dtypes, bf16 and a bf16 state; determinism. Beside it:
#   compiled  the Triton ops in compiled Blocks under bf16 autocast (inductor): no graph
#             break, one graph for every layer, training like eager. Then, alone:
#   large     a state past 2^31 elements (~30 GB): after the others, so that it starves none.
# (b) headline, caps 120 + 100 s:
#   headline  python train.py --residual=norm_gated_ihc at the GPU defaults (Triton ops in
#             compiled Blocks, bf16 autocast) for 300 iterations: its evaluations, its
#             checkpoint, a resume to 320, and sample.py from it. Beside it:
#   training  every topology's 20-iteration run on the default path, three against fused.py's.
#             Then, alone, as timing needs it:
#   bench     lab/bench.py at 6 x 384: the compiled residual, then the headline rows.
# The caps are guesses from one H200 run of the older one-call script (kernel tests
# 101 s, seven train.py runs and a compile 66 s, its bench 258 s) and an H100's start-up;
# each stage's time is in its verdict, for the next call to size them by.
#
# Writes $OUT/<call>-*.txt (default OUT lab/results/gpu/, to commit): at most six files a
# call. It installs nothing: the machine's own CUDA torch and triton are the ones to test.
set -uo pipefail
cd "$(dirname "$0")/.."  # the repository's root: tests.py, and lab/ as a package
call=${1:-}
case $call in
    correctness|headline) ;;
    *) echo "usage: bash lab/gpu_check.sh correctness|headline (got '${call}')" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}  # every Python below: the one with torch and the packages, e.g. a venv's
out=${OUT:-lab/results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
dry=${GPU_TESTS_ON_CPU:-0}
if [ "$dry" != 1 ] && ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "error: torch sees no CUDA GPU; run this on a GPU machine with a CUDA build of torch (GPU_TESTS_ON_CPU=1 for a dry run)" >&2
    exit 1
fi
if ! missing=$("$python" -c 'import importlib.util as u; need = dict(triton="triton", numpy="numpy", tiktoken="tiktoken", tqdm="tqdm", pytest="pytest", xdist="pytest-xdist")
print(" ".join(package for module, package in need.items() if not u.find_spec(module)))') || [ -n "$missing" ]; then
    echo "error: missing Python packages in $python: ${missing:-?}; install them without touching torch (pip install --no-deps NAME)" >&2
    exit 1
fi
{ if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  else echo "no nvidia-smi (GPU_TESTS_ON_CPU=$dry)"; fi
  "$python" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/$call-env.txt" 2>&1

# The stages' selections and caps (seconds); lab/tests.py's test of this script narrows them.
kernels_k=${GPU_CHECK_KERNELS_K:-"kernels_gpu and not training and not compiled and not past_2_31"}
compiled_k=${GPU_CHECK_COMPILED_K:-"kernels_gpu and compiled"}
large_k=${GPU_CHECK_LARGE_K:-"kernels_gpu and past_2_31"}
training_k=${GPU_CHECK_TRAINING_K:-"kernels_gpu and training"}
side_cap=${GPU_CHECK_SIDE_S:-150}  # (a)'s kernels beside compiled
large_cap=${GPU_CHECK_LARGE_S:-60}
headline_cap=${GPU_CHECK_HEADLINE_S:-120}  # (b)'s headline beside training
bench_cap=${GPU_CHECK_BENCH_S:-100}
interpret=0; headline_iters=300; device=cuda; learned=0.5; sampled=200  # learned: the val loss's fall
bench_default="--device=cuda --topologies=residual,norm_gated_ihc,mhc,ihc --ways=triton_compiled --state_dtypes=float32"
if [ "$dry" = 1 ]; then  # the same stages on the CPU: the interpreter, tiny sizes, the Triton ops eager
    interpret=1; headline_iters=4; device=cpu; learned=0; sampled=20; bench_default="$bench_default --dry_run=True"
fi
bench_args=${GPU_CHECK_BENCH_ARGS-$bench_default}
verdicts=()

say() {  # NAME, verdict: printed now, and kept for the summary
    local line; line=$(printf '  %-10s %s' "$1" "$2")
    echo "$line"; verdicts+=("$line")
}

tests() {  # NAME, cap, -k expression: $out/$call-NAME.txt (pytest -v, a line per test as it ends) and its verdict
    # -n 0: in one process (pytest.ini's -n auto would start one per CPU core, all on the one GPU)
    local start=$(date +%s) rc passed failed skipped counts verdict file="$out/$call-$1.txt"
    timeout -k 10 "$2" env TRITON_INTERPRET=$interpret "$python" -m pytest tests.py -n 0 -k "$3" -v -rs \
        -p no:cacheprovider > "$file" 2>&1
    rc=$?
    # every test's own line: "tests.py::test_x[...] PASSED", also when the stage was killed
    passed=$(grep -cE '^tests\.py::.* PASSED' "$file")
    failed=$(grep -cE '^tests\.py::.* (FAILED|ERROR)' "$file")
    skipped=$(grep -cE '^tests\.py::.* SKIPPED' "$file")
    counts="$passed passed, $failed failed, $skipped skipped"
    if [ $rc = 124 ] || [ $rc = 137 ]; then verdict="FAIL (timed out after ${2}s; finished: $counts)"
    elif [ $rc != 0 ] && [ $rc != 5 ]; then verdict="FAIL ($counts)"
    elif [ "$passed" = 0 ]; then verdict="FAIL (nothing ran: $counts)"
    elif [ "$skipped" != 0 ]; then verdict="FAIL (some skipped: $counts)"
    else verdict="pass ($counts)"; fi
    echo "$verdict in $(( $(date +%s) - start ))s" > "$file.verdict"
}

step() {  # what, command...: one step of the headline stage, its output appended to the stage's file
    echo "=== $1: ${*:2}" >> "$headline_file"
    "${@:2}" >> "$headline_file" 2>&1 || { echo "FAIL ($1 exited $?)"; return 1; }
}

headline() {  # train, check, resume, sample: one verdict line on stdout
    local run=$(mktemp -d) size=()
    [ "$dry" = 1 ] && size=(--device=cpu --kernels=triton --n_layer=1 --n_head=2 --n_embd=32 --batch_size=2
                            --block_size=16 --eval_iters=1 --warmup_iters=1 --eval_full=False)
    step train env TRITON_INTERPRET=$interpret "$python" train.py --residual=norm_gated_ihc \
        --max_iters=$headline_iters --eval_interval=$(( headline_iters / 2 )) --progress=lines --out_dir="$run" \
        "${size[@]}" || return
    # it learned (from ~4.2 at iteration 0 to under 3 and by $learned; a broken gradient stays near 4.2), and saved
    step "learned and saved" "$python" -c 'import json, os, sys
rows = [json.loads(line) for line in open(os.path.join(sys.argv[1], "metrics.jsonl")) if "val_loss" in line]
first, last = rows[0], rows[-1]
print("val loss", first["val_loss"], "->", last["val_loss"], "at", last["iter"], "whole split", last.get("val_loss_full"))
fall, below = float(sys.argv[3]), 3.0 if float(sys.argv[3]) else first["val_loss"]
assert last["iter"] == int(sys.argv[2]) and last["val_loss"] < min(first["val_loss"] - fall, below), "did not learn"
assert os.path.exists(os.path.join(sys.argv[1], "ckpt.pt")), "no checkpoint"' "$run" $headline_iters $learned || return
    step resume env TRITON_INTERPRET=$interpret "$python" train.py --residual=norm_gated_ihc --init_from=resume \
        --max_iters=$(( headline_iters + 20 )) --eval_interval=$(( headline_iters / 2 )) --progress=lines \
        --out_dir="$run" "${size[@]}" || return
    step "resumed" "$python" -c 'import json, os, sys
iters = [json.loads(line)["iter"] for line in open(os.path.join(sys.argv[1], "metrics.jsonl"))]
assert iters == sorted(iters) and iters[-1] == int(sys.argv[2]) + 20, iters' "$run" $headline_iters || return
    step sample env TRITON_INTERPRET=$interpret "$python" sample.py --out_dir="$run" --num_samples=1 \
        --max_new_tokens=$sampled --device=$device --kernels=triton || return
    tail -c 200 "$headline_file" | grep -q '[A-Za-z]' || { echo "FAIL (sample.py wrote no text)"; return; }
    echo "pass (trained $headline_iters iterations, resumed to $(( headline_iters + 20 )), sampled)"
}

start=$(date +%s)
if [ "$call" = correctness ]; then
    tests kernels "$side_cap" "$kernels_k" &
    tests compiled "$side_cap" "$compiled_k" &
    wait
    for stage in kernels compiled; do say "$stage" "$(cat "$out/$call-$stage.txt.verdict")"; done
    tests large "$large_cap" "$large_k"
    say large "$(cat "$out/$call-large.txt.verdict")"
else
    headline_file="$out/$call-headline.txt"
    : > "$headline_file"
    headline_start=$(date +%s)
    timeout -k 10 "$headline_cap" bash -c "$(declare -p python interpret headline_iters dry device learned sampled \
        headline_file; \
        declare -f step headline); headline" > "$out/$call-headline.verdict" 2>&1 &
    tests training "$headline_cap" "$training_k" &
    wait
    verdict=$(tail -1 "$out/$call-headline.verdict")
    [ -z "$verdict" ] && verdict="FAIL (timed out after ${headline_cap}s; the steps done are in $headline_file)"
    say headline "$verdict in $(( $(date +%s) - headline_start ))s"
    say training "$(cat "$out/$call-training.txt.verdict")"
    bench_start=$(date +%s)
    timeout -k 10 "$bench_cap" "$python" -m lab.bench $bench_args > "$out/$call-bench.txt" 2>&1
    bench_rc=$?
    case $bench_rc in
        0) bench_verdict="pass" ;;
        124|137) bench_verdict="FAIL (timed out; the rows measured are in $call-bench.txt)" ;;
        *) bench_verdict="FAIL (exit $bench_rc: $(tail -1 "$out/$call-bench.txt"))" ;;
    esac
    say bench "$bench_verdict in $(( $(date +%s) - bench_start ))s"
fi

{ echo "SUMMARY gpu_check.sh $call on $(head -1 "$out/$call-env.txt"), $(( $(date +%s) - start ))s"
  printf '%s\n' "${verdicts[@]}"
  echo; echo "=== $call-env.txt"; cat "$out/$call-env.txt"
  for file in "$out/$call"-*.txt; do
      case $file in *-env.txt|*-summary.txt) continue ;; esac
      echo; echo "=== $(basename "$file") (each test's verdict, then failures and skips; or its last lines)"
      if grep -qE '^tests\.py::' "$file"; then
          grep -E '^tests\.py::.* (PASSED|FAILED|ERROR|SKIPPED)' "$file" | sed 's/ *\[ *[0-9]*%\]$//'
          grep -E '^(FAILED|ERROR|SKIPPED)|^E ' "$file" | head -40
      else tail -60 "$file"; fi
  done; } > "$out/$call-summary.txt"
rm -f "$out/$call"-*.verdict
echo; cat "$out/$call-summary.txt"
! printf '%s\n' "${verdicts[@]}" | grep -q FAIL
