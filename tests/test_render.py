"""The batched MuJoCo renderer (roborl/sim/render.py): every env in its own tile of one framebuffer, read back
once per call, against frames drawn one at a time."""
import torch
from helpers import same_picture

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.sim import render


def moved(n: int) -> sim.VecEnv:
    """Push with `n` rgb envs whose arms took different random actions, so that no two frames look alike."""
    env = sim.make("mujoco/Push", n, seed=0, obs_mode="rgb", render_size=(32, 32))
    env.reset(seed=0)
    actions = torch.Generator().manual_seed(0)
    for _ in range(8):
        env.step(torch.rand(n, 4, generator=actions) * 2 - 1)
    return env


def test_an_env_is_drawn_in_its_own_tile_whatever_else_a_call_renders():
    env = moved(5)  # 3 × 2 tiles, one left empty
    frames = env.render()
    assert frames.shape == (5, 32, 32, 3)
    assert torch.equal(torch.stack([env.render([i])[0] for i in range(5)]), frames)
    assert torch.equal(env.render([4, 1]), frames[[4, 1]])
    assert not any(same_picture(frames[i], frames[j]) for i in range(5) for j in range(i))  # a swap would show
    env.close()


def test_tiles_and_pages_show_what_frames_drawn_one_at_a_time_show(monkeypatch):
    """With a framebuffer of one tile, each frame is drawn at its origin and read back alone (the renderer
    before tiles); with 2 × 2 tiles, 5 envs take two pages. All show the same pictures as 3 × 2 tiles on one."""
    env = moved(5)
    tiled = env.render()
    env.close()
    for side in (32, 64):
        monkeypatch.setattr(render, "MAX_SIDE", side)
        env = moved(5)
        assert (env._renderer.columns, env._renderer.rows) == ((1, 1) if side == 32 else (2, 2))
        frames = env.render()
        assert all(same_picture(frames[i], tiled[i]) for i in range(5))
        assert torch.equal(frames[0], tiled[0])  # tile 0 sits at the origin in every layout
        assert torch.equal(env.render([4]), frames[[4]])  # a frame of the last page alone
        env.close()
