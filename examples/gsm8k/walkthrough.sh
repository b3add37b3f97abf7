#!/usr/bin/env bash
# Seed 003's GSM8K walkthrough, step by step, with strop. Sized by environment variables:
#   ROWS (200) EVAL_ROWS (50) MAX_STEPS (100) BASE_MODEL (Qwen/Qwen3-0.6B)
#   GROUP_SIZE and MAX_COMPLETION_LENGTH (default: run.json's), DATA_DIR (data), GSM8K_FROM (a local GSM8K
#   folder or file instead of the hub's datasets-server API).
# A smoke run on a laptop:
#   ROWS=16 EVAL_ROWS=8 MAX_STEPS=2 GROUP_SIZE=2 MAX_COMPLETION_LENGTH=16 BASE_MODEL=strop/tiny-random ./walkthrough.sh
set -euo pipefail
cd "$(dirname "$0")"
ROWS="${ROWS:-200}" EVAL_ROWS="${EVAL_ROWS:-50}" MAX_STEPS="${MAX_STEPS:-100}"
BASE_MODEL="${BASE_MODEL:-Qwen/Qwen3-0.6B}" DATA_DIR="${DATA_DIR:-data}"
GRADER="bundle:gsm8k/scoring#reward:compute_score"

echo "== the data"
python3 prepare_dataset.py --rows "$ROWS" --eval-rows "$EVAL_ROWS" --out "$DATA_DIR" ${GSM8K_FROM:+--from "$GSM8K_FROM"}
strop registry datasets register gsm8k/train -f "$DATA_DIR/train.jsonl"
strop registry datasets register gsm8k/eval -f "$DATA_DIR/eval.jsonl"

echo "== the scoring bundle"
strop registry bundles register gsm8k/scoring -f scoring/

echo "== the training project"
strop projects get gsm8k >/dev/null 2>&1 || strop projects create gsm8k
strop projects set-evaluation gsm8k --dataset gsm8k/eval --grader "$GRADER"
strop base-models select "$BASE_MODEL" --wait

echo "== the run"
descriptor="$DATA_DIR/run.json"
python3 - "$descriptor" <<PY
import json, os, sys
run = json.load(open("run.json"))
run["baseModel"] = os.environ.get("BASE_MODEL", "$BASE_MODEL")
hp = run["config"]["rlHyperparams"]
hp["maxSteps"] = int("$MAX_STEPS")
for env, key in (("GROUP_SIZE", "groupSize"), ("MAX_COMPLETION_LENGTH", "maxCompletionLength")):
    if os.environ.get(env):
        hp[key] = int(os.environ[env])
json.dump(run, open(sys.argv[1], "w"), indent=2)
PY
strop runs start -f "$descriptor" --dry-run
RUN=$(strop runs start -f "$descriptor" -o json --jq .runId)
strop runs wait "$RUN" --exit-status

echo "== what to look at first: zeroVarianceGroups, then reward"
strop runs metrics "$RUN"
echo "TensorBoard event files: $(strop runs tensorboard "$RUN" --print-logdir)"

echo "== evaluate"
MODEL=$(strop runs get "$RUN" -o json --jq .modelId)
EVALUATION=$(strop evaluations start --model "$MODEL" --dataset gsm8k/eval --grader "$GRADER" -o json --jq .evaluationId)
strop evaluations wait "$EVALUATION" --exit-status
strop evaluations report "$EVALUATION"
