"""Ray env workers: actors that each own a VecEnv shard and, collocated, a copy of the policy and of the
algorithm's collection (`Algorithm.collect`, then `rollout_part`), so the data they return is what the
learner's own `collect` would have gathered from those envs.

`WorkerPool` starts `resources.env_workers` of them with the Ray resources the config asks for
(placement), sends them the learner's weights, collects their rollouts synchronously or with up to
`resources.max_staleness` rollouts in flight per worker, and replaces a worker that dies: the new one
gets fresh seeds and resets its envs, and the steps the dead one was collecting are counted as lost.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections import deque
from typing import Any

import torch

from roborl.algos import make_algorithm
from roborl.builder import make_run_env, make_run_policy, option_machines, resolve_device
from roborl.collect import EpisodeLog
from roborl.config import SEED_STRIDE, Config
from roborl.errors import UserError

RESTART_SEED = 7919  # a replacement worker adds this per replacement, so it does not replay the dead one


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("resources.env_workers needs Ray: pip install -e '.[distributed]' (or run scripts/setup.sh)") \
            from None
    return ray


def check_reachable(address: str | None) -> None:
    """A cluster at "host:port" answers within seconds, or the run stops here: Ray itself would retry
    for minutes."""
    if address is None or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise UserError(f"resources.ray_address '{address}': no Ray cluster there ({exc}); start one with "
                        "`ray start --head` or leave ray_address empty for a local one") from None


def ray_resources() -> dict[str, float]:
    """The Ray resources this actor was given (its placement)."""
    import ray
    return dict(ray.get_runtime_context().get_assigned_resources())


class EnvWorker:
    """One shard of the envs (`env.num_envs` of the shard config), stepped in this actor's process."""

    def __init__(self, cfg: Config, seed: int) -> None:
        r = cfg.resources
        self.cfg = cfg
        self.seed = seed
        self.device = resolve_device(r.device or cfg.train.device)
        torch.set_num_threads(max(1, int(r.worker_cpus)))
        torch.manual_seed(seed)
        self.env = make_run_env(cfg, cfg.env.num_envs, seed, self.device)
        self.policy: torch.nn.Module | None = None
        self.version = -1
        self.obs: dict | None = None

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def describe(self) -> dict:
        """What the learner needs to know of the envs: spaces, limits, scaling."""
        e = self.env
        return {"observation_space": e.observation_space, "action_space": e.action_space,
                "label_names": e.label_names, "reward_term_names": e.reward_term_names,
                "max_episode_steps": e.max_episode_steps, "control_dt": e.control_dt,
                "action_scaling": e.action_scaling(), "resources": ray_resources(),
                "supports_group_resets": e.supports_group_resets, "option_machines": option_machines(e)}

    def set_group_size(self, group_size: int) -> None:
        self.env.set_group_size(group_size)

    def reset(self, seed: int | None, options: dict | None = None) -> dict:
        self.obs = self.env.reset(seed=seed, **({"options": options} if options else {}))
        return self.obs

    def step(self, action: torch.Tensor) -> tuple:
        out = self.env.step(action.to(self.device))
        self.obs = out[0]
        return out

    def load(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if self.policy is None:
            c = self.cfg
            self.policy = make_run_policy(c, self.env).to(self.device)
            own_seeds = dataclasses.replace(c, train=dataclasses.replace(c.train, seed=self.seed))  # its own draws
            self.algo = make_algorithm(own_seeds, self.policy, self.env, self.device)
            self.algo.in_worker = True
        if version != self.version:
            self.policy.load_state_dict(weights)
            self.version = version

    def rollout(self, weights: dict[str, torch.Tensor], version: int) -> dict:
        """One iteration's data with the policy of `version`, from where the last one stopped."""
        self.load(weights, version)
        self.algo.start_iteration(version, version + 1)  # group resets draw the learner's iteration's starts
        log = EpisodeLog()
        self.obs = self.algo.collect(self.env, self.obs, log)
        return {**self.algo.rollout_part(self.obs), "episodes": log.values, "violations": log.violations,
                "version": version}

    def close(self) -> None:
        self.env.close()


def shard_config(cfg: Config) -> Config:
    """What each worker builds: its share of the envs."""
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env,
                               num_envs=cfg.env.num_envs // cfg.resources.env_workers))


class WorkerPool:
    """The run's env workers (see the module's docstring)."""

    def __init__(self, cfg: Config) -> None:
        self.ray = ray = import_ray()
        r = cfg.resources
        self.cfg, self.shard = cfg, shard_config(cfg)
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            check_reachable(r.ray_address)
            needed = int(r.env_workers * r.worker_cpus) + 1
            local = {"num_cpus": max(os.cpu_count() or 1, needed)} if r.ray_address is None else {}
            try:
                ray.init(address=r.ray_address, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING, **local)
            except ConnectionError as exc:
                raise UserError(f"resources.ray_address '{r.ray_address}': no Ray cluster there ({exc}); start one "
                                "with `ray start --head` or leave ray_address empty for a local one") from None
        self.actor_class = ray.remote(num_cpus=r.worker_cpus, num_gpus=r.worker_gpus)(EnvWorker)
        self.restarts = 0
        self.lost_steps = 0
        self.replacements = [0] * r.env_workers
        self.workers = [self.start(i) for i in range(r.env_workers)]
        self.version = -1
        self.weights_ref: Any = None
        self.inflight: list[deque] = [deque() for _ in self.workers]
        self.last_seed: int | None = None

    @property
    def envs_per_worker(self) -> int:
        return self.shard.env.num_envs

    def seed_of(self, i: int, seed: int) -> int:
        return seed + (i + 1) * SEED_STRIDE + RESTART_SEED * self.replacements[i]

    def start(self, i: int) -> Any:
        """Worker i, on the node `resources.worker_nodes` names for it where that node is alive (a soft
        preference: a replacement for a worker whose node is gone goes wherever Ray finds room)."""
        options = {}
        nodes = self.cfg.resources.worker_nodes
        if nodes:
            label = nodes[i % len(nodes)]
            node = self.node_with(label)
            if node is None and not self.replacements[i]:
                raise UserError(f"resources.worker_nodes: no live Ray node has the custom resource '{label}'; "
                                f"start one with `ray start --address ... --resources '{{\"{label}\": 1}}'` "
                                "or leave worker_nodes empty")
            if node is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
        return self.actor_class.options(**options).remote(self.shard, self.seed_of(i, self.cfg.train.seed))

    def node_with(self, resource: str) -> str | None:
        """The id of a live Ray node that has the custom resource `resource`."""
        for node in self.ray.nodes():
            if node["Alive"] and resource in node["Resources"]:
                return node["NodeID"]
        return None

    def nodes(self) -> list[str]:
        """The Ray node each worker runs on."""
        return self.ray.get([w.node.remote() for w in self.workers])

    def pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers])

    def describe(self) -> dict:
        return self.ray.get(self.workers[0].describe.remote())

    def replace(self, i: int, lost_steps: int) -> dict:
        """A new worker in place of worker i, which died; its envs start from a reset (returned)."""
        self.restarts += 1
        self.lost_steps += lost_steps
        if self.restarts > self.cfg.resources.max_restarts:
            raise UserError(f"env workers died {self.restarts} times (more than resources.max_restarts="
                            f"{self.cfg.resources.max_restarts}); see the Ray logs in /tmp/ray/session_latest/logs")
        self.ray.kill(self.workers[i], no_restart=True)
        self.replacements[i] += 1
        self.workers[i] = self.start(i)
        self.inflight[i].clear()
        seed = None if self.last_seed is None else self.seed_of(i, self.last_seed)
        return self.ray.get(self.workers[i].reset.remote(seed))

    def call(self, method: str, args: list[tuple], lost_steps: int = 0) -> tuple[list[Any], dict[int, dict]]:
        """`method(*args[i])` on every worker i. A worker that died is replaced: its result is None, and
        the second value maps its index to the observation its replacement reset to."""
        refs = [getattr(w, method).remote(*a) for w, a in zip(self.workers, args)]
        out, replaced = [], {}
        for i, ref in enumerate(refs):
            try:
                out.append(self.ray.get(ref))
            except self.ray.exceptions.RayActorError:
                replaced[i] = self.replace(i, lost_steps)
                out.append(None)
        return out, replaced

    def reset(self, seed: int | None, options: dict | None = None) -> list[dict]:
        self.last_seed = seed
        n = len(self.workers)
        parts, replaced = self.call("reset", [(None if seed is None else self.seed_of(i, seed), options)
                                              for i in range(n)])
        return [replaced.get(i, p) for i, p in enumerate(parts)]

    # ---- collocated rollouts ----------------------------------------------------------------------
    def publish(self, policy: torch.nn.Module) -> None:
        """The learner's current weights, put once into Ray's object store for every worker."""
        self.version += 1
        self.weights_ref = self.ray.put({k: v.detach().cpu() for k, v in policy.state_dict().items()})

    def submit(self, i: int) -> None:
        self.inflight[i].append(self.workers[i].rollout.remote(self.weights_ref, self.version))

    def rollouts(self) -> list[dict]:
        """One rollout per worker: the oldest in flight, or (none in flight) a new one with the current
        weights. A worker that died is replaced and collects its rollout again with the current weights."""
        out = []
        for i in range(len(self.workers)):
            if not self.inflight[i]:
                self.submit(i)
            while self.inflight[i]:
                ref = self.inflight[i].popleft()
                try:
                    out.append(self.ray.get(ref))
                    break
                except self.ray.exceptions.RayActorError:
                    lost = self.envs_per_worker * self.shard.train.rollout_steps * self.shard.env.action_chunk
                    self.replace(i, lost_steps=lost * (1 + len(self.inflight[i])))
                    self.submit(i)
        return out

    def fill(self, depth: int) -> None:
        """Tops every worker up to `depth` rollouts in flight, with the current weights."""
        for i in range(len(self.workers)):
            while len(self.inflight[i]) < depth:
                self.submit(i)

    def close(self) -> None:
        for w in self.workers:
            try:
                self.ray.get(w.close.remote(), timeout=10)
            except Exception:  # a worker that is already gone has nothing to close
                pass
            self.ray.kill(w, no_restart=True)
        self.workers = []
        if self.started_ray:
            self.ray.shutdown()
