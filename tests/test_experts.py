import torch

from roborl import sim
from roborl.tasks import EXPERTS


def expert_success(env_id: str, episodes: int = 128, seed: int = 2) -> float:
    env = sim.make(env_id, episodes, seed=seed)
    expert = EXPERTS[env_id](env)
    obs = env.reset()
    first = torch.full((episodes,), -1.0)  # each env's first episode: success at its end
    while (first < 0).any():
        obs, _, term, trunc, info = env.step(expert.act(obs))
        done = term | trunc
        expert.reset(done)
        if done.any():
            new = done & (first < 0)
            first[new] = info["episode"]["success_at_end"][new].float()
    return first.mean().item()


def test_scripted_expert_solves_its_task(task_id):
    rate = expert_success(task_id)
    assert rate >= 0.95, f"{task_id} expert success {rate:.3f}"


def test_expert_is_not_trivially_successful():
    """Doing nothing fails: success comes from the expert's behaviour, not the task's definition."""
    for env_id in EXPERTS:
        env = sim.make(env_id, 8, seed=0)
        env.reset()
        with env.unobserved():  # no camera frames: nobody reads them here
            for _ in range(env.max_episode_steps):
                _, _, _, _, info = env.step(torch.zeros(8, env.action_dim))
        assert info["episode"]["success_once"].float().mean() < 0.2, env_id
