#!/usr/bin/env bash
# One recipe, several methods and seeds, trained at once: one process per run (all on one GPU, or on a CPU
# machine as many runs as it has cores).
#
#   bash benchmarks/recipe_grid.sh runs/pq_gpu      # prontoqa_real_cpu: 5 methods x 3 seeds + a check, ~6 min on one H200
#   python -m benchmarks.prontoqa_real_runs --label gpu $(printf -- '--run %s ' runs/pq_gpu/*/)   # grade, pair, summary
#   METHODS="pause acot" SEEDS=0 CHECK_RUN= bash benchmarks/recipe_grid.sh runs/pq_pa
#   RECIPE=prosqa_real_cpu METHODS=cot SEEDS="0 1" TAG=_dfs CHECK_RUN= \
#       EXTRA="data.train.trace=dfs training.generation_max_new_tokens=256" bash benchmarks/recipe_grid.sh runs/pb_dfs
#   DRY_RUN=1 bash benchmarks/recipe_grid.sh runs/x  # print each run's resolved recipe, train nothing
#
# Each run is `anchored-reasoning train $RECIPE method.name=<method> seed=<seed> ...` in <out>/<method><TAG>_s<seed>
# (the default recipe, prontoqa_real_cpu, is the one behind the README's real ProntoQA numbers). The paper's
# baselines remove the reasoning steps through a curriculum, which a recipe written for anchor_chain has not:
# pause and acot get `method.options.remove_steps_per_stage=1 training.curriculum=true` (the last stage keeps no
# step), stepwise `training.curriculum=true`. Validation runs once, at the end
# (`training.generation_eval_every_stage=false`), so a curriculum adds no validation time. Nothing else changes:
# the runs are the recipe's, in its dtype (float32 for the logic recipes), on whatever device torch finds.
#
# Environment: RECIPE (default prontoqa_real_cpu), METHODS (default "nocot cot pause acot stepwise"), SEEDS
# (default "0 1 2"), CHECK_RUN (one more run, method:seed; default anchor_chain:0, the known-good route; empty
# for none), TAG (added to every run's name), EXTRA (more overrides for every run), DEADLINE_S (stop runs still
# going after this many seconds; default 0 = none: a stopped run resumes from its last checkpoint when started
# again), DRY_RUN, PYTHON. One log per run beside its folder, and a line per run at the end: its last
# validation, or the end of its log.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="$(mkdir -p "${1:-runs/recipe_grid}" && cd "${1:-runs/recipe_grid}" && pwd)"
cd "$ROOT"
RECIPE="${RECIPE:-prontoqa_real_cpu}"
METHODS="${METHODS:-nocot cot pause acot stepwise}"
SEEDS="${SEEDS:-0 1 2}"
CHECK_RUN="${CHECK_RUN-anchor_chain:0}"
TAG="${TAG:-}"
EXTRA="${EXTRA:-}"
DEADLINE_S="${DEADLINE_S:-0}"
DRY="${DRY_RUN:+--dry-run}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

opts_for() {  # the overrides that make a method the paper's baseline
  case "$1" in
    pause|acot) echo "method.options.remove_steps_per_stage=1 training.curriculum=true" ;;
    stepwise) echo "training.curriculum=true" ;;
  esac
}

runs=()
for m in $METHODS; do for s in $SEEDS; do runs+=("$m:$s"); done; done
[ -n "$CHECK_RUN" ] && runs+=("$CHECK_RUN")
pids=()
for r in "${runs[@]}"; do
  m="${r%%:*}"; s="${r##*:}"; name="${m}${TAG}_s${s}"
  # shellcheck disable=SC2046,SC2086
  "$PY" -m anchored_reasoning.cli train --quiet $DRY "$RECIPE" method.name="$m" seed="$s" $(opts_for "$m") \
    training.generation_eval_every_stage=false output_dir="$OUT_DIR/$name" $EXTRA > "$OUT_DIR/$name.log" 2>&1 &
  pids+=($!)
done
echo "recipe_grid: $RECIPE, ${#runs[@]} runs: ${runs[*]}"
if [ "$DEADLINE_S" -gt 0 ]; then
  ( sleep "$DEADLINE_S"; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done ) &
  killer=$!
fi
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
[ "$DEADLINE_S" -gt 0 ] && kill "$killer" 2>/dev/null
for r in "${runs[@]}"; do
  m="${r%%:*}"; s="${r##*:}"; name="${m}${TAG}_s${s}"
  line=$(grep -h "validation at step" "$OUT_DIR/$name/train.log" 2>/dev/null | tail -1 | sed 's/.*INFO [^:]*: //')
  echo "$name: ${line:-$(tail -1 "$OUT_DIR/$name.log" 2>/dev/null | cut -c1-200)}"
done
echo "recipe_grid: $failed of ${#runs[@]} runs failed or were stopped"
exit $((failed > 0))
