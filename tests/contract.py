"""The VecEnv contract (docs/architecture.md) as reusable assertions (used for every backend)."""
import torch

from roborl import sim


def check_vecenv_contract(env: sim.VecEnv, steps: int) -> None:
    n = env.num_envs
    obs = env.reset(seed=3)
    assert set(env.observation_space.spaces) <= set(obs)
    state = obs["state"]
    assert state.shape == (n, *env.observation_space["state"].shape) and state.dtype == torch.float32
    assert env.action_space.shape == (env.action_dim,)
    assert (env.action_space.low == -1).all() and (env.action_space.high == 1).all()
    if env.agents:  # the agents' action dims partition the action, in order; their state columns exist
        bounds = [a.action for a in env.agents.values()]
        assert bounds[0][0] == 0 and bounds[-1][1] == env.action_dim
        assert all(stop == start for (_, stop), (start, _) in zip(bounds, bounds[1:]))
        assert all(a.state and max(a.state) < state.shape[1] for a in env.agents.values())
    saw_done = False
    for _ in range(steps):
        action = torch.rand(n, env.action_dim) * 2 - 1
        obs, reward, term, trunc, info = env.step(action)
        assert obs["state"].shape == state.shape and obs["state"].dtype == torch.float32
        assert torch.isfinite(obs["state"]).all()
        assert reward.shape == (n,) and reward.dtype == torch.float32
        assert term.shape == trunc.shape == (n,) and term.dtype == trunc.dtype == torch.bool
        assert info["success"].shape == (n,) and info["success"].dtype == torch.bool
        assert info["labels"].shape == (n, len(env.label_names)) and info["labels"].dtype == torch.bool
        done = term | trunc
        if done.any():
            saw_done = True
            final = info["final_obs"]["state"]
            assert final.shape == state.shape
            # the returned observation is already the reset one for the envs that ended
            assert not torch.allclose(final[done], obs["state"][done])
            assert info["episode"]["length"][done].min() >= 1
    assert saw_done, "no episode ended within the steps tried"
