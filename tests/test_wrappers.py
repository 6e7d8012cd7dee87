"""Action chunks and observation history on top of the batched MuJoCo env, checked against stepping
the same env by hand."""
import torch

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.sim.chunking import ActionChunkEnv
from roborl.sim.history import StateHistoryEnv
from roborl.sim.render import BatchRenderer


def test_chunked_env_equals_stepping_the_chunk_by_hand():
    N, K = 3, 4
    raw, inner = sim.make("mujoco/Push", N, seed=3), sim.make("mujoco/Push", N, seed=3)
    env = ActionChunkEnv(inner, K)
    assert env.max_episode_steps == 20 and abs(env.control_dt - 4 * raw.control_dt) < 1e-12
    torch.manual_seed(0)
    obs_raw, obs = raw.reset(seed=5), env.reset(seed=5)
    ends = 0
    for _decision in range(22):
        chunk = torch.rand(N, 6, 4) * 2 - 1  # predicts 6, executes the first 4
        total = torch.zeros(N)
        for k in range(K):
            obs_raw, r, term, trunc, info_raw = raw.step(chunk[:, k])
            total += r
        obs, reward, term_c, trunc_c, info = env.step(chunk)
        assert torch.equal(obs["state"], obs_raw["state"])
        assert torch.allclose(reward, total, atol=1e-5)
        assert torch.equal(term_c | trunc_c, term | trunc)
        if (term | trunc).any():
            ends += 1
            assert torch.equal(info["final_obs"]["state"], info_raw["final_obs"]["state"])
            assert torch.equal(info["episode"]["return"], info_raw["episode"]["return"])
    assert ends == 1
    env.close()
    raw.close()


def test_chunked_env_stops_crediting_an_episode_that_ended_inside_the_chunk():
    N, K = 2, 3  # 80 control steps are not a multiple of 3: the episode ends inside the 27th decision
    raw, env = sim.make("mujoco/Push", N, seed=0), ActionChunkEnv(sim.make("mujoco/Push", N, seed=0), K)
    raw.reset(seed=0)
    env.reset(seed=0)
    hold = torch.zeros(N, K, 4)
    for _ in range(26):
        _, _, _, trunc, info = env.step(hold)
        assert not trunc.any()
    rewards = [raw.step(hold[:, 0])[1] for _ in range(81)]
    _, reward, _, trunc, info = env.step(hold)
    assert trunc.all() and info["done"].all()
    assert torch.equal(info["episode"]["length"], torch.full((N,), 80))
    assert torch.allclose(reward, rewards[78] + rewards[79], atol=1e-6)  # steps 79 and 80, not step 81
    env.close()
    raw.close()


def test_chunked_rgb_env_renders_only_the_frames_it_returns(monkeypatch):
    """The inner steps of a chunk run `unobserved`: no frames are rendered for them, yet the returned frames
    and a final observation from inside the chunk equal those of stepping the chunk by hand."""
    N, K = 2, 3  # 5 control steps: each episode ends inside the 2nd decision, on one of its unobserved steps
    make = {"seed": 0, "obs_mode": "rgb", "render_size": (32, 32), "episode_length": 5}
    raw, env = sim.make("mujoco/Reach", N, **make), ActionChunkEnv(sim.make("mujoco/Reach", N, **make), K)
    rendered = []
    real_render = BatchRenderer.render
    monkeypatch.setattr(BatchRenderer, "render", lambda self, states, *a, **kw: rendered.append(len(states))
                        or real_render(self, states, *a, **kw))
    raw.reset(seed=1)
    env.reset(seed=1)
    chunks = torch.rand(2, N, K, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    for decision, chunk in enumerate(chunks):
        for k in range(K):
            obs_raw, _, _, _, info_raw = raw.step(chunk[:, k])
            if "final_obs" in info_raw:
                final_raw = info_raw["final_obs"]["rgb"]
        del rendered[:]
        obs, _, _, _, info = env.step(chunk)
        assert torch.equal(obs["rgb"], obs_raw["rgb"])
        if decision == 0:
            assert rendered == [N] and "final_obs" not in info  # K control steps, one batch of frames
        else:
            assert info["done"].all() and torch.equal(info["final_obs"]["rgb"], final_raw)
            assert rendered == [N, N]  # the final frames inside the chunk, and the returned ones
    env.close()
    raw.close()


def test_state_history_stacks_the_last_states_and_restarts_with_each_episode():
    n = 3
    inner = sim.make("mujoco/Reach", 2, seed=1, episode_length=5)
    env = StateHistoryEnv(inner, n)
    D = inner.observation_space["state"].shape[0]
    assert env.observation_space["state"].shape == (n * D,)
    obs = env.reset(seed=1)
    states = [obs["state"][:, :D]] * n
    assert torch.equal(obs["state"], torch.cat(states, -1))
    for step in range(1, 8):
        obs, _, _, _, info = env.step(torch.zeros(2, 4))
        current = obs["state"][:, -D:]
        if step == 5:
            assert info["done"].all()
            final = info["final_obs"]["state"]
            assert torch.equal(final, torch.cat([*states[-(n - 1):], final[:, -D:]], -1))
            states = [current] * n
        else:
            states = states[1:] + [current]
        assert torch.equal(obs["state"], torch.cat(states, -1))
    env.close()
