"""SAC (twin critics, target networks, learned entropy temperature) for policies with `sample(obs)`.

The critics are Q(features(obs), executed action); for a residual policy the features include the
base's action, so Q judges the corrected action in the context of what the base wanted.

As an algorithm (roborl/algos/base.py) SAC trains residual policies and Gaussian ones (tanh-squashed, with
a state-dependent std: roborl/policies/gaussian.py) off-policy: every env step goes to a replay buffer, and
`sac.utd_ratio` gradient updates follow each transition, once `sac.seed_steps` steps are in. For a residual
the seeding steps run the base alone; then, as in Policy Decorator, exploration is progressive: at the start
of each episode an env runs the residual with probability min(t / sac.progressive_steps, 1) (t counted from
the end of seeding) and the bare base otherwise; evaluation always runs the full residual.
With `sac.crm` and a reward machine, each transition is stored as seen from every machine state (CRM); with a
hierarchy learned by options, as seen from every option that can run.
RLPD: demonstrations (`sac.demos`) and the transitions an operator commanded (`intervened` in what a robot
actor sends, roborl/robot/actor.py) go to a second buffer, which gives `sac.offline_fraction` of every batch.
Its checkpoint state holds the critics, target critics, temperature, the three optimizers and the filled
part of both buffers, so a resumed run goes on where it stopped.
"""
from __future__ import annotations

import copy
import time

import torch
from torch import nn

from roborl.algos.base import Algorithm, Comm
from roborl.collect import EpisodeLog, Step, run_steps
from roborl.config import Config, SACConfig
from roborl.errors import UserError
from roborl.policies.act import Act
from roborl.policies.gaussian import mlp
from roborl.replay import ReplayBuffer, sample_mixed
from roborl.rm import HierarchyEnv, RewardMachineEnv
from roborl.sim import VecEnv
from roborl.sim.batch import clone, concat, merge_rows
from roborl.sim.wrapper import find_wrapper


class TwinQ(nn.Module):
    def __init__(self, in_dim: int, action_dim: int, hidden: list[int], layer_norm: bool = False) -> None:
        """`layer_norm`: LayerNorm in the hidden layers, which keeps Q from extrapolating wildly to actions
        the data lacks: what lets RLPD learn from few demonstrations (Ball et al. 2023)."""
        super().__init__()
        self.q1 = mlp([in_dim + action_dim, *hidden, 1], "relu", 1.0, layer_norm)
        self.q2 = mlp([in_dim + action_dim, *hidden, 1], "relu", 1.0, layer_norm)

    def forward(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xa = torch.cat([x, action], -1)
        return self.q1(xa).squeeze(-1), self.q2(xa).squeeze(-1)


class SAC(Algorithm):
    name = "sac"

    def __init__(self, policy: nn.Module, feature_dim: int, action_dim: int, cfg: SACConfig,
                 device: torch.device, comm: Comm | None = None) -> None:
        """The learner alone (critics, temperature, optimizers, `update(batch)`); `from_config` adds the
        replay buffer and the collection."""
        super().__init__(policy, comm)
        self.cfg, self.device = cfg, device
        self.critic = TwinQ(feature_dim, action_dim, list(cfg.critic_hidden), cfg.critic_layer_norm).to(device)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(float(cfg.init_alpha), device=device).log().requires_grad_(True)
        self.target_entropy = -float(action_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.actor_params = [p for p in policy.parameters() if p.requires_grad]
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=cfg.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach()

    def critic_loss(self, batch: dict, features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean squared Bellman error of both critics against the soft target, and the target. `features`: the
        batch's obs features where the caller has them; no gradient reaches the policy's encoder through them
        (the actor's loss trains it)."""
        with torch.no_grad():
            next_action, next_logp, next_features = self.policy.sample(batch["next_obs"])
            tq1, tq2 = self.target(next_features, next_action)
            soft_v = torch.min(tq1, tq2) - self.alpha * next_logp
            target = batch["reward"] + self.cfg.gamma * (1 - batch["terminated"]) * soft_v
            features = self.policy.features(batch["obs"]) if features is None else features.detach()
        q1, q2 = self.critic(features, batch["action"])
        return 0.5 * ((q1 - target).square().mean() + (q2 - target).square().mean()), target

    @property
    def lr(self) -> float:
        return self.cfg.lr

    def update(self, batch: dict | None = None) -> dict[str, float]:
        """One gradient step on `batch` (default: the statistics of the steps `collect` took, which updated
        as it went, `sac.utd_ratio` per transition)."""
        if batch is None:
            return self.iteration_stats()
        stats: dict[str, float] = {}
        actor_step = (self.updates + 1) % self.cfg.actor_delay == 0
        features = self.policy.features(batch["obs"]) if actor_step else None  # the encoder runs once for both losses
        loss, target = self.critic_loss(batch, features)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.comm.average_gradients(list(self.critic.parameters()))
        self.critic_opt.step()
        stats.update(critic_loss=loss.item(), q_target=target.mean().item())
        self.updates += 1
        if actor_step:
            action, logp, features = self.policy.sample(batch["obs"], features)
            q1, q2 = self.critic(features, action)
            actor_loss = (self.alpha * logp - torch.min(q1, q2)).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.comm.average_gradients(self.actor_params)
            self.actor_opt.step()
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.comm.average_gradients([self.log_alpha])
            self.alpha_opt.step()
            stats.update(actor_loss=actor_loss.item(), alpha=self.alpha.item(), entropy=-logp.mean().item())
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.target.parameters()):
                tp.lerp_(p, self.cfg.tau)
        return stats

    # ---- the run: replay, progressive exploration, collection ------------------------------------
    @classmethod
    def from_config(cls, cfg: Config, policy: nn.Module, env: VecEnv, device: torch.device,
                    comm: Comm | None = None) -> SAC:
        if cfg.policy.kind not in ("residual", "gaussian"):
            raise UserError("train.algorithm sac trains residual and gaussian policies (policy.kind residual or "
                            f"gaussian); use ppo for policy.kind {cfg.policy.kind}")
        crm = None
        if cfg.sac.crm:
            crm = find_wrapper(env, RewardMachineEnv) or find_wrapper(env, HierarchyEnv)
            if crm is None:
                raise UserError("sac.crm needs a reward machine or a hierarchy of them (env.rm.machine or env.rm.ltlf) "
                                "in the learner's process (not with Ray env workers)")
        residual_on = torch.rand(env.num_envs) < exploration_prob(cfg.sac, 0)  # drawn before the critics' init
        algo = cls(policy, policy.feature_dim, env.action_dim, cfg.sac, device, comm)
        algo.comm.broadcast_module(algo.critic)  # several learners start from rank 0's critics
        algo.comm.broadcast_module(algo.target)
        algo.start_collection(cfg, residual_on, crm, env.observation_space["state"].shape[0])
        return algo

    def start_collection(self, cfg: Config, residual_on: torch.Tensor, crm: RewardMachineEnv | None,
                         state_dims: int) -> None:
        self.run_cfg, self.crm = cfg, crm
        self.replay = ReplayBuffer(self.cfg.buffer_size, self.device)
        self.offline = ReplayBuffer(self.cfg.buffer_size, self.device)  # demonstrations and interventions (RLPD)
        self.residual = cfg.policy.kind == "residual"
        if self.cfg.demos:
            from roborl.demos import check_demo_state, load_demo_transitions

            reward = "success" if cfg.resources.actor == "robot" else "env"
            demos = load_demo_transitions(self.cfg.demos, reward, self.cfg.demo_episodes, images=cfg.env.obs_mode == "rgb")
            check_demo_state(self.cfg.demos, demos[0]["state"].shape[1], state_dims)
            self.offline.add(*demos)
        self.collected = 0
        self.residual_on = residual_on.to(self.device)
        self.update_debt = 0.0
        self.generator: torch.Generator | None = None
        self.stats: dict[str, list[float]] = {}
        self.collect_time = 0.0

    def exploration_prob(self) -> float:
        return exploration_prob(self.cfg, self.collected)

    def start_iteration(self, iteration: int, total_iterations: int) -> None:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.run_cfg.train.seed + iteration)

    def act(self, obs: dict) -> Act:
        """A residual's sample where it is on and the bare base elsewhere; a Gaussian policy's sample."""
        action, log_prob, _ = self.policy.sample(obs)
        if not self.residual:
            return Act(action, log_prob)
        return Act(torch.where(self.residual_on[:, None], action, obs["base_action"]), log_prob)

    def collect(self, env: VecEnv, obs: dict, log: EpisodeLog) -> dict:
        """`train.rollout_steps` steps into the replay buffer, with the updates each step is due. In a Ray env
        worker (`in_worker`) the transitions are kept for `rollout_part` and nothing learns here; the step
        count that paces exploration counts every worker's envs (they step alike)."""
        s, N = self.cfg, env.num_envs
        counted = N * (self.run_cfg.resources.env_workers if self.in_worker else self.comm.world)  # every env
        self.stats, self.collect_time, self.transitions = {}, 0.0, []
        t0 = [time.time()]

        def record(step: Step) -> None:
            done = step.done
            stored_next = step.next_obs
            if done.any():
                stored_next = clone(step.next_obs)
                merge_rows(stored_next, step.info["final_obs"], done)
                p = self.exploration_prob()
                self.residual_on[done] = torch.rand(int(done.sum()), generator=self.generator).to(self.device) < p
            if self.crm is not None:
                transition = self.counterfactuals(step.obs, step.act.action, stored_next, step.info)
            else:  # an option's return ends where its machine returns (env.rm.learner options); the env goes on
                ended = step.terminated | step.info["option_end"] if "option_end" in step.info else step.terminated
                transition = (step.obs, step.act.action, step.reward, stored_next, ended)
            log.record(step.info)
            if self.in_worker:
                self.transitions.append(clone(transition))
            else:
                self.replay.add(*transition)
                self.policy.update_normalizer(self.comm.gather_state(step.obs))
            self.collected += counted
            if self.collected - counted < s.seed_steps <= self.collected:  # seeding is over
                self.residual_on[:] = torch.rand(N, generator=self.generator).to(self.device) < self.exploration_prob()
            self.collect_time += time.time() - t0[0]
            if not self.in_worker:
                self.learn(counted)
            t0[0] = time.time()

        obs = run_steps(env, obs, self.act, record, self.run_cfg.train.rollout_steps)
        self.env_steps = self.run_cfg.train.rollout_steps * N * self.run_cfg.env.action_chunk
        return obs

    def learn(self, transitions: int, most: int | None = None) -> None:
        """The gradient updates that `transitions` new env transitions (of every learner) are due
        (`sac.utd_ratio` each), once seeding is over and the buffer holds a batch: only those past the seeding count,
        whether they come one step at a time or as a worker's whole rollout; updates for at `most` that many
        transitions (a robot actor's backlog is absorbed without them). With several learners each
        samples its share of `sac.batch_size` from its own buffer, and the gradients are averaged: the update
        of the union batch, as many times as one learner would make it."""
        s = self.cfg
        if self.collected < s.seed_steps or len(self.replay) < s.batch_size:
            return
        due = min(transitions, self.collected - s.seed_steps, transitions if most is None else most)
        self.update_debt += due * s.utd_ratio
        with torch.enable_grad():
            while self.update_debt >= 1:
                self.update_debt -= 1
                batch = sample_mixed(self.replay, self.offline, s.batch_size // self.comm.world, s.offline_fraction,
                                     self.generator)
                for k, v in self.update(batch).items():
                    self.stats.setdefault(k, []).append(v)

    def rollout_part(self, obs: dict) -> dict:
        """A Ray env worker's transitions of this iteration, for the learner's `absorb`."""
        return {"transitions": tuple(concat([t[i] for t in self.transitions]) for i in range(5)),
                "env_rows": self.run_cfg.train.rollout_steps * len(self.residual_on), "last_obs": obs}

    def absorb(self, parts: list[dict], obs: dict, log: EpisodeLog, update_rows: int | None = None) -> None:
        """The workers' (or a robot actor's) transitions into the replay buffer, those an operator commanded
        (`intervened`) into the demonstration buffer too, then the updates they are due: those of at most
        `update_rows` transitions where it is given (a robot's actor runs on while the learner updates, and
        a learner slower than the robot lets its update-to-data ratio fall rather than fall behind)."""
        self.stats, self.collect_time = {}, 0.0
        rows = 0
        for part in parts:
            transition = part["transitions"]
            self.replay.add(*transition)
            intervened = part.get("intervened")
            if intervened is not None and intervened.any():
                obs_, action, reward, next_obs, terminated = transition
                pick = lambda d: {k: v[intervened] for k, v in d.items()}  # noqa: E731
                self.offline.add(pick(obs_), action[intervened], reward[intervened], pick(next_obs),
                                 terminated[intervened])
            self.policy.update_normalizer(transition[0])
            rows += part["env_rows"]
        self.collected += rows
        updates = self.updates
        self.learn(rows, update_rows)
        self.stats["transitions_absorbed"] = [float(rows)]
        self.stats["updates_per_transition"] = [(self.updates - updates) / max(rows, 1)]
        self.env_steps = rows * self.run_cfg.env.action_chunk

    def iteration_stats(self) -> dict[str, float]:
        out = {k: sum(v) / len(v) for k, v in self.stats.items()}
        if self.collect_time > 0:
            out["collect_sps"] = self.run_cfg.train.rollout_steps * len(self.residual_on) / self.collect_time
        out.update(replay_size=float(len(self.replay)), offline_size=float(len(self.offline)))
        if self.residual:
            out["residual_on"] = self.exploration_prob()
        return out

    def counterfactuals(self, obs: dict, action: torch.Tensor, next_obs: dict, info: dict) -> tuple:
        """CRM: the transition as seen from every non-terminal machine state, or from every option that can run
        (the machine's one-hot is the last U entries of `state`; other observation keys are repeated)."""
        rm, U = self.crm, self.crm.machine_columns
        states, next_states, rewards, terminated = rm.counterfactuals(
            obs["state"][:, :-U], next_obs["state"][:, :-U], info["labels"], info["env_reward"],
            info["task_terminated"], info.get("reward_terms"))
        copies = states.shape[0] // action.shape[0]
        rep = lambda d: {k: v.repeat(copies, *([1] * (v.dim() - 1))) for k, v in d.items()  # noqa: E731
                         if isinstance(v, torch.Tensor) and k not in ("state", "rm_state")}
        return ({**rep(obs), "state": states}, action.repeat(copies, 1), rewards,
                {**rep(next_obs), "state": next_states}, terminated)

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"critic": self.critic.state_dict(), "target": self.target.state_dict(),
                "log_alpha": self.log_alpha.detach(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(),
                "updates": self.updates, "collected": self.collected, "update_debt": self.update_debt,
                "residual_on": self.residual_on, "replay": self.replay.state_dict(),
                "offline": self.offline.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.updates, self.collected, self.update_debt = state["updates"], state["collected"], state["update_debt"]
        self.residual_on = state["residual_on"].to(self.device)
        self.replay.load_state_dict(state["replay"])
        if "offline" in state:
            self.offline.load_state_dict(state["offline"])


def exploration_prob(s: SACConfig, collected: int) -> float:
    """The probability that an episode starting after `collected` env steps runs the residual."""
    if collected < s.seed_steps:
        return 0.0
    return 1.0 if s.progressive_steps <= 0 else min((collected - s.seed_steps) / s.progressive_steps, 1.0)
