#!/usr/bin/env bash
# A virtualenv of its own for a framework whose pins clash with Trine's, and print its python.
#
#   PY="$(scripts/side_venv.sh verifiers verifiers==0.4.0)"       # .venv-verifiers: a verifiers environment
#   PY="$(scripts/side_venv.sh openenv openenv-core==0.3.0)"      # .venv-openenv: an OpenEnv server
#
# The framework never shares Trine's Python: it talks to Trine over HTTP (`trine serve`'s OpenAI endpoint,
# or an OpenEnv server that Trine's `OpenEnvEnv` calls). docs/environments.md has the routes.
# Idempotent: the venv (.venv-NAME in the repository root, or $TRINE_SIDE_VENV_DIR/NAME) is created once, and
# the packages are installed again only when the list changes (a stamp file holds it). Only the python
# path goes to stdout; pip's output goes to stderr. Exit 1 with pip's last lines when pip cannot install.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: scripts/side_venv.sh NAME PACKAGE [PACKAGE...]" >&2
    exit 2
fi
NAME="$1"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${TRINE_SIDE_VENV_DIR:-}" ]; then
    VENV="$TRINE_SIDE_VENV_DIR/$NAME"
else
    VENV="$ROOT/.venv-$NAME"
fi
STAMP="$VENV/.trine-packages"
WANT="$*"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
    echo "$VENV/bin/python"
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV" >&2
fi
LOG="$VENV/.pip.log"
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" >"$LOG" 2>&1; then
    echo "side_venv.sh: pip could not install $WANT into $VENV; its last lines:" >&2
    grep -v "WARNING: Location" "$LOG" | tail -n 15 >&2
    exit 1
fi
echo "$WANT" >"$STAMP"
echo "$VENV/bin/python"
