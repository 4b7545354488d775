#!/usr/bin/env bash
# Install the SDK, the bundled engines and the test tools, editable, at the exact versions of
# requirements-lock.txt (made by scripts/lock.sh), into the active virtual environment, else into
# .venv in the checkout (scripts/venv.sh); then check the environment agrees with itself and the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
python -m pip install --quiet --disable-pip-version-check \
  -c requirements-lock.txt -r requirements-dev.txt
python -m pip install --quiet --disable-pip-version-check --no-deps \
  -c requirements-lock.txt -r scripts/reference.txt
# openai-whisper is installed without triton on purpose (scripts/reference.txt): that one line of
# pip check is expected; any other is a problem.
if ! problems=$(python -m pip check --disable-pip-version-check 2>&1); then
  problems=$(grep -v '^openai-whisper [^ ]* requires triton' <<<"$problems" || true)
  if [ -n "$problems" ]; then
    echo "$problems" >&2
    exit 1
  fi
fi
# pip install -c holds what it installs to the lock; this catches a locked package left behind at
# another version by an earlier install.
python - <<'PY'
import re
import sys
from importlib.metadata import PackageNotFoundError, version

wrong = []
for line in open("requirements-lock.txt"):
    if pin := re.match(r"([\w.-]+)==([^\s;]+)", line):
        try:
            found = version(pin[1])
        except PackageNotFoundError:
            continue
        if found.split("+")[0] != pin[2]:  # torch's build label (+cpu, +cu128) is the machine's
            wrong.append(f"{pin[1]} {found} (locked {pin[2]})")
if wrong:
    sys.exit(f"install: not the versions of requirements-lock.txt: {', '.join(wrong)}")
PY
