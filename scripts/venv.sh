# Sourced by the scripts that install or run (install.sh, test.sh, demo.sh, lock.sh does not):
# use the active virtual environment, else .venv in the checkout, made on first use, so nothing is
# ever installed into the system's Python. Activating it here carries over to the commands after.
if ! python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
  if [ ! -x .venv/bin/python ]; then
    echo "no virtual environment is active: making one in .venv (activate it with . .venv/bin/activate)" >&2
    python3 -m venv .venv
  fi
  export VIRTUAL_ENV="$PWD/.venv"
  export PATH="$VIRTUAL_ENV/bin:$PATH"
  hash -r
fi
