#!/usr/bin/env bash
# The main job: list the engines, then synthesize a WAV with the bundled sine engine via the host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mizuoto engines
mizuoto synth sine "hello world" -o hello.wav --seed 7
