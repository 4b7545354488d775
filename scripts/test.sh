#!/usr/bin/env bash
# Install everything, lint, and run the test suite (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install-browser.sh
ruff check .
ruff format --check .
lint-imports --no-cache
mypy
mkdocs build --strict --quiet
status=0
python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: the suite is missing" >&2
  exit 1
fi
exit "$status"
