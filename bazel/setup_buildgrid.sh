#!/usr/bin/env bash
# What //tests/consumer_check:consumer_test runs a remote cache and executor with: BuildGrid
# (PyPI, pinned in bazel/buildgrid-requirements.txt) in .tools/buildgrid, and PostgreSQL
# (apt), which BuildGrid's scheduler requires. Quick when both are current.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { echo "bazelw: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

venv=.tools/buildgrid
stamp=$venv/.requirements.sha256
want=$(sha256sum bazel/buildgrid-requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing BuildGrid in $venv (bazel/buildgrid-requirements.txt)"
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  log=$(mktemp)
  if ! "$venv/bin/pip" install -q --disable-pip-version-check -r bazel/buildgrid-requirements.txt >"$log" 2>&1; then
    cat "$log" >&2; say "pip install (BuildGrid) failed"; exit 1
  fi
  rm -f "$log"
  echo "$want" > "$stamp"
fi

if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  say "installing PostgreSQL (Debian postgresql), BuildGrid's scheduler database"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
