"""pi0 on transformers' own PI0ForConditionalGeneration, tiny: a checkpoint saved by transformers loads as
`policy.kind: pi0` and acts exactly as `sample_actions`; the flow-noise and flow-SDE log-probs are the chain
formulas computed here from pi0's own forward; PPO starts at ratio 1; LoRA leaves the base weights untouched;
and a fine-tuned policy saves back into a directory that transformers alone loads with identical actions."""
import os
from functools import partial

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import peft  # noqa: E402, F401  scripts/setup.sh installs it: fail, not skip, without it
from transformers import PI0ForConditionalGeneration  # noqa: E402
from vla_checks import (  # noqa: E402
    check_ppo_starts_at_ratio_one,
    flow_noise_expected,
    flow_sde_expected,
    language_obs,
)

from roborl.builder import make_env, make_policy  # noqa: E402
from roborl.config import config_from_dict  # noqa: E402
from roborl.errors import UserError  # noqa: E402
from roborl.policies.configuration_pi0 import Pi0Spec  # noqa: E402
from roborl.policies.pi0 import Pi0Policy  # noqa: E402
from roborl.policies.vla.tokenizer import word_tokenizer  # noqa: E402

STATE, A, H, STEPS = 6, 3, 4, 4
SPEC = dict(image_size=32, patch_size=16, vision_hidden=32, vlm_hidden=32, expert_hidden=32, value_hidden=[16],
            noise_hidden=[16])
obs_batch = partial(language_obs, state=STATE, size=48)


def pi0(rl_mode="flow_noise", execute=2, **kw) -> Pi0Policy:
    torch.manual_seed(0)
    return Pi0Policy(Pi0Spec(**{**SPEC, **kw}), STATE, A, H, execute, steps=STEPS, rl_mode=rl_mode, noise_min=0.05,
                     noise_max=0.2, noise_level=0.7)


def transformers_inputs(policy: Pi0Policy, obs: dict) -> dict:
    """What transformers' own pi0 takes: [image tokens, BOS, instruction, newline], the frames, the state."""
    text = policy.encode_text(obs["instruction"], torch.device("cpu"))
    n = text.shape[0]
    ids = torch.cat([torch.full((n, policy.image_tokens), policy.image_token_id), text], 1)
    mask = torch.cat([torch.ones(n, policy.image_tokens, dtype=torch.long),
                      (text != policy.tokenizer.pad_token_id).long()], 1)
    state = torch.nn.functional.pad(policy.normalizer(obs["state"]), (0, policy.pi0.config.max_state_dim - STATE))
    return {"state": state, "input_ids": ids, "attention_mask": mask, "pixel_values": policy.images(obs["rgb"]),
            "pixel_attention_mask": torch.ones(n, 1, dtype=torch.bool)}


def pi0_velocities(model, inputs: dict, xs: list[torch.Tensor], ts: list[float]) -> list[torch.Tensor]:
    """pi0's predicted noise − actions at each (x, t), each on a fresh prefix cache built as sample_actions does."""
    out = []
    for x, t in zip(xs, ts):
        embeds = model.model.embed_prefix(inputs["input_ids"], inputs["pixel_values"], inputs["pixel_attention_mask"])
        mask = inputs["attention_mask"]
        cache = model.model.vlm(inputs_embeds=embeds, attention_mask=mask, position_ids=mask.cumsum(-1) - 1,
                                token_type_ids=torch.zeros_like(mask), use_cache=True).cache
        out.append(model(state=inputs["state"], noise=x, timestep=torch.full((x.shape[0],), t), cache=cache,
                         attention_mask=mask, pixel_attention_mask=inputs["pixel_attention_mask"]).logits)
    return out


def test_a_checkpoint_saved_by_transformers_acts_exactly_as_its_sample_actions(tmp_path):
    source = pi0(rl_mode=None)
    source.pi0.save_pretrained(tmp_path / "pi0")
    source.tokenizer.save_pretrained(tmp_path / "pi0")
    cfg = config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-ReachPushLift", "obs_mode": "rgb",
                                    "render_size": [32, 32]},
                            "policy": {"kind": "pi0", "horizon": H, "steps": STEPS,
                                       "pi0": {**SPEC, "path": str(tmp_path / "pi0")}}})
    env = make_env(cfg.env, 3, 0, torch.device("cpu"))
    with pytest.raises(UserError, match="chunks of 4 actions of up to 3 dims"):
        make_policy(cfg.policy, env)  # this env's actions have 4 dims
    env.close()
    policy = Pi0Policy(Pi0Spec(**{**SPEC, "path": str(tmp_path / "pi0")}), STATE, A, H, 2, steps=STEPS)
    obs = obs_batch()
    with torch.no_grad():
        ours = policy.act(obs, deterministic=True).action
        theirs = PI0ForConditionalGeneration.from_pretrained(tmp_path / "pi0").sample_actions(
            noise=torch.zeros(4, H, A), num_steps=STEPS, **transformers_inputs(policy, obs))
    assert ours.shape == (4, H, A)
    assert torch.equal(ours, theirs.clamp(-1, 1))
    missing = config_from_dict({"env": {"id": "mujoco/LangTabletopFixed-ReachPushLift", "obs_mode": "rgb"},
                                "policy": {"kind": "pi0", "pi0": {"path": str(tmp_path / "nothing")}}})
    env = make_env(missing.env, 1, 0, torch.device("cpu"))
    with pytest.raises(UserError, match="not a local pi0 checkpoint"):
        make_policy(missing.policy, env)
    env.close()


def test_flow_noise_log_prob_is_the_gaussian_chain_of_pi0_euler_steps():
    policy = pi0("flow_noise")
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, entropy, _ = policy.evaluate(obs, act)
        chain = act.extras["chain"]
        ts = [1 - k / STEPS for k in range(STEPS)]  # pi0's time at each step: 1 (noise) down to 0
        predicted = pi0_velocities(policy.pi0, transformers_inputs(policy, obs), [chain[:, k] for k in range(STEPS)], ts)
        expected = flow_noise_expected(policy, chain, predicted, policy.prefix(obs), 2, A)
    assert torch.allclose(log_prob, expected, atol=1e-4)
    assert torch.allclose(act.log_prob, log_prob, atol=1e-5)
    assert entropy.shape == (4,) and torch.isfinite(entropy).all()


def test_flow_sde_log_prob_is_one_sde_step_of_pi0():
    policy = pi0("flow_sde")
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, _, _ = policy.evaluate(obs, act)
        e = act.extras
        t = 1 - e["index"].float() / STEPS  # πRL's t = 1 − τ
        predicted = torch.stack([pi0_velocities(policy.pi0, transformers_inputs(policy, obs), [e["x_pre"]],
                                                [float(t[i])])[0][i] for i in range(4)])
        expected = flow_sde_expected(e, predicted, t, STEPS, 0.7, 2, A)
    assert torch.allclose(log_prob, expected, atol=1e-4)


def test_ppo_on_a_rollout_buffer_starts_at_ratio_one():
    check_ppo_starts_at_ratio_one(pi0("flow_noise"), obs_batch)


@pytest.mark.parametrize("finetune", ["frozen", "lora"])
def test_a_bfloat16_prefix_keeps_what_trains_in_float32_so_small_updates_land(finetune):
    """With `dtype: bfloat16` the prefix's frozen weights are bfloat16, while the expert, the adapters and the
    heads stay float32: one Adam step at RL's learning rate (1e-5) moves nearly all of the expert's weights,
    where bfloat16 weights would round most of such steps away. PPO still starts at ratio one."""
    policy = pi0("flow_noise", finetune=finetune, dtype="bfloat16")
    frozen = [p for p in policy.pi0.model.vlm.parameters() if not p.requires_grad]
    trained = [p for p in policy.parameters() if p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert trained and all(p.dtype == torch.float32 for p in trained)
    check_ppo_starts_at_ratio_one(policy, obs_batch)
    expert = {n: p.clone() for n, p in policy.pi0.model.dit.named_parameters() if "embed_tokens" not in n}  # unused
    opt = torch.optim.Adam(trained, lr=1e-5)
    obs = obs_batch()
    with torch.no_grad():  # as in a rollout
        act = policy.act(obs)
    log_prob, _, value = policy.evaluate(obs, act)
    opt.zero_grad()
    (-log_prob.mean() + value.square().mean()).backward()
    opt.step()
    now = dict(policy.pi0.model.dit.named_parameters())
    moved = sum(int((now[n] != p).sum()) for n, p in expert.items())
    assert moved > 0.9 * sum(p.numel() for p in expert.values())


@pytest.mark.parametrize("finetune", ["frozen", "lora", "full"])
def test_the_experts_token_embedding_gets_no_gradient_so_it_is_not_trained_nor_kept_in_float32(finetune):
    """pi0 feeds its action expert action embeddings, never tokens: the expert's token embedding (263M of pi0_base's
    parameters) gets no gradient from a PPO loss, so it must not count among, nor be stored like, what trains."""
    policy = pi0("flow_noise", finetune=finetune, dtype="bfloat16")
    embedding = policy.pi0.model.dit.get_input_embeddings().weight
    embedding.requires_grad_(True)  # to see whether a loss reaches it at all
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
    log_prob, _, value = policy.evaluate(obs, act)
    (-log_prob.mean() + value.square().mean()).backward()
    assert embedding.grad is None
    fresh = pi0("flow_noise", finetune=finetune, dtype="bfloat16").pi0.model.dit.get_input_embeddings().weight
    assert not fresh.requires_grad and fresh.dtype == torch.bfloat16


def test_lora_moves_adapters_and_expert_and_leaves_the_prefix_weights_bit_identical():
    policy = pi0("flow_noise", finetune="lora")
    named = dict(policy.named_parameters())
    lora = {n: p.clone() for n, p in named.items() if "lora_" in n}
    prefix = {n: p.clone() for n, p in policy.pi0.model.vlm.named_parameters() if "lora_" not in n}
    expert = {n: p.clone() for n, p in policy.pi0.model.dit.named_parameters()}
    assert lora and all(".vlm.language_model." in n for n in lora)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs = obs_batch()
    for _ in range(2):  # LoRA B starts at zero: A moves only from the second step on
        act = policy.act(obs)
        log_prob, _, value = policy.evaluate(obs, act)
        loss = -log_prob.mean() + value.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.equal(dict(policy.pi0.model.vlm.named_parameters())[n], p) for n, p in prefix.items())
    assert all(not torch.equal(dict(policy.named_parameters())[n], p) for n, p in lora.items())
    assert any(not torch.equal(dict(policy.pi0.model.dit.named_parameters())[n], p) for n, p in expert.items())


@pytest.mark.parametrize("finetune", ["frozen", "lora"])
def test_a_fine_tuned_policy_saves_a_directory_transformers_loads_with_identical_actions(tmp_path, finetune):
    policy = pi0("flow_noise", finetune=finetune)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs = obs_batch()
    policy.fit_normalizer(torch.randn(50, STATE) * 2 + 1)
    for _ in range(2):
        act = policy.act(obs)
        loss = -policy.evaluate(obs, act)[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.save_pretrained(tmp_path / "tuned")
    with torch.no_grad():
        ours = policy.act(obs, deterministic=True).action
        model = PI0ForConditionalGeneration.from_pretrained(tmp_path / "tuned")
        theirs = model.sample_actions(noise=torch.zeros(4, H, A), num_steps=STEPS, **transformers_inputs(policy, obs))
        again = Pi0Policy.from_pretrained(tmp_path / "tuned")
        assert torch.allclose(ours, theirs.clamp(-1, 1), atol=1e-5)
        assert torch.allclose(again.act(obs, deterministic=True).action, ours, atol=1e-5)
        assert torch.allclose(again.value(obs), policy.value(obs), atol=1e-5)


def test_the_tiny_tokenizer_gives_pi0s_prompt_layout():
    policy = pi0(rl_mode=None)
    ids = policy.encode_text(["lift the blue cube"], torch.device("cpu"))[0].tolist()
    tok = word_tokenizer(0)
    words = tok("lift the blue cube\n", add_special_tokens=False).input_ids
    assert ids[:1 + len(words)] == [tok.bos_token_id, *words]
    assert set(ids[1 + len(words):]) == {tok.pad_token_id} and len(ids) == policy.spec.max_text_tokens
    with pytest.raises(ValueError, match="does not apply to pi0; available: flow_noise, flow_sde"):
        pi0(rl_mode="fpo")


def test_weights_without_adapters_load_into_a_lora_policy():
    """An SFT run trains pi0 whole; RL with LoRA starts from it (`policy.init`): same actions before any update."""
    plain = pi0("flow_noise", finetune="full")
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.01 * torch.randn_like(p))
    lora = pi0("flow_noise", finetune="lora")
    lora.load_state_dict(plain.state_dict())
    obs = obs_batch()
    with torch.no_grad():
        assert torch.allclose(lora.act(obs, deterministic=True).action, plain.act(obs, deterministic=True).action,
                              atol=1e-6)
