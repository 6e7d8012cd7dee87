import math

import torch

from roborl import (
    sim,
    tasks,  # noqa: F401
)
from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer
from roborl.config import PPOConfig
from roborl.policies import GaussianActorCritic, RunningNormalizer


def test_log_prob_is_the_gaussian_closed_form():
    torch.manual_seed(0)
    policy = GaussianActorCritic(5, 3, [16], init_log_std=-0.7, normalize_obs=False)
    obs = {"state": torch.randn(4, 5)}
    act = policy.act(obs)
    mean, std = policy.actor(obs["state"]), math.exp(-0.7)
    expect = (-0.5 * ((act.action - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    assert torch.allclose(act.log_prob, expect, atol=1e-5)
    log_prob, entropy, value = policy.evaluate(obs, act)
    assert torch.allclose(log_prob, act.log_prob) and torch.allclose(value, act.value)
    assert torch.allclose(entropy, torch.full((4,), 3 * (0.5 + 0.5 * math.log(2 * math.pi) - 0.7)), atol=1e-5)
    assert torch.equal(policy.act(obs, deterministic=True).action, mean)


def test_running_normalizer_matches_batch_statistics():
    norm = RunningNormalizer(3)
    data = [torch.randn(50, 3) * torch.tensor([1.0, 5.0, 0.1]) + 2.0 for _ in range(4)]
    for chunk in data:
        norm.update(chunk)
    full = torch.cat(data)
    assert torch.allclose(norm.mean, full.mean(0), atol=1e-4)
    assert torch.allclose(norm.var, full.var(0, unbiased=False), rtol=1e-3)
    z = norm(full)
    assert torch.allclose(z.mean(0), torch.zeros(3), atol=1e-3) and torch.allclose(z.std(0), torch.ones(3), atol=0.02)


def test_rgb_policy_trains_one_update():
    env = sim.make("mujoco/Push", 2, obs_mode="rgb", render_size=(48, 48))
    spaces = env.observation_space.spaces
    policy = GaussianActorCritic(spaces["state"].shape[0], env.action_dim, [32], image_shape=(48, 48), image_features=32)
    algo = PPO(policy, PPOConfig(epochs=1, minibatches=2))
    buf = RolloutBuffer(4, 2, torch.device("cpu"))
    obs = env.reset()
    before = [p.clone() for p in policy.encoder.parameters()]
    with torch.no_grad():
        for _ in range(4):
            act = policy.act(obs)
            nxt, r, te, tr, _ = env.step(act.action)
            buf.add(obs, act, r, te | tr)
            obs = nxt
        buf.finish(policy.value(obs), 0.9, 0.9)
    assert buf.obs["rgb"].dtype == torch.uint8 and buf.obs["rgb"].shape == (4, 2, 48, 48, 3)
    stats = algo.update(buf)
    assert math.isfinite(stats["policy_loss"]) and math.isfinite(stats["value_loss"])
    assert stats["log_prob"] == float(buf.log_probs.mean())  # the rollout's own actions, before the update
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.encoder.parameters()))
    env.close()


def test_ppo_clip_high_widens_only_the_upper_bound():
    torch.manual_seed(0)
    policy = GaussianActorCritic(5, 3, [16], normalize_obs=False)
    obs = {"state": torch.randn(7, 5)}
    act = policy.act(obs)
    ratio = torch.tensor([0.7, 0.79, 0.81, 1.0, 1.19, 1.25, 1.5])
    mb = {"obs": obs, "actions": act.action, "log_probs": act.log_prob - ratio.log(), "extras": {},
          "returns": act.value, "values": act.value}
    for adv, capped in ((torch.ones(7), lambda hi: -ratio.clamp(max=1 + hi)),  # a good action: capped above
                        (-torch.ones(7), lambda hi: ratio.clamp(min=0.8))):  # a bad one: floored at 1 − clip
        for clip_high, hi in ((None, 0.2), (0.28, 0.28)):
            algo = PPO(policy, PPOConfig(clip=0.2, clip_high=clip_high))
            _, terms = algo.loss(mb, adv, train_actor=True)
            assert torch.allclose(terms["policy_loss"], capped(hi).mean(), atol=1e-5)
            outside = ((ratio > 1 + hi) | (ratio < 0.8)).float().mean()
            assert torch.allclose(terms["clip_frac"], outside)


def test_the_asymmetric_surrogate_is_ppo_for_good_actions_and_pulls_bad_ones_back_to_the_bound():
    from roborl.algos.ppo import asymmetric_surrogate, clipped_surrogate

    ratio = torch.tensor([0.5, 0.9, 0.95, 1.0, 1.04, 1.2]).requires_grad_()
    good, bad = torch.full((6,), 2.0), torch.full((6,), -2.0)
    assert torch.equal(asymmetric_surrogate(ratio, good, 0.05, 0.05), clipped_surrogate(ratio, good, 0.05, 0.05))
    loss = asymmetric_surrogate(ratio, bad, 0.05, 0.05)
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    # minimizing lowers r toward 1 − ε and raises it back from below, where clipping alone stops pulling
    assert grad[0] < 0 and grad[1] < 0 and abs(grad[2]) < 1e-5 and grad[3] > 0 and grad[5] > 0
    (clip_grad,) = torch.autograd.grad(clipped_surrogate(ratio, bad, 0.05, 0.05).sum(), ratio)
    assert clip_grad[0] == 0 and clip_grad[1] == 0
    assert torch.allclose(loss[3], torch.tensor(2.0))  # on-policy both objectives are −A


def test_the_tanh_activation_is_tanh_in_value_gradient_and_export():
    from roborl.policies.activations import Tanh

    x = torch.linspace(-12, 12, 20001).requires_grad_()
    y = Tanh()(x)
    assert (y - torch.tanh(x)).abs().max() < 3e-7  # 2·sigmoid(2x) - 1, rounded in float32
    y.backward(torch.ones_like(y))
    ref = x.detach().clone().requires_grad_()
    torch.tanh(ref).sum().backward()
    assert torch.allclose(x.grad, ref.grad, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(Tanh()(x), y.detach())  # inference computes what training does
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(3, 4), Tanh()), torch.randn(2, 3))
    assert "aten::tanh" in str(traced.inlined_graph)  # exported policies hold the standard operator


def test_the_cnn_encodes_small_renders_and_refuses_tiny_ones_in_one_line():
    """36 px and up: Nature DQN's stack (its parameter names unchanged); 15-35 px: 3×3 kernels; below: a clear
    error that names the setting, through `roborl train`'s builder as for any config."""
    import pytest

    from roborl.builder import build
    from roborl.config import config_from_dict
    from roborl.errors import UserError
    from roborl.policies.cnn import CNNEncoder

    for size, first_kernel in ((64, 8), (36, 8), (32, 3), (15, 3)):
        encoder = CNNEncoder(size, size, 16)
        assert encoder.convs[0].kernel_size == (first_kernel, first_kernel)
        assert encoder(torch.zeros(2, size, size, 3, dtype=torch.uint8)).shape == (2, 16)
    cfg = config_from_dict({"env": {"id": "mujoco/Push", "obs_mode": "rgb", "render_size": [8, 8], "num_envs": 1}})
    with pytest.raises(UserError, match=r"^the CNN encoder needs images of at least 15×15 px, got 8×8: raise "
                                        r"env.render_size$"):
        build(cfg, torch.device("cpu"))
