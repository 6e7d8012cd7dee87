"""Off-policy training (SAC) of residual policies: every env step goes to a replay buffer, and
`sac.utd_ratio` gradient updates follow each transition.

The buffer is first seeded with `sac.seed_steps` steps of the base alone. Then, as in Policy Decorator,
exploration is progressive: at the start of each episode an env runs the residual with probability
min(t / sac.progressive_steps, 1) (t counted from the end of seeding) and the bare base otherwise;
evaluation always runs the full residual.
"""
from __future__ import annotations

import time

import torch

from roborl.algos.sac import SAC
from roborl.config import Config
from roborl.errors import UserError
from roborl.replay import ReplayBuffer
from roborl.rm import RewardMachineEnv
from roborl.trainer import Trainer
from sim.vec_env import clone_obs, merge_rows

ALGORITHMS = ("ppo", "sac", "grpo")


class SACTrainer(Trainer):
    def make_algo(self) -> SAC:
        cfg = self.cfg
        if cfg.policy.kind != "residual":
            raise UserError("train.algorithm sac trains residual policies (policy.kind residual); use ppo for "
                            f"policy.kind {cfg.policy.kind}")
        if cfg.train.resume:
            raise UserError("train.resume is not supported with train.algorithm sac: the critics and the replay "
                            "buffer are not checkpointed; start a new run (policy.init is not needed)")
        self.replay = ReplayBuffer(cfg.sac.buffer_size, self.device)
        self.collected = 0
        on = torch.rand(self.env.num_envs) < self.exploration_prob()
        self.residual_on = on.to(self.device)
        self.update_debt = 0.0
        self.crm = None
        if cfg.sac.crm:
            self.crm = find_wrapper(self.env, RewardMachineEnv)
            if self.crm is None:
                raise UserError("sac.crm needs a reward machine (env.rm.machine or env.rm.ltlf)")
        feature_dim = self.policy.actor[0].in_features
        return SAC(self.policy, feature_dim, self.env.action_dim, cfg.sac, self.device)

    def exploration_prob(self) -> float:
        s = self.cfg.sac
        if self.collected < s.seed_steps:
            return 0.0
        return 1.0 if s.progressive_steps <= 0 else min((self.collected - s.seed_steps) / s.progressive_steps, 1.0)

    def iterate(self, total_iters: int) -> dict[str, float]:
        s, N = self.cfg.sac, self.env.num_envs
        stats: dict[str, list[float]] = {}
        collect_time = 0.0
        obs = self.obs
        for _ in range(self.cfg.train.rollout_steps):
            t0 = time.time()
            with torch.no_grad():
                action, _ = self.policy.sample(obs)
                action = torch.where(self.residual_on[:, None], action, obs["base_action"])
            next_obs, reward, term, trunc, info = self.env.step(action)
            done = term | trunc
            stored_next = next_obs
            if done.any():
                stored_next = clone_obs(next_obs)
                merge_rows(stored_next, info["final_obs"], done)
                p = self.exploration_prob()
                self.residual_on[done] = torch.rand(int(done.sum()), generator=self.generator).to(self.device) < p
            if self.crm is not None:
                self.replay.add(*self.counterfactuals(obs, action, stored_next, info))
            else:
                self.replay.add(obs, action, reward, stored_next, term)
            self.record_episodes(info)
            self.policy.update_normalizer(obs)
            obs = next_obs
            self.collected += N
            if self.collected - N < s.seed_steps <= self.collected:  # seeding is over
                self.residual_on[:] = torch.rand(N, generator=self.generator).to(self.device) < self.exploration_prob()
            collect_time += time.time() - t0
            if self.collected < s.seed_steps or len(self.replay) < s.batch_size:
                continue
            self.update_debt += N * s.utd_ratio
            while self.update_debt >= 1:
                self.update_debt -= 1
                for k, v in self.algo.update(self.replay.sample(s.batch_size, self.generator)).items():
                    stats.setdefault(k, []).append(v)
        self.obs = obs
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out.update(collect_sps=self.cfg.train.rollout_steps * N / max(collect_time, 1e-9),
                   residual_on=self.exploration_prob(), replay_size=float(len(self.replay)))
        return out


    def counterfactuals(self, obs: dict, action: torch.Tensor, next_obs: dict, info: dict) -> tuple:
        """CRM: the transition as seen from every non-terminal machine state (the machine's one-hot is the
        last U entries of `state`; other observation keys are repeated)."""
        rm, U = self.crm, self.crm.machine.num_states
        states, next_states, rewards, terminated = rm.counterfactuals(
            obs["state"][:, :-U], next_obs["state"][:, :-U], info["labels"], info["env_reward"],
            info["task_terminated"], info.get("reward_terms"))
        copies = states.shape[0] // action.shape[0]
        rep = lambda d: {k: v.repeat(copies, *([1] * (v.dim() - 1))) for k, v in d.items()  # noqa: E731
                         if isinstance(v, torch.Tensor) and k not in ("state", "rm_state")}
        return ({**rep(obs), "state": states}, action.repeat(copies, 1), rewards,
                {**rep(next_obs), "state": next_states}, terminated)


def find_wrapper(env: object, cls: type) -> object | None:
    """The first wrapper of type `cls` around the simulator, or None."""
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, "env", None)
    return None


def make_trainer(cfg: Config) -> Trainer:
    """The trainer of `train.algorithm`."""
    if cfg.train.algorithm not in ALGORITHMS:
        raise UserError(f"train.algorithm '{cfg.train.algorithm}' is unknown; available: {', '.join(ALGORITHMS)}")
    if cfg.resources.env_workers:
        from roborl.ray_trainer import RayTrainer  # Ray is imported only by the runs that use it
        return RayTrainer(cfg)
    if cfg.train.algorithm == "grpo":
        from roborl.grpo import GRPOTrainer

        return GRPOTrainer(cfg)
    return SACTrainer(cfg) if cfg.train.algorithm == "sac" else Trainer(cfg)
