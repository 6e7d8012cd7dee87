"""Diffusion and flow policies: each RL mode's log-prob against its closed form on a hand-built chain,
PPO's ratio at 1 before the first update, FPO's ratio, reproducible deterministic sampling, diffusers."""
import math

import diffusers
import pytest
import torch

from roborl.algos.ppo import PPO
from roborl.buffer import RolloutBuffer
from roborl.config import PPOConfig
from roborl.policies import Act, DiffusionPolicy, FlowPolicy
from roborl.policies.flow_rl import noise_std

OBS, A, H, K = 6, 3, 4, 2  # obs dim, action dim, predicted horizon, executed actions


def normal_log_density(x, mean, std):
    std = torch.as_tensor(std, dtype=x.dtype).expand_as(x)
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)


def diffusion(**kw) -> DiffusionPolicy:
    torch.manual_seed(0)
    args = dict(hidden=[32, 32], critic_hidden=[16], train_timesteps=20, steps=5, eta=1.0, rl_mode="dppo", finetune_steps=3,
                min_sampling_std=0.1, min_logprob_std=0.15)
    args.update(kw)
    return DiffusionPolicy(OBS, A, H, K, **args)


def flow(mode, steps=4, **kw) -> FlowPolicy:
    torch.manual_seed(0)
    return FlowPolicy(OBS, A, H, K, hidden=[32, 32], critic_hidden=[16], steps=steps, rl_mode=mode, **kw)


def obs_batch(n=5):
    return {"state": torch.randn(n, OBS)}


def rollout(policy, T, N, random_rewards=True) -> RolloutBuffer:
    """A T×N buffer of the policy's own actions on random observations, advantages computed."""
    buf = RolloutBuffer(T, N, torch.device("cpu"))
    with torch.no_grad():
        for _ in range(T):
            obs = obs_batch(N)
            act = policy.act(obs)
            assert act.action.shape == (N, H, A) and act.action.abs().max() <= 1
            reward = torch.randn(N) if random_rewards else torch.zeros(N)
            buf.add(obs, act, reward, torch.zeros(N, dtype=torch.bool))
        buf.finish(torch.zeros(N), 0.9, 0.9)
    return buf


def test_dppo_log_prob_is_the_sum_of_ddim_gaussian_steps():
    policy = diffusion()
    obs = obs_batch()
    cond = policy.cond(obs)
    chain = torch.randn(5, 4, H, A)  # x at the 3 fine-tuned steps and the final sample
    got = policy.chain_log_prob(cond, chain)
    # DDIM by hand from the DDPM cumulative alphas (squaredcos_cap_v2, 20 train steps, 5 sampling steps)
    alphas = policy.train_scheduler.alphas_cumprod.double()
    timesteps = [16, 12, 8, 4, 0]
    assert policy.scheduler.timesteps.tolist() == timesteps
    expect = []
    for j, t in enumerate(timesteps[2:]):
        x = chain[:, j].double()
        eps = policy.denoiser(chain[:, j], torch.full((5,), float(t)), cond).double()
        a_t = alphas[t]
        a_prev = alphas[t - 4] if t >= 4 else torch.tensor(1.0, dtype=torch.float64)
        x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-1, 1)
        sigma = ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)).sqrt()
        mean = a_prev.sqrt() * x0 + (1 - a_prev - sigma**2).sqrt() * eps  # DDIM, η = 1
        std = max(float(sigma), 0.1, 0.15)
        expect.append(normal_log_density(chain[:, j + 1, :K].double(), mean[:, :K], std).sum((-1, -2)))
    assert torch.allclose(got.double(), torch.stack(expect, -1), atol=1e-4)


def test_dppo_clip_schedule_and_denoising_discount():
    policy = diffusion(finetune_steps=3, denoise_discount=0.9, clip_base=0.001)
    clip = policy.ratio_clip(0.01)
    assert torch.allclose(clip[[0, -1]], torch.tensor([0.001, 0.01])) and bool((clip.diff() > 0).all())
    assert torch.allclose(policy.advantage_weights(), torch.tensor([0.81, 0.9, 1.0]))


def test_flow_noise_log_prob_is_the_chain_of_gaussian_euler_steps():
    policy = flow("flow_noise", noise_min=0.05, noise_max=0.2)
    obs = obs_batch()
    cond = policy.cond(obs)
    chain = torch.randn(5, 5, H, A)
    log_prob, entropy, _ = policy.evaluate(obs, Act(chain[:, -1], torch.zeros(5), extras={"chain": chain}))
    expect = torch.zeros(5)
    for k in range(4):
        tau = torch.full((5,), k / 4)
        mean = chain[:, k] + 0.25 * policy.denoiser(chain[:, k], tau * 1000, cond)
        std = noise_std(policy, chain[:, k], tau, cond)
        assert torch.allclose(std, torch.full_like(std, 0.125))  # zero-initialized head: the middle of the range
        expect += normal_log_density(chain[:, k + 1, :K], mean[:, :K], std[:, :K]).sum((-1, -2))
    assert torch.allclose(log_prob, expect, atol=1e-4)
    per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(0.125)
    assert torch.allclose(entropy, torch.full((5,), 4 * K * A * per_dim), atol=1e-4)


def test_flow_sde_log_prob_is_one_sde_step():
    policy = flow("flow_sde", noise_level=0.7)
    obs = obs_batch(4)
    cond = policy.cond(obs)
    index = torch.tensor([0, 1, 2, 3])
    x_pre, x_post = torch.randn(4, H, A), torch.randn(4, H, A)
    extras = {"x_pre": x_pre, "x_post": x_post, "index": index}
    log_prob, _, _ = policy.evaluate(obs, Act(x_post, torch.zeros(4), extras=extras))
    delta = 0.25
    for i in range(4):
        tau = index[i].item() / 4
        t = 1 - tau
        v = policy.denoiser(x_pre[i:i + 1], torch.tensor([tau * 1000]), cond[i:i + 1])[0]
        sigma = 0.7 * math.sqrt(t / (1 - t if t < 1 else delta))
        x0_hat, x1_hat = x_pre[i] + t * v, x_pre[i] - (1 - t) * v  # πRL: x̂0 = x − t·v_π, x̂1 = x + (1 − t)·v_π, v_π = −v
        mean = x0_hat * (1 - (t - delta)) + x1_hat * (t - delta - sigma**2 * delta / (2 * t))
        expect = normal_log_density(x_post[i, :K], mean[:K], sigma * math.sqrt(delta)).sum()
        assert torch.allclose(log_prob[i], expect, atol=1e-4)


def test_flow_sde_mean_without_noise_is_the_euler_step():
    from roborl.policies.flow_rl import sde_step

    policy = flow("flow_sde", noise_level=0.0)
    x, cond = torch.randn(3, H, A), policy.cond(obs_batch(3))
    for tau in (0.0, 0.25, 0.5, 0.75):
        ode, mean, _ = sde_step(policy, x, torch.full((3,), tau), cond)
        assert torch.allclose(mean, ode, atol=1e-5)


def test_fpo_log_prob_is_minus_the_flow_matching_loss_and_ratio_is_exp_of_loss_difference():
    policy = flow("fpo", fpo_samples=3)
    obs = obs_batch(4)
    act = policy.act(obs)
    a, tau, eps = act.extras["sample"], act.extras["tau"], act.extras["eps"]
    assert act.log_prob.shape == (4, 3)

    def loss(net_policy):
        cond = net_policy.cond(obs)
        out = torch.zeros(4, 3)
        for m in range(3):
            t = tau[:, m][:, None, None]
            x = t * a + (1 - t) * eps[:, m]
            v = net_policy.denoiser(x, tau[:, m] * 1000, cond)
            out[:, m] = (v - (a - eps[:, m]))[:, :K].square().mean((-1, -2))
        return out

    l_old = loss(policy)
    assert torch.allclose(act.log_prob, -l_old, atol=1e-5)
    with torch.no_grad():
        for p in policy.denoiser.parameters():
            p.add_(0.05 * torch.randn_like(p))
    new_log_prob, _, _ = policy.evaluate(obs, act)
    assert torch.allclose((new_log_prob - act.log_prob).exp(), (l_old - loss(policy)).exp(), atol=1e-4)
    assert not torch.allclose(new_log_prob, act.log_prob)


POLICIES = {"dppo": lambda: diffusion(), "flow_noise": lambda: flow("flow_noise"),
            "flow_sde": lambda: flow("flow_sde"), "fpo": lambda: flow("fpo")}


@pytest.mark.parametrize("mode", list(POLICIES))
def test_ppo_ratio_is_exactly_one_before_the_first_update(mode):
    policy = POLICIES[mode]()
    T, N = 3, 8
    buf = rollout(policy, T, N)
    data = buf.flat()
    idx = torch.randperm(T * N)[:10]
    act = Act(data["actions"][idx], data["log_probs"][idx], extras={k: v[idx] for k, v in data["extras"].items()})
    log_prob, _, value = policy.evaluate({k: v[idx] for k, v in data["obs"].items()}, act)
    assert torch.allclose((log_prob - data["log_probs"][idx]).exp(), torch.ones_like(log_prob), atol=1e-5)
    assert torch.allclose(value, data["values"][idx], atol=1e-6)
    stats = PPO(policy, PPOConfig(epochs=1, minibatches=2, clip=0.01)).update(buf)
    assert math.isfinite(stats["policy_loss"]) and stats["approx_kl"] < 0.05


@pytest.mark.parametrize("mode", list(POLICIES))
def test_log_prob_ignores_actions_that_are_not_executed(mode):
    policy = POLICIES[mode]()
    obs = obs_batch(4)
    act = policy.act(obs)
    extras = {k: v.clone() for k, v in act.extras.items()}
    for key in ("chain", "x_post"):
        if key in extras:
            extras[key][..., K:, :] += 1.0  # move only the actions the env never executes
    if "sample" in extras:
        extras["sample"][:, K:] += 1.0
        extras["eps"][:, :, K:] += 1.0
    if "chain" in extras and mode == "dppo":
        extras["chain"] = act.extras["chain"].clone()
        extras["chain"][:, -1, K:] += 1.0
    log_prob, _, _ = policy.evaluate(obs, Act(act.action, act.log_prob, extras=extras))
    if mode in ("dppo", "flow_sde"):
        assert torch.allclose(log_prob, act.log_prob, atol=1e-5)
    log_prob.sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in policy.parameters())


@pytest.mark.parametrize("mode", list(POLICIES))
def test_deterministic_sampling_is_reproducible(mode):
    policy = POLICIES[mode]()
    obs = obs_batch(6)
    torch.manual_seed(1)
    first = policy.act(obs, deterministic=True).action
    torch.manual_seed(2)
    torch.randn(100)
    second = policy.act(obs, deterministic=True).action
    assert torch.equal(first, second)
    assert not torch.equal(policy.act(obs).action, policy.act(obs).action)  # rollouts stay stochastic


def test_diffusers_schedulers_do_the_work(monkeypatch):
    policy = diffusion()
    assert isinstance(policy.train_scheduler, diffusers.DDPMScheduler)
    assert isinstance(policy.scheduler, diffusers.DDIMScheduler)
    calls = {"step": 0, "add_noise": 0}
    step, add_noise = policy.scheduler.step, policy.train_scheduler.add_noise

    def counted_step(*a, **kw):
        calls["step"] += 1
        return step(*a, **kw)

    def counted_add_noise(*a, **kw):
        calls["add_noise"] += 1
        return add_noise(*a, **kw)

    monkeypatch.setattr(policy.scheduler, "step", counted_step)
    monkeypatch.setattr(policy.train_scheduler, "add_noise", counted_add_noise)
    policy.act(obs_batch(), deterministic=True)
    assert calls["step"] == 5 + 3  # the 5 sampling steps, then the 3 fine-tuned steps' log-probs
    policy.bc_loss(obs_batch(), torch.rand(5, H, A) * 2 - 1)
    assert calls["add_noise"] == 1


def test_bc_sampling_runs_the_trained_network_at_every_step_and_fine_tuning_freezes_the_early_ones():
    bc = diffusion(rl_mode=None)
    obs = obs_batch()
    with torch.no_grad():
        for p in bc.denoiser.parameters():
            p.add_(0.1)  # "training" moves the network away from the reference copy
    before = bc.act(obs, deterministic=True).action
    with torch.no_grad():
        for p in bc.reference.parameters():
            p.mul_(-3)
    assert torch.equal(bc.act(obs, deterministic=True).action, before)  # BC never runs the reference
    rl = diffusion()
    rl.load_state_dict(bc.state_dict())
    rl.start_finetuning()
    assert torch.allclose(rl.act(obs, deterministic=True).action, before, atol=1e-6)  # same sampler after loading
    with torch.no_grad():
        for p in rl.denoiser.parameters():
            p.mul_(0.5)
    moved = rl.act(obs, deterministic=True).action
    assert not torch.allclose(moved, before)


@pytest.mark.parametrize("denoiser", ["mlp", "unet"])
def test_bc_loss_decreases_on_a_fixed_mapping(denoiser):
    torch.manual_seed(0)
    hidden = [32, 32] if denoiser == "mlp" else [16, 32]
    for cls in (DiffusionPolicy, FlowPolicy):
        policy = cls(OBS, A, H, K, denoiser=denoiser, hidden=hidden, critic_hidden=[8])
        obs = torch.randn(256, OBS)
        actions = torch.tanh(obs[:, :A])[:, None].expand(-1, H, -1).contiguous()
        policy.fit_normalizer(obs)
        opt = torch.optim.Adam(policy.denoiser.parameters(), lr=3e-3)
        losses = []
        for _ in range(300):
            loss = policy.bc_loss({"state": obs}, actions)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20, (cls.__name__, losses[0], losses[-1])


def test_bc_regularizer_pulls_the_fine_tuned_network_back_to_the_pretrained_one():
    policy = flow("flow_noise")
    policy.start_finetuning()
    with torch.no_grad():
        for p in policy.denoiser.parameters():
            p.add_(0.05 * torch.randn_like(p))
    T, N = 4, 16
    buf = rollout(policy, T, N, random_rewards=False)
    ppo = PPO(policy, PPOConfig(lr=1e-3, epochs=4, minibatches=2, bc_coef=10.0, target_kl=None))
    first = ppo.update(buf)["bc_loss"]
    for _ in range(4):
        last = ppo.update(buf)["bc_loss"]
    assert last < 0.5 * first, (first, last)
    assert all(not p.requires_grad for p in policy.reference.parameters())


def test_ppo_reports_how_many_minibatch_steps_ran_before_target_kl_stopped_it():
    policy = flow("flow_noise")
    buf = rollout(policy, 4, 16)
    assert PPO(policy, PPOConfig(lr=1e-3, epochs=3, minibatches=2, target_kl=None)).update(buf)["minibatches"] == 6
    assert PPO(policy, PPOConfig(lr=1e-1, epochs=3, minibatches=2, target_kl=1e-9)).update(buf)["minibatches"] == 1


def test_critic_warmup_moves_only_the_critic_and_critic_lr_is_its_own():
    policy = diffusion()
    T, N = 3, 8
    buf = rollout(policy, T, N)
    ppo = PPO(policy, PPOConfig(lr=1e-5, critic_lr=1e-3, epochs=1, minibatches=1))
    assert [g["lr"] for g in ppo.optimizer.param_groups] == [1e-5, 1e-3]
    actor = [p.clone() for p in policy.denoiser.parameters()]
    critic = [p.clone() for p in policy.critic.parameters()]
    ppo.update(buf, train_actor=False)
    assert all(torch.equal(a, b) for a, b in zip(actor, policy.denoiser.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic, policy.critic.parameters()))
    ppo.set_lr(2e-5)
    assert [g["lr"] for g in ppo.optimizer.param_groups] == [2e-5, 1e-3]


@pytest.mark.parametrize("mode", ["flow_noise", "flow_sde", "fpo"])
def test_one_step_flow_policies_sample_and_evaluate(mode):
    policy = flow(mode, steps=1)
    obs = obs_batch(4)
    with torch.no_grad():
        x = policy.act(obs, deterministic=True).action
        v = policy.denoiser(torch.zeros(4, H, A), torch.zeros(4), policy.cond(obs))
    assert torch.allclose(x, v.clamp(-1, 1), atol=1e-6)  # one Euler step from zero noise
    act = policy.act(obs)
    log_prob, _, _ = policy.evaluate(obs, act)
    assert torch.allclose(log_prob, act.log_prob, atol=1e-5)
