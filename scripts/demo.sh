#!/usr/bin/env bash
# The main job: list the engines, synthesize a WAV with each bundled engine through the host
# (streamed), and run the contract suite against every bundled engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mizuoto engines
mizuoto synth sine "hello world" -o hello.wav --seed 7
mizuoto synth codeclm "Hello from Mizuoto" -o hello-codeclm.wav --seed 3
# The same request served by two replicas in worker processes: the same bytes.
mizuoto synth codeclm "Hello from Mizuoto" -o hello-codeclm-replicas.wav --seed 3 \
  --set engines.codeclm.replicas=2
cmp hello-codeclm.wav hello-codeclm-replicas.wav && echo "2 replicas: the same audio as inline"
mizuoto-contract mizuoto-engine-sine mizuoto-engine-codeclm
