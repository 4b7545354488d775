#!/usr/bin/env bash
# The main job: list the engines, synthesize a WAV with each bundled engine through the host
# (streamed), and run the contract suite against every bundled engine. Runs in the active virtual
# environment, else in .venv here, made on first use (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
bash scripts/install.sh
mizuoto engines
mizuoto synth sine "hello world" -o hello.wav --seed 7
mizuoto synth codeclm "Hello from Mizuoto" -o hello-codeclm.wav --seed 3
# Two real architectures on small random checkpoints shipped in their packages: MMS-TTS (VITS)
# and Sesame CSM, each bitwise transformers' run for the same seed (tests/plugins/).
mizuoto synth vits "Hello from Mizuoto." -o hello-vits.wav --seed 3
mizuoto synth csm "Hello from Mizuoto" -o hello-csm.wav --seed 3
# The same request served by two replicas in worker processes: the same bytes.
mizuoto synth codeclm "Hello from Mizuoto" -o hello-codeclm-replicas.wav --seed 3 \
  --set engines.codeclm.replicas=2
cmp hello-codeclm.wav hello-codeclm-replicas.wav && echo "2 replicas: the same audio as inline"
mizuoto-contract mizuoto-engine-sine mizuoto-engine-codeclm mizuoto-engine-vits mizuoto-engine-csm
# The server: `mizuoto serve` in a data folder of its own, the same request streamed over HTTP
# (the same samples as hello.wav after the 44-byte header), then `mizuoto runtime` asks it.
home=$(mktemp -d)
MIZUOTO_HOME="$home" mizuoto serve --port 0 >"$home/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$home"' EXIT
for _ in $(seq 600); do [ -s "$home/server.json" ] && break; sleep 0.1; done
url=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["url"])' "$home/server.json")
curl -sSfN -o hello-server.wav -H 'content-type: application/json' \
  -w 'server: first byte after %{time_starttransfer} s, all after %{time_total} s\n' \
  -d '{"engine": "sine", "text": "hello world", "seed": 7}' "$url/api/v1/synthesize"
cmp <(tail -c +45 hello.wav) <(tail -c +45 hello-server.wav) && echo "server: the same audio as the host"
MIZUOTO_HOME="$home" mizuoto runtime
