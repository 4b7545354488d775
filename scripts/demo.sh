#!/usr/bin/env bash
# The main job: list the engines, synthesize a WAV with each bundled engine through the host
# (streamed), and run the contract suite against every bundled engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mizuoto engines
mizuoto synth sine "hello world" -o hello.wav --seed 7
mizuoto synth codeclm "Hello from Mizuoto" -o hello-codeclm.wav --seed 3
mizuoto-contract mizuoto-engine-sine mizuoto-engine-codeclm
