"""Group resets: every full reset of the envs starts groups of G consecutive envs from one initial state, so
that their episodes can be compared (GRPO's groups, PPO's `algo.group_size`)."""
from __future__ import annotations

from roborl.config import Config
from roborl.errors import UserError
from roborl.sim import VecEnv


def start_groups_alike(cfg: Config, env: VecEnv, group_size: int, option: str) -> None:
    """Makes every full reset of `env` start groups of `group_size` consecutive envs from one initial state;
    `option` (the config key that asked for it) is refused in one line where that cannot work: the env has
    no group resets, `group_size` does not divide its envs, or an iteration is not one whole episode."""
    n = env.num_envs
    if n % group_size:
        raise UserError(f"env.num_envs ({n}) must be a multiple of {option} ({group_size})")
    if not env.supports_group_resets:
        raise UserError(f"{option} needs group resets; {cfg.env.id} has no reset option group_size "
                        "(the embedded mujoco/ tasks have it)")
    episode = env.max_episode_steps
    if episode is None or cfg.train.rollout_steps != episode:
        raise UserError(f"{option} needs whole episodes per iteration: set train.rollout_steps to the episode "
                        f"length ({episode})")
    env.set_group_size(group_size)  # every full reset, through any wrapper, starts groups alike
