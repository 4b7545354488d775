#!/usr/bin/env bash
# What CI runs (.github/workflows/ci.yml), and what you run in a fresh virtual environment to
# check the engine the way CI does:
#
#     bash scripts/ci.sh
#
# mizuoto-sdk and mizuoto-contract come from the wheels in $MIZUOTO_WHEELS (default: wheels/)
# when that folder holds them: until the packages are on an index, build them in a checkout of
# the Mizuoto repository (bash scripts/build.sh puts them in its dist/) and commit
# mizuoto_sdk-*.whl and mizuoto_contract-*.whl under wheels/. Without them, pip takes both from
# the index. Every pip step also reads pip's own PIP_* settings (an index, --no-index, a proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${MIZUOTO_WHEELS:-wheels}"
pip=(python -m pip install --disable-pip-version-check)
{%- if cookiecutter.uses_torch %}

# torch's CPU wheels first: a plain `pip install torch` on Linux fetches the CUDA build,
# gigabytes that a runner without a GPU never uses. When torch is already there, nothing happens.
"${pip[@]}" torch --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
{%- endif %}

# The SDK and the contract suite, from the wheels when they are there.
links=()
if compgen -G "$wheels/mizuoto_sdk-*.whl" >/dev/null; then
  "${pip[@]}" "$wheels"/mizuoto_sdk-*.whl "$wheels"/mizuoto_contract-*.whl
  links=(--find-links "$wheels")
fi

# This engine with its test extra (pytest, mizuoto-contract), and the linter.
"${pip[@]}" ${links[@]+"${links[@]}"} ".[test]" ruff

# Lint; the engine's own tests, with the contract inside pytest (one test per check); and the
# contract as an author runs it.
python -m ruff check .
python -m ruff format --check .
python -m pytest
mizuoto-contract {{ cookiecutter.slug }}
