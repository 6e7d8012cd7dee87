#!/usr/bin/env bash
# Set-up on a fresh machine: creates .venv in the repository root if missing, installs PyTorch with torchvision
# (unless a torch is already in .venv), then roborl with its test, bench, docs (MkDocs), warp, maniskill,
# distributed (Ray), multiagent (PettingZoo), franka (franky), vla (transformers, peft), teleop (evdev, pyspacemouse) and lerobot extras, and
# LeRobot itself.
# GPU users: put a CUDA build of torch in .venv first, e.g.
#   python3 -m venv .venv && .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128
# and this script keeps it (every later install is constrained to the torch that is there).
set -euo pipefail
cd "$(dirname "$0")/.."
# system packages: EGL/Mesa for headless MuJoCo rendering (eval videos, rgb observations), the MONA
# solver that compiles LTLf formulas into reward machines, FFmpeg's libraries, with which torchcodec
# decodes the videos of LeRobot datasets, a C compiler, the kernel's input headers and Python's headers, against
# which evdev (the teleop extra) builds, and HIDAPI, which pyspacemouse loads
missing=()
for pkg in libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri mona ffmpeg gcc linux-libc-dev python3-dev libhidapi-hidraw0; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  else
    echo "note: missing system packages ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  fi
fi
# Vulkan for SAPIEN (the ManiSkill3 backend, maniskill/... envs): without a GPU, Mesa's lavapipe CPU driver.
# SAPIEN 3 needs Mesa >= 24.3; on Debian bookworm (Mesa 22) that comes from bookworm-backports, which also moves
# the EGL/GL Mesa packages above to the same Mesa release (MuJoCo's EGL rendering works with it). Idempotent.
mesa_vulkan=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo 0)
if ! dpkg --compare-versions "$mesa_vulkan" ge 24.3 || ! dpkg -s libvulkan1 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt_target=()
    if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
      if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/bookworm-backports.list
      fi
      apt_target=(-t bookworm-backports)
    fi
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${apt_target[@]}" mesa-vulkan-drivers libvulkan1
  else
    echo "note: ManiSkill3 (maniskill/ envs) needs Vulkan: install mesa-vulkan-drivers >= 24.3 and libvulkan1 as root" >&2
  fi
fi
PYTHON=${PYTHON:-python3}
# LIBERO (the libero/ environments) in its own .venv-libero, which needs mujoco < 4: installed meanwhile, beside
# roborl's .venv (each pip uses one core)
bash scripts/setup_libero.sh &
libero_setup=$!
trap 'kill "$libero_setup" 2>/dev/null || true' EXIT
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # a torch and the torchvision built for it (LeRobot's vision backbones): on x86_64 2.14.1 (a CUDA build that
  # also runs on the CPU), on aarch64 the CPU build 2.9.1
  case "$(uname -m)" in
    aarch64|arm64) "${PIP[@]}" install "torch==2.9.1" "torchvision==0.24.1" ;;
    *) "${PIP[@]}" install "torch==2.14.1" "torchvision==0.29.1" ;;
  esac
fi
torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])")
mkdir -p .venv/roborl
echo "torch==${torch_version}" > .venv/roborl/constraints.txt
if vision_version=$(.venv/bin/python -c "import torchvision; print(torchvision.__version__.split('+')[0])" 2>/dev/null); then
  echo "torchvision==${vision_version}" >> .venv/roborl/constraints.txt
fi
"${PIP[@]}" install -c .venv/roborl/constraints.txt -e ".[test,bench,docs,warp,maniskill,distributed,multiagent,franka,vla,teleop,lerobot]"
# LeRobot (policy.kind lerobot, LeRobot datasets) without its own pins, which would replace this torch and
# transformers 5: its newest release for Python 3.11 is 0.4.4 (roborl/policies/lerobot/compat.py)
if .venv/bin/python -c "import sys; sys.exit(sys.version_info < (3, 12))"; then
  "${PIP[@]}" install --no-deps "lerobot>=0.5"
else
  "${PIP[@]}" install --no-deps "lerobot==0.4.4"
fi
# a LeRobot plugin robot that needs no hardware, which tests/test_lerobot_robot.py drives through the bridge
"${PIP[@]}" install --no-deps "lerobot-robot-dummy==1.0.1"
# openpi's own robot-side client, which the tests drive `roborl serve` with; without its dependencies: it pins
# numpy < 2, which its websocket client does not need (and roborl's other dependencies do not allow)
"${PIP[@]}" install --no-deps "openpi-client==0.1.2"
wait "$libero_setup"
trap - EXIT
echo "roborl installed in .venv (torch ${torch_version}); try: .venv/bin/roborl train configs/ppo_reach.yaml"
