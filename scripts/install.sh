#!/usr/bin/env bash
# Install the SDK, the bundled engines and the test tools into the current Python, editable.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
