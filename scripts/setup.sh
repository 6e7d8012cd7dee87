#!/usr/bin/env bash
# Set-up on a fresh machine: creates .venv in the repository root if missing, installs PyTorch
# (CPU 2.13.0 unless a torch is already in .venv), then roborl with its test, bench, warp and distributed (Ray) extras.
# GPU users: put a CUDA build of torch in .venv first, e.g.
#   python3 -m venv .venv && .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128
# and this script keeps it (every later install is constrained to the torch that is there).
set -euo pipefail
cd "$(dirname "$0")/.."
# system packages: EGL/Mesa for headless MuJoCo rendering (eval videos, rgb observations) and the MONA
# solver that compiles LTLf formulas into reward machines
missing=()
for pkg in libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri mona; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  else
    echo "note: missing system packages ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  fi
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" install "torch==2.13.0"
fi
torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])")
mkdir -p .venv/roborl
echo "torch==${torch_version}" > .venv/roborl/constraints.txt
"${PIP[@]}" install -c .venv/roborl/constraints.txt -e ".[test,bench,warp,distributed]"
echo "roborl installed in .venv (torch ${torch_version}); try: .venv/bin/roborl train configs/ppo_reach.yaml"
