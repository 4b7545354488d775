#!/usr/bin/env bash
# Build a wheel and an sdist of every distribution in this repository into dist/ (or the folder
# given as the first argument): mizuoto-sdk, mizuoto-contract and the two bundled engines.
# Uses the current Python's setuptools (>=77, no network, no build isolation); the `build`
# package is not needed. Install from the result without an index:
#   pip install --find-links dist mizuoto-sdk mizuoto-contract
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
projects=(. ./contract_tests ./plugins/mizuoto-engine-sine ./plugins/mizuoto-engine-codeclm)

python - <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    found = version("setuptools")
except PackageNotFoundError:
    sys.exit("scripts/build.sh needs setuptools>=77: pip install 'setuptools>=77'")
if int(found.split(".")[0]) < 77:
    sys.exit(f"scripts/build.sh needs setuptools>=77, found {found}: pip install 'setuptools>=77'")
EOF

rm -f "$out"/mizuoto_*.whl "$out"/mizuoto_*.tar.gz
for project in "${projects[@]}"; do
  # A build/ folder left by an earlier build would put modules deleted since into the wheel.
  rm -rf "$project/build"
  python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --no-cache-dir -w "$out" "$project"
  (cd "$project" && python -c \
    'import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])' \
    "$out" 2>&1 >/dev/null | { grep -v -e 'standard file not found' -e '^$' >&2 || true; })
  rm -rf "$project/build"
done
ls -1 "$out"/mizuoto_*
