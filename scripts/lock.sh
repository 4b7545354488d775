#!/usr/bin/env bash
# Regenerate requirements-lock.txt: install requirements-dev.txt into a new, empty virtual
# environment and record the exact version of everything it pulled in (this checkout's editable
# packages and pip itself left out). scripts/install.sh installs with it as a constraints file, so
# the tests and tools run at these versions on every machine. Run it with the Python CI uses
# (3.11) after changing requirements-dev.txt, or to take newer releases; then run
# scripts/test.sh and commit both files.
#   bash scripts/lock.sh            (PYTHON=python3.12 bash scripts/lock.sh for another Python)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r scripts/reference.txt
python_version=$("$work/venv/bin/python" -c 'import platform; print(platform.python_version())')
{
  echo "# The exact versions the tests and tools run with: a constraints file for scripts/install.sh."
  echo "# Made by scripts/lock.sh from requirements-dev.txt on Python $python_version ($(uname -s) $(uname -m)),"
  echo "# for Python 3.11 and newer: several of the tools pinned there need 3.11."
  echo "# torch has no build label here: the CPU build, or a CUDA build where one is installed."
  "$work/venv/bin/python" -m pip freeze --all --exclude-editable --disable-pip-version-check |
    grep -v '^pip==' | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} >requirements-lock.txt
echo "lock: $(grep -vc '^#' requirements-lock.txt) packages written to requirements-lock.txt"
