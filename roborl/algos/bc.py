"""Behaviour cloning (`roborl bc CONFIG`, or `train.algorithm: bc`): fits a diffusion, flow or VLA policy to
demonstrations (action chunks of `policy.horizon`, `env.obs_history` states, the normalizer fitted on the
demos; VLAs also get each step's image and its episode's instruction).

As an algorithm of the runner it steps no envs: an iteration is `bc.eval_every` gradient steps (AdamW,
cosine schedule over `bc.steps`, gradients clipped at 1), after which the runner evaluates in the simulator
and writes `best`/`last` checkpoints, in the format `policy.init` of an RL config starts from. A BC run
resumes like any other (`resume=`: the optimizer, the schedule and the sampler's state are checkpointed).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from roborl.algos.base import Algorithm, Comm, Schedule
from roborl.collect import EpisodeLog
from roborl.config import Config
from roborl.demo_windows import DemoWindows
from roborl.demos import check_demo_state, load_demos
from roborl.errors import UserError
from roborl.sim import VecEnv

KINDS = ("diffusion", "flow", "token_vla", "flow_vla", "pi0", "lerobot")


class BC(Algorithm):
    name = "bc"
    steps_envs = False

    def __init__(self, policy: nn.Module, cfg: Config, env: VecEnv, device: torch.device) -> None:
        super().__init__(policy)
        b, kind = cfg.bc, cfg.policy.kind
        if kind not in KINDS:
            raise UserError(f"roborl bc trains {', '.join(KINDS)} policies; policy.kind is '{kind}'")
        # the image-reading policies (their images are checked where the policy is built)
        vla = kind in ("token_vla", "flow_vla", "pi0") or (kind == "lerobot" and "rgb" in env.observation_space.spaces)
        if not b.demos:
            raise UserError("bc.demos is empty: set it to a directory written by `roborl demos TASK --out DIR`")
        self.cfg, self.device = b, device
        self.data = data = load_demos(b.demos, cfg.env.obs_history, cfg.policy.horizon, b.max_episodes,
                                      b.success_only, images=vla)
        demo_env = data.env_args.get("env_id")
        if demo_env and demo_env != cfg.env.id:
            raise UserError(f"the demonstrations were recorded on '{demo_env}' but env.id is '{cfg.env.id}'")
        steps = cfg.env.obs_history  # both are that many steps' states side by side
        check_demo_state(b.demos, data.obs.shape[1] // steps, env.observation_space["state"].shape[0] // steps)
        self.batch = demo_batches(data, policy, device)
        self.actions = data.actions.to(device)
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=b.lr, weight_decay=b.weight_decay)
        self.schedule_lr = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / b.steps, 1))))
        self.generator = torch.Generator(device=device).manual_seed(cfg.train.seed)
        self.bc_step = 0
        self.last_steps = 0

    @classmethod
    def from_config(cls, cfg: Config, policy: nn.Module, env: VecEnv, device: torch.device,
                    comm: Comm | None = None) -> BC:
        if comm is not None and comm.world > 1:
            raise UserError("roborl bc trains in one process: set resources.learners=1")
        return cls(policy, cfg, env, device)

    def schedule(self, cfg: Config) -> Schedule:
        b = cfg.bc
        return Schedule(math.ceil(b.steps / b.eval_every), b.eval_every, eval_every=1, save_every=1,
                        unit="gradient steps")

    def collect(self, env: VecEnv, obs: dict, log: EpisodeLog) -> dict:
        self.env_steps = 0  # the demonstrations are the data
        return obs

    def update(self) -> dict[str, float]:
        """`bc.eval_every` gradient steps (fewer in the last iteration); the demos' normalizer is fitted
        before the first (after `policy.init`, whose weights the runner has loaded by then)."""
        b = self.cfg
        if self.bc_step == 0:
            self.policy.fit_normalizer(self.data.obs.to(self.device))
        steps = min(b.eval_every, b.steps - self.bc_step)
        losses = []
        for _ in range(steps):
            idx = torch.randint(0, len(self.actions), (b.batch_size,), device=self.device, generator=self.generator)
            loss = self.policy.bc_loss(self.batch(idx), self.actions[idx])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.schedule_lr.step()
            losses.append(loss.item())
        self.bc_step += steps
        self.last_steps = steps
        return {"loss": sum(losses) / len(losses), "last_loss": losses[-1], "lr": self.lr}

    @property
    def progress(self) -> int:
        return self.last_steps

    @property
    def lr(self) -> float:
        return self.schedule_lr.get_last_lr()[0]

    def summary(self) -> dict:
        return {"bc_steps": self.bc_step, "demo_episodes": self.data.episodes, "demo_windows": len(self.actions)}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "schedule": self.schedule_lr.state_dict(),
                "generator": self.generator.get_state(), "bc_step": self.bc_step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule_lr.load_state_dict(state["schedule"])
        self.generator.set_state(state["generator"])
        self.bc_step = state["bc_step"]


def demo_batches(data: DemoWindows, policy: torch.nn.Module, device: torch.device):
    """`batch(idx)`: the observations of demo windows `idx` as the policy reads them. For a VLA these are
    the current frame, the proprio state and the instruction's prompt tokens (tokenized once per distinct
    instruction); the frames stay on the CPU as uint8 and only a batch moves to `device`."""
    states = data.obs.to(device)
    if data.rgb is None:
        return lambda idx: {"state": states[idx]}
    texts = sorted(set(data.instructions))
    prompt_ids = policy.encode_text(texts, device)
    row = {text: i for i, text in enumerate(texts)}
    which = torch.tensor([row[text] for text in data.instructions], device=device)
    rgb = data.rgb

    def batch(idx: torch.Tensor) -> dict:
        return {"state": states[idx], "rgb": rgb[idx.cpu()].to(device), "text_ids": prompt_ids[which[idx]]}

    return batch
