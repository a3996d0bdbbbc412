#!/usr/bin/env bash
# `make bench-serve`: serve the tiny model with the real runtime on a free local port and sweep
# `kubeinfer bench` over request rates against it; writes out/bench-tiny.json and docs/img/bench-*.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
model=out/models/tiny
[[ -f $model/config.json ]] || $bin/kubeinfer-runtime make-tiny-model "$model" --preset llama-gqa
port=$($bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$bin/kubeinfer-runtime serve --model "$model" --served-model-name tiny --host 127.0.0.1 --port "$port" \
  --device cpu --max-num-seqs 8 --kv-cache-tokens 4096 --log-format text > out/bench-serve-runtime.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
  sleep 1
done
$bin/kubeinfer bench --url "http://127.0.0.1:$port" --input-len uniform:32:128 --output-len 32 \
  --num-requests 40 --request-rate "${RATES:-0.5,1,2,3,4,6}" --slo-from examples/tiny-cpu.yaml \
  --json out/bench-tiny.json --plot docs/img/bench
