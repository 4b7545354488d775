#!/usr/bin/env bash
# The main job: list the engines, synthesize a WAV with the bundled sine engine through the host,
# and run the contract suite against every bundled engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mizuoto engines
mizuoto synth sine "hello world" -o hello.wav --seed 7
mizuoto-contract mizuoto-engine-sine
