#!/usr/bin/env bash
# Install everything, lint, and run the test suite (GPU tests skip without a GPU). Runs in the
# active virtual environment, else in .venv here (made on first use; see scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
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
