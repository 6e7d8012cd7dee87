#!/usr/bin/env bash
# The whole test suite in two phases: everything but the real-time tests, then the real-time tests (stop
# latencies, loop rates, braking distances on a simulated arm) in a process of their own, after the rest, so
# that nothing the other tests started competes with them for the CPU. Arguments go to both phases, e.g.
# `bash scripts/test.sh -x`. (Two pytest workers are slower here: the tests train with both cores already.)
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
phase() {  # pytest's 5 (no test selected, e.g. a file without real-time tests) is not a failure here
    .venv/bin/python -m pytest -q "$@" || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }
}
phase -m "not realtime" "$@"
phase -m realtime "$@"
exit $status
