#!/usr/bin/env bash
# benchmarks/gpu/run.sh — one command that tests and measures rayseq's CUDA path.
#
#   bash benchmarks/gpu/run.sh                                   # on the GPU machine -> benchmarks/results/gpu/
#   bash benchmarks/gpu/run.sh --device cpu --quick --out DIR    # the same parts on a CPU at smoke-test sizes
#                                                                # (tests/benchmarks/test_gpu_runner.py runs this)
# On the GPU machine (no Ray there): first, here, `DEVICE_LIST=<device tool>/KINDS.md bash benchmarks/gpu/kit.sh`
# writes .kit/ (git-ignored, ~45 MB); send it along (the device tool's carry: [".kit"]) and this script installs it.
#
# Options
#   --out DIR        results (default benchmarks/results/gpu): <part>.md/.json/.png, tests.log, env.txt
#   --device D       cuda (default) or cpu
#   --quick          smoke-test sizes for every part
#   --budget S       seconds; no part starts after S (default 450: one 10-minute command with room to spare).
#                    Run the same command again to go on: a finished part leaves DIR/<part>.done and is skipped,
#                    the oracle runs continue from their checkpoints (--resume).
#   --parts "A B"    a subset of the parts below (default: all, in this order, most valuable first)
#
# Parts: env (the machine); smoke (the GPU suite's smoke subset: three algorithms' updates, resume, fractions of one
# GPU under Ray, a Hugging Face policy, serving, the device's arithmetic against the CPU's, and the checks only a GPU
# can answer: a driver that sees no GPU checkpointing a GPU learner, two learners sharing the GPU); sample (the HF
# sampler's tokens/s, fp32 and bf16), nograd (peak memory of the passes without gradients), memory (one PPO
# update's peak at V = 128,256 and 1k + 1k tokens per row: benchmarks/learner_memory_vocab.py), sync (a 1B weights sync
# four ways); updates, mcq, hf_grpo (bench.py); serve; tests (the suite's other algorithms); scaling; overhead; oracle.
#   --kit DIR        the kit (default .kit)
#   --oracle FILE    SeqGAN's oracle (.npz; default ../shared/data/seqgan_oracle.npz, else DIR-of-kit/seqgan_oracle.npz)
# Exit status: 0 when every part asked for is done and the GPU tests passed; 3 when the budget stopped it early
# (run it again); 1 when the tests failed (tests.log says which).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/results/gpu DEVICE=cuda QUICK=0 BUDGET=450 KIT=.kit ORACLE=""
ALL_PARTS="env smoke sample nograd memory sync updates mcq hf_grpo serve tests scaling overhead oracle"
PARTS=$ALL_PARTS
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --budget) BUDGET=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --kit) KIT=$2; shift 2 ;;
    --oracle) ORACLE=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "run.sh: --device cuda or cpu, not $DEVICE" >&2; exit 2 ;; esac
START=$(date +%s)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

# --- the kit: Ray and what else the GPU machine lacks, once per machine -------------------------------------
if ! $PY -c "import ray" 2>/dev/null; then
  if [ -f "$KIT/install.sh" ]; then
    echo "== installing the kit ($KIT)"
    bash "$KIT/install.sh" || { echo "run.sh: the kit did not install" >&2; exit 1; }
    export PYTHONPATH="$PYTHONPATH:/tmp/site" PATH="/tmp/site/bin:$PATH"
  else
    echo "run.sh: no Ray here and no $KIT/install.sh (make it with benchmarks/gpu/kit.sh)" >&2; exit 1
  fi
fi
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "run.sh: --device cuda but torch sees no CUDA device (--device cpu runs the parts on the CPU)" >&2; exit 1
fi
if [ -z "$ORACLE" ]; then
  for f in ../shared/data/seqgan_oracle.npz "$KIT/seqgan_oracle.npz"; do [ -f "$f" ] && ORACLE=$f && break; done
fi

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
Q=(); [ "$QUICK" = 1 ] && Q=(--quick)

part_env() {
  { date -u; echo "host $(hostname), $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem/ {print $2 " GiB"}') memory"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $PY - <<'PY'
import platform, torch, ray
print(f"python {platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}")
print("cuda:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
PY
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

suite() {  # suite NAME ENV... -- PYTEST ARGS: the GPU suite (or a part of it), its log NAME.log, its status NAME.rc
  local name=$1; shift; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env RAYSEQ_TEST_DEVICE="$DEVICE" "${envs[@]}" timeout -k 30 "$(left)" $PY -m pytest -m gpu -q -p no:cacheprovider \
      -o addopts="" --timeout=240 --durations=15 --junitxml="$OUT/$name.xml" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$rc" > "$OUT/$name.rc"
  [ "$rc" = 124 ] && return 124  # cut by the budget: not done
  return 0  # a failure is in NAME.rc: the next parts run, the exit status says it
}
part_smoke() { suite smoke RAYSEQ_GPU_QUICK=1 -- tests/gpu; }
part_tests() {
  local quick=(); [ "$QUICK" = 1 ] && quick=(RAYSEQ_GPU_QUICK=1)
  suite tests RAYSEQ_GPU_REST=1 "${quick[@]}" -- tests/gpu/test_gpu_train.py -k every_algorithm
}

part_bench() { timeout -k 30 "$(left)" $PY benchmarks/gpu/bench.py --parts "$1" --device "$DEVICE" "${Q[@]}" --out "$OUT"; }
part_updates() { part_bench updates; }
part_mcq() { part_bench mcq; }
part_hf_grpo() { part_bench hf_grpo; }
part_sample() { part_bench sample; }
part_nograd() { part_bench nograd; }
part_sync() { part_bench sync; }

part_memory() {  # one PPO update's peak memory at V = 128,256 and 1k + 1k tokens per row, on the device
  local quick=(); [ "$QUICK" = 1 ] && quick=(--quick)
  timeout -k 30 "$(left)" $PY benchmarks/learner_memory_vocab.py --device "$DEVICE" "${quick[@]}" --out "$OUT"
}

part_serve() {  # requests/s and p99 at 32 concurrent, the replica on the device
  local quick=(); [ "$QUICK" = 1 ] && quick=(--quick --requests 40 --warmup 5 --batching on)
  timeout -k 30 "$(left)" $PY benchmarks/serve_load.py --device "$DEVICE" --concurrency 32 "${quick[@]}" --out "$OUT"
}

part_scaling() {  # rollout workers 1, 2, 4, 8 on the machine's cores
  if [ "$QUICK" = 1 ]; then
    timeout -k 30 "$(left)" $PY benchmarks/scaling.py --workers 1 2 --repeats 1 --iters 3 --batch 32 --tasks counting --out "$OUT"
  else
    timeout -k 30 "$(left)" $PY benchmarks/scaling.py --workers 1 2 4 8 --repeats 3 --out "$OUT"
  fi
}

part_overhead() {  # the synchronous Ray-overhead ratio on cores that are not shared
  if [ "$QUICK" = 1 ]; then
    timeout -k 30 "$(left)" $PY benchmarks/ray_overhead.py --iters 3 --batch 32 --workers 0 1 --repeats 1 --out "$OUT"
  else
    timeout -k 30 "$(left)" $PY benchmarks/ray_overhead.py --iters 200 --workers 0 2 --repeats 3 --pipeline --out "$OUT"
  fi
}

part_oracle() {  # SeqGAN at the paper's scale on SeqGAN's oracle, resumable across commands
  local runs="$OUT/runs" dev=(learner.device="$DEVICE")
  [ "$DEVICE" = cuda ] && dev+=(rollout.num_gpus_per_worker=1 scorer.num_gpus_per_scorer=1)
  local base=(--config tune_configs/seqgan_oracle.yaml rollout.num_workers=0 progress=lines progress_every=60
              "${dev[@]}")
  [ -n "$ORACLE" ] && base+=(task.oracle_path="$(cd "$(dirname "$ORACLE")" && pwd)/$(basename "$ORACLE")")
  if [ "$QUICK" = 1 ]; then
    base+=(task.vocab_size=60 task.oracle_hidden=8 task.seq_len=6 task.num_train=300 task.test_size=100
           task.eval_samples=200 task.oracle_path=null model.emb_dim=8 model.hidden_dim=16 train.pretrain_iters=10
           train.pretrain_eval_every=5 train.iters=2 train.batch_size=16 train.eval_every=2 algo.mc_rollouts=2
           disc.emb_dim=8 "disc.filter_sizes=[1,2,3]" "disc.num_filters=[4,4,4]" disc.pretrain_steps=2
           disc.d_steps=1 disc.num_negatives=64 disc.batch_size=32)
  fi
  mkdir -p "$runs"
  local algo
  for algo in seqgan seqgan_ppo_dynamic; do
    local dir="$runs/$algo"
    [ -f "$dir/summary.json" ] && continue
    local resume=(); ls "$dir"/checkpoints/ckpt_*.pt >/dev/null 2>&1 && resume=(--resume)
    # SIGINT at the budget: the run writes a checkpoint and exits 130; the next command continues it
    timeout -k 60 -s INT "$(left)" $PY -m rayseq.train "${base[@]}" algo.name=$algo run_dir="$dir" "${resume[@]}" \
        2>&1 | tee -a "$OUT/oracle.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || return "$rc"
  done
  $PY - "$runs" "$OUT" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, ".")
from benchmarks._report import write_report
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
s = {a: json.loads((runs / a / "summary.json").read_text()) for a in ("seqgan", "seqgan_ppo_dynamic")}
rows = [("MLE (pretrained)", s["seqgan"]["pretrain_metrics"]["test/nll_oracle"], 9.038),
        ("SeqGAN", s["seqgan"]["metrics"]["test/nll_oracle"], 8.736),
        ("SeqGAN-PPO-dynamic", s["seqgan_ppo_dynamic"]["metrics"]["test/nll_oracle"], None)]
lines = ["NLL-oracle (lower is better), tune_configs/seqgan_oracle.yaml, beside SeqGAN's Table 1", "",
         "| model | rayseq | paper |", "| --- | --- | --- |"]
lines += [f"| {n} | {v:.3f} | {'—' if p is None else p} |" for n, v, p in rows]
wall = ", ".join(f"{a} {v['wall_s'] / 60:.1f} min" for a, v in s.items())
lines.append(f"wall: {wall} (each the last command's share; a resumed run counts from its resume)")
write_report(out, "oracle", "\n".join(lines), {"rows": [{"model": n, "nll_oracle": v, "paper": p} for n, v, p in rows]})
PY
}

for part in $PARTS; do
  if [ -f "$OUT/$part.done" ]; then echo "== $part: done before, skipped"; continue; fi
  if [ "$(left)" -le 20 ]; then
    echo "== budget of $BUDGET s used: run the same command again to go on (left: $part and after)"; exit 3
  fi
  case " $ALL_PARTS " in
    *" $part "*) ;; *) echo "run.sh: unknown part $part" >&2; exit 2 ;;
  esac
  echo "== $part ($(left) s of the budget left)"
  t0=$(date +%s)
  "part_$part"; rc=$?
  if [ "$rc" = 0 ]; then
    echo "$(( $(date +%s) - t0 )) s" > "$OUT/$part.done"
  elif [ "$rc" = 124 ] || [ "$rc" = 130 ] || { [ "$rc" = 137 ] && [ "$(left)" -le 0 ]; }; then
    # 137: the part ignored timeout's TERM and was killed 30 s later: still the budget, not a failure
    echo "== $part stopped by the budget: run the same command again to go on"; exit 3
  else
    echo "== $part failed (exit $rc)"; exit 1
  fi
done
for name in smoke tests; do
  if [ -f "$OUT/$name.rc" ] && [ "$(cat "$OUT/$name.rc")" != 0 ]; then echo "== GPU tests failed: $OUT/$name.log"; exit 1; fi
done
echo "== all parts done: $OUT"
