#!/usr/bin/env bash
# On a machine with a CUDA GPU and a CUDA build of torch already installed: the tests marked
# `cuda` (they skip elsewhere), then the GPU rows of the streaming and decode benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
python -m pytest -m cuda -q -rs -p no:cacheprovider
python benchmarks/streaming.py --device cuda --trace
python benchmarks/decode.py --device cuda --repeats 2 --no-mid
python benchmarks/dsp.py --device cuda
