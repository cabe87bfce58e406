#!/usr/bin/env bash
# Create (once) and update the project's .venv with Python 3.12, then run the given command in it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  PY=$(command -v python3.12 || true)
  if [ -z "$PY" ] && command -v pyenv >/dev/null; then PY=$(pyenv which python3.12 2>/dev/null || true); fi
  [ -n "$PY" ] || { echo "Python 3.12 not found (pyenv install 3.12 or put python3.12 on PATH)" >&2; exit 1; }
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import pymc_bigdata" && rm -f .venv/.installed-* && touch "$stamp"
fi
exec .venv/bin/python "$@"
