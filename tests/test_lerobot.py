"""LeRobot's own policies as `policy.kind: lerobot`, small: a SmolVLA saved by LeRobot acts exactly as LeRobot's
`predict_action_chunk`; its flow-noise and flow-SDE log-probs are the chain formulas computed here from
LeRobot's `denoise_step`; PPO starts at ratio 1; a fine-tuned SmolVLA, ACT and Diffusion Policy save back
into directories that LeRobot alone loads with identical actions; an ACT directory is a residual's base."""
import os
from functools import partial

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from vla_checks import (  # noqa: E402
    check_ppo_starts_at_ratio_one,
    flow_noise_expected,
    flow_sde_expected,
    language_obs,
)

from roborl.policies.lerobot import compat, smolvla_flow  # noqa: E402

compat.require()

from lerobot.policies.factory import get_policy_class, make_pre_post_processors  # noqa: E402
from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks  # noqa: E402

from roborl.builder import make_env, make_policy, make_run_env  # noqa: E402
from roborl.config import config_from_dict  # noqa: E402
from roborl.errors import UserError  # noqa: E402
from roborl.policies.lerobot.configuration import LeRobotSpec  # noqa: E402
from roborl.policies.lerobot.policy import LeRobotPolicy, identity_stats  # noqa: E402
from roborl.policies.lerobot.small import small_config  # noqa: E402

STATE, A, H, EXECUTE, STEPS = 18, 4, 4, 2, 4  # LangTabletop's state and action dims
SIZES = dict(hidden=32, layers=2, heads=2, image_size=32, value_hidden=[16], noise_hidden=[16])
TABLETOP = {"id": "mujoco/LangTabletopFixed-ReachPushLift", "obs_mode": "rgb", "render_size": [32, 32]}
obs_batch = partial(language_obs, state=STATE, size=32)


def smolvla(rl_mode="flow_noise", **kw) -> LeRobotPolicy:
    torch.manual_seed(0)
    return LeRobotPolicy(LeRobotSpec(**{**SIZES, **kw}), STATE, A, H, EXECUTE, image_shape=(32, 32), steps=STEPS,
                         rl_mode=rl_mode, noise_min=0.05, noise_max=0.2, noise_level=0.7)


def lerobot_inputs(obs: dict, images: bool = True) -> dict:
    """The observation as LeRobot's own processors take it (its feature names, images C×H×W in [0, 1])."""
    raw = {"observation.state": obs["state"], "task": list(obs["instruction"])}
    if images:
        raw["observation.images.camera"] = obs["rgb"].permute(0, 3, 1, 2).float() / 255
    return raw


def lerobot_velocities(smol, batch: dict, xs: list[torch.Tensor], ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """SmolVLA's predicted noise − actions at each (x, t), each on a fresh prefix cache built as its
    `sample_actions` builds it."""
    model, out = smol.model, []
    for x, t in zip(xs, ts):
        images, masks = smol.prepare_images(batch)
        embeds, pad, att = model.embed_prefix(images, masks, batch["observation.language.tokens"],
                                              batch["observation.language.attention_mask"], state=smol.prepare_state(batch))
        _, cache = model.vlm_with_expert.forward(attention_mask=make_att_2d_masks(pad, att),
                                                 position_ids=pad.cumsum(1) - 1, past_key_values=None,
                                                 inputs_embeds=[embeds, None], use_cache=True, fill_kv_cache=True)
        out.append(model.denoise_step(pad, cache, x, t))
    return out


def save_with_lerobot(policy, config, directory) -> None:
    """A policy directory as LeRobot writes one: the model and both processors."""
    pre, post = make_pre_post_processors(config, dataset_stats=identity_stats(config))
    policy.save_pretrained(directory)
    pre.save_pretrained(directory)
    post.save_pretrained(directory)


def load_with_lerobot(directory):
    """LeRobot's own policy class and processors, from the directory alone."""
    from lerobot.configs.policies import PreTrainedConfig

    config = PreTrainedConfig.from_pretrained(str(directory))
    policy = get_policy_class(config.type).from_pretrained(str(directory)).eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(directory))
    return policy, pre, post


def test_a_smolvla_saved_by_lerobot_acts_exactly_as_its_predict_action_chunk(tmp_path):
    torch.manual_seed(0)
    config = small_config(LeRobotSpec(**SIZES, type="smolvla"), STATE, A, (32, 32), H, EXECUTE, STEPS)
    save_with_lerobot(get_policy_class("smolvla")(config), config, tmp_path / "smolvla")
    settings = {"kind": "lerobot", "horizon": H, "steps": STEPS, "lerobot": {"path": str(tmp_path / "smolvla")}}
    cfg = config_from_dict({"env": TABLETOP, "policy": settings})
    env = make_env(cfg.env, 2, 0, torch.device("cpu"))
    try:
        policy = make_policy(cfg.policy, env, EXECUTE)
        with pytest.raises(UserError, match="predicts chunks of 4 actions: set policy.horizon to 4"):
            make_policy(config_from_dict({"env": TABLETOP, "policy": {**settings, "horizon": 8}}).policy, env, EXECUTE)
    finally:
        env.close()
    obs = obs_batch()
    smol, pre, post = load_with_lerobot(tmp_path / "smolvla")
    with torch.no_grad():
        ours = policy.act(obs, deterministic=True).action
        theirs = post(smol.predict_action_chunk(pre(lerobot_inputs(obs)), noise=torch.zeros(4, H, config.max_action_dim)))
    assert ours.shape == (4, H, A)
    assert torch.equal(ours, theirs.clamp(-1, 1))


def test_flow_noise_log_prob_is_the_gaussian_chain_of_smolvla_euler_steps():
    policy = smolvla("flow_noise")
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, entropy, _ = policy.evaluate(obs, act)
        chain = act.extras["chain"]
        batch = policy.lerobot_batch(obs)
        ts = [torch.full((4,), 1 - k / STEPS) for k in range(STEPS)]  # SmolVLA's time: 1 (noise) down to 0
        predicted = lerobot_velocities(policy.lerobot, batch, [chain[:, k] for k in range(STEPS)], ts)
        expected = flow_noise_expected(policy, chain, predicted, smolvla_flow.prefix(policy.lerobot, batch), EXECUTE, A)
    assert torch.allclose(log_prob, expected, atol=1e-4)
    assert torch.allclose(act.log_prob, log_prob, atol=1e-5)
    assert entropy.shape == (4,) and torch.isfinite(entropy).all()


def test_flow_sde_log_prob_is_one_sde_step_of_smolvla():
    policy = smolvla("flow_sde")
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, _, _ = policy.evaluate(obs, act)
        t = 1 - act.extras["index"].float() / STEPS  # πRL's t = 1 − τ
        predicted = lerobot_velocities(policy.lerobot, policy.lerobot_batch(obs), [act.extras["x_pre"]], [t])[0]
        expected = flow_sde_expected(act.extras, predicted, t, STEPS, 0.7, EXECUTE, A)
    assert torch.allclose(log_prob, expected, atol=1e-4)


def test_ppo_on_a_rollout_buffer_starts_at_ratio_one():
    check_ppo_starts_at_ratio_one(smolvla("flow_noise"), obs_batch)


def test_rl_moves_the_expert_and_leaves_the_frozen_vlm_bit_identical():
    policy = smolvla("flow_noise")
    vlm = {n: p.clone() for n, p in policy.lerobot.model.vlm_with_expert.vlm.named_parameters()}
    expert = {n: p.clone() for n, p in policy.lerobot.model.vlm_with_expert.lm_expert.named_parameters()}
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs = obs_batch()
    act = policy.act(obs)
    loss = -policy.evaluate(obs, act)[0].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    now = dict(policy.lerobot.model.vlm_with_expert.vlm.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in vlm.items())
    moved = dict(policy.lerobot.model.vlm_with_expert.lm_expert.named_parameters())
    assert any(not torch.equal(moved[n], p) for n, p in expert.items())


def test_a_fine_tuned_smolvla_saves_a_directory_lerobot_loads_with_identical_actions(tmp_path):
    policy = smolvla("flow_noise")
    policy.fit_normalizer(torch.randn(50, STATE) * 2 + 1)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs = obs_batch()
    for _ in range(2):
        act = policy.act(obs)
        loss = -policy.evaluate(obs, act)[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.save_pretrained(tmp_path / "tuned")
    smol, pre, post = load_with_lerobot(tmp_path / "tuned")
    with torch.no_grad():
        ours = policy.act(obs, deterministic=True).action
        theirs = post(smol.predict_action_chunk(pre(lerobot_inputs(obs)),
                                                noise=torch.zeros(4, H, policy.config.max_action_dim)))
        again = LeRobotPolicy.from_pretrained(tmp_path / "tuned")
        reloaded = again.act(obs, deterministic=True)
    assert torch.equal(ours, theirs.clamp(-1, 1))
    assert torch.equal(ours, reloaded.action)
    assert torch.allclose(policy.act(obs).value, reloaded.value)


@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_act_and_diffusion_policy_clone_save_and_load_back_in_lerobot(tmp_path, kind):
    torch.manual_seed(0)
    policy = LeRobotPolicy(LeRobotSpec(**SIZES, type=kind), STATE, A, H, EXECUTE, image_shape=(32, 32), steps=STEPS)
    obs = obs_batch()
    policy.fit_normalizer(torch.randn(50, STATE) * 2 + 1)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    target = torch.rand(4, H, A) * 2 - 1
    losses = []
    for _ in range(30):  # LeRobot's own loss (L1 on chunks; denoising at random timesteps) on one fixed batch
        loss = policy.bc_loss(obs, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5])
    policy.save_pretrained(tmp_path / kind)
    theirs_policy, pre, post = load_with_lerobot(tmp_path / kind)
    with torch.no_grad():
        policy.eval()
        torch.manual_seed(1)
        ours = policy.act(obs, deterministic=True).action
        torch.manual_seed(1)
        theirs = post(theirs_policy.select_action(pre(lerobot_inputs(obs))))  # LeRobot's own control loop
    assert torch.equal(ours[:, 0], theirs.clamp(-1, 1))
    hint = "deterministic: fine-tune it as the base of a residual" if kind == "act" else "available: dppo"
    with pytest.raises(ValueError, match=hint):
        LeRobotPolicy(LeRobotSpec(path=str(tmp_path / kind)), STATE, A, H, EXECUTE, image_shape=(32, 32),
                      rl_mode="flow_noise")


def test_an_act_directory_is_the_frozen_base_of_a_residual_policy(tmp_path):
    torch.manual_seed(0)
    state = 34  # Push's state
    config = small_config(LeRobotSpec(**SIZES, type="act"), state, A, None, H, EXECUTE, STEPS)
    act = get_policy_class("act")(config)
    save_with_lerobot(act, config, tmp_path / "act")
    cfg = config_from_dict({"env": {"id": "mujoco/Push"}, "policy": {"kind": "residual"},
                            "residual": {"base": str(tmp_path / "act")}})
    env = make_run_env(cfg, 3, 0, torch.device("cpu"))
    try:
        obs = env.reset(seed=0)
        _, pre, post = load_with_lerobot(tmp_path / "act")
        raw = {"observation.state": obs["state"], "observation.environment_state": obs["state"]}
        with torch.no_grad():
            chunk = post(act.eval().predict_action_chunk(pre(raw))).clamp(-1, 1)
        assert torch.equal(obs["base_action"], chunk[:, 0])
        nxt = env.step(torch.zeros(3, A))[0]
        assert torch.equal(nxt["base_action"], chunk[:, 1])  # the base's chunk runs open loop for n_action_steps
    finally:
        env.close()
    bad = config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-ReachPushLift"}, "policy": {"kind": "residual"},
                            "residual": {"base": str(tmp_path / "act")}})
    with pytest.raises(UserError, match="reads 34-dim states; this env's have 37"):
        make_run_env(bad, 1, 0, torch.device("cpu"))


def test_bad_lerobot_settings_are_one_line_errors(tmp_path):
    env = make_env(config_from_dict({"env": TABLETOP}).env, 1, 0, torch.device("cpu"))
    try:
        missing = config_from_dict({"env": TABLETOP, "policy": {"kind": "lerobot", "lerobot": {"path": str(tmp_path)}}})
        with pytest.raises(UserError, match="not a local LeRobot policy directory"):
            make_policy(missing.policy, env)
        torch.manual_seed(0)
        config = small_config(LeRobotSpec(**SIZES, type="smolvla"), STATE, A, (32, 32), H, EXECUTE, STEPS)
        config.vlm_model_name = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"  # as lerobot/smolvla_base names it
        (tmp_path / "hub").mkdir()
        config._save_pretrained(tmp_path / "hub")
        hub = config_from_dict({"env": TABLETOP, "policy": {"kind": "lerobot", "horizon": H,
                                                            "lerobot": {"path": str(tmp_path / "hub")}}})
        with pytest.raises(UserError, match="set policy.lerobot.vlm_path to a copy of it"):
            make_policy(hub.policy, env)
    finally:
        env.close()


def test_dppo_on_diffusion_policy_scores_its_own_unet_denoising_steps(tmp_path):
    """DPPO on LeRobot's Diffusion Policy: the last denoising steps' log-probs are the Gaussian DDIM steps of its
    own U-Net over its own noise schedule (diffusers' scheduler built from LeRobot's config), PPO starts at ratio
    1, and the saved directory samples that DDIM chain in LeRobot."""
    from diffusers import DDIMScheduler
    from vla_checks import executed_gaussian

    torch.manual_seed(0)
    policy = LeRobotPolicy(LeRobotSpec(**SIZES, type="diffusion"), STATE, A, H, EXECUTE, steps=STEPS, rl_mode="dppo",
                           dppo={"finetune_steps": 2, "min_sampling_std": 0.1, "min_logprob_std": 0.1})
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, _, _ = policy.evaluate(obs, act)
        model = policy.lerobot.diffusion
        batch = policy.lerobot_batch(obs)
        cond = model._prepare_global_conditioning({k: v[:, None] if k.startswith("observation.") else v
                                                   for k, v in batch.items() if torch.is_tensor(v)})
        ddim = DDIMScheduler.from_config(model.noise_scheduler.config)
        ddim.set_timesteps(STEPS)
        chain, columns = act.extras["chain"], []
        for j, k in enumerate(range(STEPS - 2, STEPS)):
            t = int(ddim.timesteps[k])
            eps = model.unet(chain[:, j], torch.full((4,), t, dtype=torch.long), global_cond=cond)
            mean = ddim.step(eps, t, chain[:, j], eta=1.0, variance_noise=torch.zeros_like(eps)).prev_sample
            std = max(1.0 * float(ddim._get_variance(t, t - 100 // STEPS)) ** 0.5, 0.1)
            columns.append(executed_gaussian(chain[:, j + 1], mean, torch.full_like(mean, std), EXECUTE, A))
    assert log_prob.shape == (4, 2) and torch.allclose(log_prob, torch.stack(columns, -1), atol=1e-4)
    check_ppo_starts_at_ratio_one(policy, obs_batch)
    policy.save_pretrained(tmp_path / "dppo")
    theirs, _, _ = load_with_lerobot(tmp_path / "dppo")
    assert theirs.config.noise_scheduler_type == "DDIM" and theirs.config.num_inference_steps == STEPS
