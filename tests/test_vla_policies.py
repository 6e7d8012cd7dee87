"""VLA policies on tiny transformers backbones: token log-probs against a softmax over the LM's own logits,
the flow VLA's log-probs against the Gaussian chain formula, save -> from_pretrained round trips, the
fine-tuning modes (LoRA, frozen, detached value), the offline tokenizer, builder errors and BC overfitting."""
import math
import os
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import peft  # noqa: E402, F401  scripts/setup.sh installs it: fail, not skip, without it
import transformers  # noqa: E402, F401  scripts/setup.sh installs it: fail, not skip, without it
from vla_checks import check_ppo_starts_at_ratio_one, language_obs  # noqa: E402

from roborl.algos.ppo import PPO  # noqa: E402
from roborl.config import PPOConfig, config_from_dict  # noqa: E402
from roborl.errors import UserError  # noqa: E402
from roborl.policies import Act  # noqa: E402
from roborl.policies.flow_rl import noise_std  # noqa: E402
from roborl.policies.vla.flow_vla import FlowVLAPolicy  # noqa: E402
from roborl.policies.vla.spec import VLASpec  # noqa: E402
from roborl.policies.vla.token_vla import TokenVLAPolicy  # noqa: E402
from roborl.policies.vla.tokenizer import char_tokenizer, load_tokenizer, word_tokenizer  # noqa: E402

STATE, A = 5, 3
INSTRUCTIONS = ["pick up the red cube", "push the block", "open the drawer", "stack it!"]
obs_batch = partial(language_obs, state=STATE, size=64, instructions=INSTRUCTIONS)


def spec(**kw) -> VLASpec:
    args = dict(image_size=32, patch_size=16, vision_hidden=32, vision_heads=2, hidden=32, heads=2, layers=2,
                max_text_tokens=24, value_hidden=[16], expert_hidden=[64, 64], bins=32)
    args.update(kw)
    return VLASpec(**args)


def token_vla(horizon=1, execute=1, **kw) -> TokenVLAPolicy:
    torch.manual_seed(0)
    return TokenVLAPolicy(spec(**kw), STATE, A, horizon, execute)


def flow_vla(rl_mode="flow_noise", horizon=2, execute=1, **kw) -> FlowVLAPolicy:
    torch.manual_seed(0)
    return FlowVLAPolicy(spec(**kw), STATE, A, horizon, execute, steps=4, rl_mode=rl_mode, noise_min=0.05,
                         noise_max=0.2, noise_level=0.7)


def normal_log_density(x, mean, std):
    std = torch.as_tensor(std, dtype=x.dtype).expand_as(x)
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)


def backbone_params(policy):
    bb = policy.backbone
    return [p for m in (bb.vision, bb.lm) for p in m.parameters()]


# ---- tokenizer ------------------------------------------------------------------------------------
def test_tokenizer_round_trips_an_instruction_offline(tmp_path):
    tok = char_tokenizer(256)
    text = "Pick up the red cube, then place it on the plate (twice)!"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) == len(text)
    assert tok.convert_ids_to_tokens([len(tok) - 256, len(tok) - 1]) == ["<a0>", "<a255>"]
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again(text)["input_ids"] == ids and again.decode(ids) == text


def test_word_tokenizer_gives_instruction_words_one_token_and_spells_out_the_rest(tmp_path):
    from roborl.tasks.language import TASK_NAMES, all_instructions

    tok = word_tokenizer(21)
    assert tok.tokenize("Push the RED cube to the robot's left!") == [
        "push", "the", "red", "cube", "to", "the", "robot's", "left", "!"]
    left, right = tok.convert_tokens_to_ids(["left", "right"])
    assert left != right and tok.unk_token_id not in (left, right)
    spelled = tok("pick up the zebra mug")["input_ids"]
    assert tok.unk_token_id not in spelled and tok.decode(spelled) == "pick up the zebra mug"
    assert tok.convert_ids_to_tokens([len(tok) - 21, len(tok) - 1]) == ["<a0>", "<a20>"]
    for task in TASK_NAMES:  # every LangTabletop instruction: whole words, at most 16 tokens
        for text in all_instructions(task):
            tokens = tok.tokenize(text)
            assert len(tokens) <= 16 and not any(t.startswith("##") for t in tokens), text
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path)("go left")["input_ids"] == tok("go left")["input_ids"]


def test_the_spec_accepts_exactly_the_tokenizers_that_are_built():
    """`spec.TOKENIZERS` (checked without importing `tokenizers`) names the builders of tokenizer.TOKENIZERS."""
    from roborl.policies.vla import spec, tokenizer

    assert spec.TOKENIZERS == tuple(tokenizer.TOKENIZERS)
    for name in spec.TOKENIZERS:
        VLASpec(tokenizer=name).check()
    with pytest.raises(ValueError, match="tokenizer 'bpe' is unknown; available: char, word"):
        VLASpec(tokenizer="bpe").check()


# ---- token VLA ------------------------------------------------------------------------------------
def manual_token_logits(policy, obs, text_ids, bins):
    """The LM's full-vocabulary logits on [prefix, action tokens[:-1]], by the causal LM's own forward."""
    bb = policy.backbone
    embeds, mask = bb.prefix(obs, text_ids)
    s = mask.shape[1]
    ids = bins[:, :-1] + bb.vocab_size - policy.spec.bins
    seq = torch.cat([embeds, bb.lm.get_input_embeddings()(ids)], 1)
    full_mask = torch.cat([mask, torch.ones_like(ids)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    logits = bb.lm(inputs_embeds=seq, attention_mask=full_mask, position_ids=positions).logits
    return logits[:, s - 1:]


def test_token_log_prob_is_the_softmax_over_the_last_vocabulary_ids():
    policy = token_vla(horizon=2, execute=1, temperature=1.5)
    obs = obs_batch()
    act = policy.act(obs)
    bins = act.extras["tokens"]
    assert bins.shape == (4, 2 * A) and act.action.shape == (4, 2, A)
    assert torch.allclose(act.action, policy.centers[bins].view(4, 2, A))
    with torch.no_grad():
        logits = manual_token_logits(policy, obs, act.extras["text_ids"], bins)
        log_probs = torch.log_softmax(logits[..., -32:] / 1.5, -1)
        expect = log_probs.gather(-1, bins[..., None]).squeeze(-1)[:, :A].sum(-1)  # the executed action only
        expect_entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :A].sum(-1)
        log_prob, entropy, value = policy.evaluate(obs, act)
    assert torch.allclose(act.log_prob, expect, atol=1e-5)
    assert torch.allclose(log_prob, act.log_prob, atol=1e-6)  # PPO's ratio starts at 1
    assert torch.allclose(entropy, expect_entropy, atol=1e-5)
    assert torch.allclose(value, act.value, atol=1e-6)
    # deterministic = argmax, decoded with the KV cache = argmax of the teacher-forced logits
    greedy = policy.act(obs, deterministic=True).extras["tokens"]
    with torch.no_grad():
        logits = manual_token_logits(policy, obs, policy.text_ids(obs), greedy)
    assert torch.equal(greedy, logits[..., -32:].argmax(-1))


def test_action_bins_are_uniform_on_minus_one_one():
    policy = token_vla()
    a = torch.tensor([[-1.0, 0.0, 1.0], [-0.99, 0.5, 0.999]])
    bins = policy.discretize(a)
    assert bins.tolist() == [[0, 16, 31], [0, 24, 31]]
    assert torch.allclose(policy.to_actions(bins), a, atol=1 / 32)


def test_bfloat16_backbone_keeps_float32_heads_and_exact_ratios():
    policy = token_vla(dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in backbone_params(policy))
    assert all(p.dtype == torch.float32 for p in policy.critic.parameters())
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        log_prob, _, _ = policy.evaluate(obs, act)
    assert torch.isfinite(act.log_prob).all() and act.log_prob.dtype == torch.float32
    assert torch.equal(log_prob, act.log_prob)


# ---- flow VLA -------------------------------------------------------------------------------------
def test_flow_vla_noise_log_prob_is_the_chain_of_gaussian_euler_steps():
    policy = flow_vla("flow_noise")
    obs = obs_batch()
    with torch.no_grad():
        cond = policy.cond(obs)
        chain = torch.randn(4, 5, 2, A)
        text_ids = policy.text_ids(obs)
        log_prob, entropy, _ = policy.evaluate({k: v for k, v in obs.items() if k != "instruction"},
                                               Act(chain[:, -1], torch.zeros(4), extras={"chain": chain,
                                                                                         "text_ids": text_ids}))
        expect = torch.zeros(4)
        for k in range(4):
            tau = torch.full((4,), k / 4)
            mean = chain[:, k] + 0.25 * policy.denoiser(chain[:, k], tau * 1000, cond)
            std = noise_std(policy, chain[:, k], tau, cond)
            assert torch.allclose(std, torch.full_like(std, 0.125))  # zero-initialized head: mid-range
            expect += normal_log_density(chain[:, k + 1, :1], mean[:, :1], std[:, :1]).sum((-1, -2))
    assert torch.allclose(log_prob, expect, atol=1e-4)
    per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(0.125)
    assert torch.allclose(entropy, torch.full((4,), 4 * A * per_dim), atol=1e-4)


def test_flow_vla_sde_log_prob_is_one_sde_step():
    policy = flow_vla("flow_sde")
    obs = obs_batch()
    index = torch.tensor([0, 1, 2, 3])
    x_pre, x_post = torch.randn(4, 2, A), torch.randn(4, 2, A)
    with torch.no_grad():
        cond = policy.cond(obs)
        log_prob, _, _ = policy.evaluate(obs, Act(x_post, torch.zeros(4),
                                                  extras={"x_pre": x_pre, "x_post": x_post, "index": index}))
        delta = 0.25
        for i in range(4):
            t = 1 - index[i].item() / 4
            v = policy.denoiser(x_pre[i:i + 1], torch.tensor([(1 - t) * 1000]), cond[i:i + 1])[0]
            sigma = 0.7 * math.sqrt(t / (1 - t if t < 1 else delta))
            x0_hat, x1_hat = x_pre[i] + t * v, x_pre[i] - (1 - t) * v
            mean = x0_hat * (1 - (t - delta)) + x1_hat * (t - delta - sigma**2 * delta / (2 * t))
            expect = normal_log_density(x_post[i, :1], mean[:1], sigma * math.sqrt(delta)).sum()
            assert torch.allclose(log_prob[i], expect, atol=1e-4)


def test_condition_is_the_pooled_backbone_output_and_ignores_padding():
    policy = flow_vla()
    obs = obs_batch()
    bb = policy.backbone
    with torch.no_grad():
        cond = policy.cond(obs)
        for i in range(4):  # one sample at a time, without any padding
            ids = torch.tensor([bb.tokenizer(obs["instruction"][i])["input_ids"]])
            one = {"rgb": obs["rgb"][i:i + 1], "state": obs["state"][i:i + 1]}
            embeds, mask = bb.prefix(one, ids)
            hidden = bb.lm.get_decoder()(inputs_embeds=embeds).last_hidden_state[0]
            expect = torch.cat([hidden[-1], hidden.mean(0)])
            assert torch.allclose(cond[i], expect, atol=1e-5)


@pytest.mark.parametrize("make", [lambda: token_vla(horizon=2, execute=2), lambda: flow_vla("flow_sde")],
                         ids=["token", "flow_sde"])
def test_ppo_on_a_rollout_buffer_starts_at_ratio_one(make):
    data = check_ppo_starts_at_ratio_one(make(), obs_batch, atol=1e-5)
    assert "instruction" not in data["obs"]


# ---- saving ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["token", "token_decoder", "flow"])
def test_save_and_from_pretrained_give_identical_actions_and_log_probs(tmp_path, family):
    if family == "token":
        policy, cls = token_vla(horizon=2, execute=1, finetune="lora"), TokenVLAPolicy
    elif family == "token_decoder":
        policy, cls = token_vla(horizon=2, execute=1, finetune="frozen", action_head="decoder"), TokenVLAPolicy
    else:
        policy, cls = flow_vla("flow_noise", finetune="lora"), FlowVLAPolicy
    obs = obs_batch()
    with torch.no_grad():
        for p in policy.parameters():  # move off the initialization (LoRA B starts at zero)
            p.add_(0.01 * torch.randn_like(p))
    policy.fit_normalizer(torch.randn(32, STATE) * 2 + 1)
    policy.save_pretrained(str(tmp_path / "vla"))
    assert {"vla.json", "model.safetensors", "vision", "language", "tokenizer"} <= set(os.listdir(tmp_path / "vla"))
    loaded = cls.from_pretrained(str(tmp_path / "vla"))
    with torch.no_grad():
        assert torch.equal(policy.act(obs, deterministic=True).action, loaded.act(obs, deterministic=True).action)
        act = policy.act(obs)
        for a, b in zip(policy.evaluate(obs, act), loaded.evaluate(obs, act)):
            assert torch.equal(a, b)


def test_from_pretrained_names_the_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks vla.json, model.safetensors"):
        TokenVLAPolicy.from_pretrained(str(tmp_path))


# ---- fine-tuning modes ----------------------------------------------------------------------------
def test_lora_step_leaves_base_weights_bit_identical_and_moves_adapters_and_heads():
    policy = token_vla(finetune="lora")
    lora = {n: p.clone() for n, p in policy.named_parameters() if "lora_" in n}
    base = {n: p.clone() for n, p in policy.backbone.named_parameters() if "lora_" not in n and
            not n.startswith(("projector", "proprio"))}
    heads = [p.clone() for p in policy.critic.parameters()]
    assert lora and all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs = obs_batch()
    for _ in range(2):  # LoRA B starts at zero: A moves only from the second step on
        loss = policy.bc_loss(obs, torch.rand(4, A) * 2 - 1) + policy.value(obs).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    named = dict(policy.named_parameters())
    assert all(torch.equal(named[f"backbone.{n}"], p) for n, p in base.items())
    assert all(not torch.equal(named[n], p) for n, p in lora.items())
    assert all(not torch.equal(a, b) for a, b in zip(heads, policy.critic.parameters()))


def test_frozen_backbone_gets_no_gradient_while_expert_and_value_head_train():
    policy = flow_vla("flow_noise", finetune="frozen")
    obs = obs_batch()
    act = policy.act(obs)
    log_prob, _, value = policy.evaluate(obs, act)
    (policy.bc_loss(obs, act.action) - log_prob.mean() + value.square().mean()).backward()
    assert all(p.grad is None and not p.requires_grad for p in policy.backbone.parameters())
    for module in (policy.denoiser, policy.noise_head, policy.critic):
        assert all(p.grad is not None for p in module.parameters())


def test_frozen_backbone_features_stored_at_act_give_the_same_log_probs_as_a_backbone_pass():
    frozen, full = flow_vla("flow_noise", finetune="frozen"), flow_vla("flow_noise", finetune="full")
    obs = obs_batch()
    act = frozen.act(obs)
    assert torch.equal(act.extras["features"], frozen.cond(obs))
    recomputed = Act(act.action, act.log_prob, extras={k: v for k, v in act.extras.items() if k != "features"})
    assert torch.equal(frozen.evaluate(obs, act)[0], frozen.evaluate(obs, recomputed)[0])
    assert torch.allclose(frozen.evaluate(obs, act)[0], act.log_prob, atol=1e-5)
    assert "features" not in full.act(obs).extras  # a backbone that trains is run again in every update


def test_attention_readout_trains_on_a_frozen_backbone_from_hidden_states_stored_at_act():
    """`vla.readout: attention`: the expert also reads every prefix token; a frozen backbone's hidden states
    are stored at `act` (not the pooled features: the readout trains), and give the log-probs of a new pass."""
    policy = flow_vla("flow_noise", finetune="frozen", readout="attention", readout_queries=3)
    obs = obs_batch()
    act = policy.act(obs)
    assert "features" not in act.extras and act.extras["hidden"].shape[:2] == act.extras["prefix_mask"].shape
    assert policy.cond(obs).shape == (4, 2 * 32 + 3 * 32)
    recomputed = Act(act.action, act.log_prob, extras={k: v for k, v in act.extras.items()
                                                       if k not in ("hidden", "prefix_mask")})
    assert torch.allclose(policy.evaluate(obs, act)[0], policy.evaluate(obs, recomputed)[0], atol=1e-5)
    assert torch.allclose(policy.evaluate(obs, act)[0], act.log_prob, atol=1e-5)
    log_prob, _, _ = policy.evaluate(obs, act)
    (policy.bc_loss(obs, act.action) - log_prob.mean()).backward()
    assert all(p.grad is None for p in policy.backbone.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.readout.parameters())
    # padding is not read: a longer padded prompt gives the same condition
    wide = flow_vla("flow_noise", finetune="frozen", readout="attention", readout_queries=3, max_text_tokens=40)
    wide.load_state_dict(policy.state_dict())
    assert torch.allclose(wide.cond(obs), policy.cond(obs), atol=1e-5)
    full = flow_vla("flow_noise", finetune="full", readout="attention")  # a backbone that trains runs again
    act = full.act(obs)
    assert "hidden" not in act.extras and torch.allclose(full.evaluate(obs, act)[0], act.log_prob, atol=1e-5)
    with pytest.raises(ValueError, match="policy.vla.readout 'cls' is unknown; available: pooled, attention"):
        VLASpec(readout="cls").check()


@pytest.mark.parametrize("pooled", [False, True])
def test_token_decoder_head_trains_on_a_frozen_backbone_with_log_probs_from_its_own_softmax(pooled):
    """`vla.action_head: decoder`: a small decoder, not the LM, predicts the action tokens, so a frozen backbone
    still has an actor to train. log π is the sum of the executed tokens' log-softmax of the decoder's
    teacher-forced logits; greedy decoding is their argmax; the stored hidden states give a fresh pass's
    log-probs; each token depends only on the tokens before it. The same with `decoder_pooled` (the pooled
    prefix added to every token's input), whose cached decoding must add it too."""
    policy = token_vla(horizon=2, execute=1, temperature=1.5, finetune="frozen", action_head="decoder",
                       decoder_width=32, decoder_layers=2, decoder_heads=2, decoder_pooled=pooled)
    assert (policy.decoder.condition is not None) == pooled
    obs = obs_batch()
    act = policy.act(obs)
    bins = act.extras["tokens"]
    assert bins.shape == (4, 2 * A) and act.extras["hidden"].shape[:2] == act.extras["prefix_mask"].shape
    with torch.no_grad():
        bb = policy.backbone
        embeds, mask = bb.prefix(obs, act.extras["text_ids"])
        hidden = bb.run(embeds, mask).last_hidden_state
        logits = policy.decoder(hidden, mask, bins[:, :-1])
        log_probs = torch.log_softmax(logits / 1.5, -1)
        expect = log_probs.gather(-1, bins[..., None]).squeeze(-1)[:, :A].sum(-1)
        # causal: changing a later token leaves the earlier tokens' logits alone
        changed = bins.clone()
        changed[:, 3] = (changed[:, 3] + 1) % 32
        assert torch.allclose(policy.decoder(hidden, mask, changed[:, :-1])[:, :4], logits[:, :4], atol=1e-5)
        assert not torch.allclose(policy.decoder(hidden, mask, changed[:, :-1])[:, 4:], logits[:, 4:], atol=1e-5)
    assert torch.allclose(act.log_prob, expect, atol=1e-5)
    fresh = Act(act.action, act.log_prob, extras={k: v for k, v in act.extras.items()
                                                  if k not in ("hidden", "prefix_mask")})
    assert torch.allclose(policy.evaluate(obs, fresh)[0], act.log_prob, atol=1e-5)
    assert torch.allclose(policy.evaluate(obs, act)[0], act.log_prob, atol=1e-5)
    greedy = policy.act(obs, deterministic=True).extras["tokens"]
    with torch.no_grad():
        assert torch.equal(greedy, policy.decoder(hidden, mask, greedy[:, :-1]).argmax(-1))
    # decoding on the cache sees the logits of the teacher-forced pass, with part of the prefix masked
    seen = []
    masked = mask.clone()
    masked[:2, :4] = 0  # the first image patches
    sampled = policy.decoder.generate(hidden, masked,
                                      lambda lg: seen.append(lg) or torch.multinomial(lg.softmax(-1), 1)[:, 0])
    with torch.no_grad():
        forced = policy.decoder(hidden, masked, sampled[:, :-1])
    assert torch.allclose(torch.stack(seen, 1), forced, atol=1e-5)
    assert not torch.allclose(forced, policy.decoder(hidden, mask, sampled[:, :-1]), atol=1e-5)
    (policy.bc_loss(obs, act.action) - policy.evaluate(obs, act)[0].mean()).backward()
    assert all(p.grad is None for p in policy.backbone.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.decoder.parameters())
    with pytest.raises(ValueError, match="token VLA with policy.vla.finetune frozen has no actor weights"):
        token_vla(finetune="frozen").bc_loss(obs, act.action[:, 0])
    with pytest.raises(ValueError, match="policy.vla.action_head 'mlp' is unknown; available: lm, decoder"):
        VLASpec(action_head="mlp").check()


def test_token_ratio_gives_ppo_one_clipped_ratio_per_executed_token():
    """`vla.ratio: token`: log π per executed token (N×T), summing to the action-level log π, so PPO clips
    each token's ratio on its own: one token off by e leaves the other tokens of its action unclipped."""
    kw = dict(horizon=2, execute=2, finetune="frozen", action_head="decoder", decoder_width=32,
              decoder_layers=1, decoder_heads=2)
    per_token, per_action = token_vla(ratio="token", **kw), token_vla(**kw)
    obs = obs_batch()
    act = per_token.act(obs)
    assert act.log_prob.shape == (4, 2 * A)
    with torch.no_grad():
        assert torch.allclose(per_action.evaluate(obs, act)[0], act.log_prob.sum(-1), atol=1e-5)
    old = act.log_prob.clone()
    old[:, 0] -= 1.0  # the first token's ratio is e, past 1 + clip
    mb = {"obs": obs, "actions": act.action, "extras": act.extras, "returns": torch.zeros(4),
          "values": torch.zeros(4)}
    _, terms = PPO(per_token, PPOConfig(clip=0.2)).loss({**mb, "log_probs": old}, torch.ones(4), True)
    assert terms["clip_frac"].item() == pytest.approx(1 / (2 * A))
    _, terms = PPO(per_action, PPOConfig(clip=0.2)).loss({**mb, "log_probs": old.sum(-1)}, torch.ones(4), True)
    assert terms["clip_frac"].item() == 1.0
    with pytest.raises(ValueError, match="policy.vla.ratio 'chunk' is unknown; available: action, token"):
        VLASpec(ratio="chunk").check()


def test_a_decoder_with_fewer_bins_fits_the_backbone_of_a_policy_with_the_default_action_tokens():
    """The tiny tokenizer reserves `action_tokens` ids whatever `bins` is, so a 16-bin decoder sits on the same
    backbone (same vocabulary, same weights) as a 256-bin one; the LM head cannot use more bins than there are."""
    flow = flow_vla(bins=256)
    token = token_vla(horizon=2, bins=16, action_tokens=256, finetune="frozen", action_head="decoder",
                      decoder_width=32, decoder_layers=1, decoder_heads=2)
    assert token.backbone.vocab_size == flow.backbone.vocab_size
    token.backbone.load_state_dict(flow.backbone.state_dict())
    act = token.act(obs_batch())
    assert int(act.extras["tokens"].max()) < 16 and act.action.abs().max() <= 1
    assert len(set(token.centers.tolist())) == 16
    with pytest.raises(ValueError, match=r"policy.vla.bins \(300\) must be at most policy.vla.action_tokens \(256\)"):
        VLASpec(bins=300).check()
    VLASpec(bins=300, action_head="decoder").check()


def test_backbone_lr_is_a_group_of_its_own_that_follows_the_policy_lr():
    """`algo.backbone_lr`: a slow backbone under a fast expert; annealing keeps the ratio, the critic's stays."""
    policy = flow_vla("flow_noise", finetune="full")
    ppo = PPO(policy, PPOConfig(lr=1e-4, backbone_lr=1e-5, critic_lr=1e-3))
    groups = ppo.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-4, 1e-5, 1e-3]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in policy.backbone.parameters()}
    assert {id(p) for p in groups[2]["params"]} == {id(p) for p in policy.critic.parameters()}
    assert sum(len(g["params"]) for g in groups) == len([p for p in policy.parameters() if p.requires_grad])
    ppo.set_lr(5e-5)
    assert [g["lr"] for g in ppo.optimizer.param_groups] == pytest.approx([5e-5, 5e-6, 1e-3])
    with pytest.raises(UserError, match="algo.backbone_lr needs a VLA policy whose backbone trains"):
        PPO(flow_vla("flow_noise", finetune="frozen"), PPOConfig(backbone_lr=1e-5))


@pytest.mark.parametrize("detach", [True, False])
def test_detach_value_stops_value_gradients_at_the_backbone(detach):
    for policy in (token_vla(detach_value=detach), flow_vla(detach_value=detach)):
        policy.value(obs_batch()).square().mean().backward()
        reached = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in backbone_params(policy)]
        assert (not any(reached)) if detach else any(reached)
        assert all(p.grad is not None for p in policy.critic.parameters())


# ---- the builder ----------------------------------------------------------------------------------
class FakeEnv:
    def __init__(self, rgb=True):
        spaces = {"state": gym.spaces.Box(-np.inf, np.inf, (STATE,), np.float32)}
        if rgb:
            spaces["rgb"] = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_dim = A


def test_builder_makes_both_kinds_from_config_and_errors_in_one_line():
    from roborl.builder import make_policy

    tiny = dict(image_size=32, vision_hidden=32, hidden=32, bins=16)
    cfg = config_from_dict({"policy": {"kind": "token_vla", "vla": {**tiny, "finetune": "lora"}}}).policy
    assert isinstance(make_policy(cfg, FakeEnv()), TokenVLAPolicy)
    cfg = config_from_dict({"policy": {"kind": "flow_vla", "horizon": 4, "rl_mode": "flow_sde", "vla": tiny}}).policy
    policy = make_policy(cfg, FakeEnv(), execute=2)
    assert isinstance(policy, FlowVLAPolicy) and policy.horizon == 4 and policy.rl_mode == "flow_sde"
    with pytest.raises(UserError, match="needs rgb observations"):
        make_policy(cfg, FakeEnv(rgb=False))
    cfg = config_from_dict({"policy": {"kind": "token_vla", "vla": {"vision_path": "/no/such/siglip"}}}).policy
    with pytest.raises(UserError, match="vision_path '/no/such/siglip' is not a local checkpoint directory: it "
                                        "needs config.json"):
        make_policy(cfg, FakeEnv())
    cfg = config_from_dict({"policy": {"kind": "token_vla", "vla": {"finetune": "qlora"}}}).policy
    with pytest.raises(UserError, match="finetune 'qlora' is unknown; available: frozen, lora, full"):
        make_policy(cfg, FakeEnv())


# ---- behaviour cloning ----------------------------------------------------------------------------
def test_bc_overfits_a_handful_of_demonstrations_for_both_families():
    obs = obs_batch(4, seed=3)
    g = torch.Generator().manual_seed(0)
    chunks = torch.rand(4, 2, A, generator=g) * 1.6 - 0.8
    policy = token_vla()
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = policy.bc_loss(obs, chunks[:, 0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses
    assert (policy.act(obs, deterministic=True).action - chunks[:, 0]).abs().max() < 2 / 32

    policy = flow_vla(None)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    tau, eps = torch.rand(4, 16, generator=g), torch.randn(4, 16, 2, A, generator=g)

    def fixed_loss():  # the flow-matching loss on fixed (τ, ε), so start and end compare
        with torch.no_grad():
            return policy.cfm_loss(policy.cond(obs), chunks, tau, eps).mean().item()

    start = fixed_loss()
    for _ in range(150):
        loss = policy.bc_loss(obs, chunks)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert fixed_loss() < 0.3 * start, (start, fixed_loss())


def test_backbone_loads_local_checkpoint_directories_offline(tmp_path):
    """The path a real SigLIP / causal-LM checkpoint takes, on tiny ones written with save_pretrained."""
    from transformers import AutoModelForCausalLM, SiglipVisionModel

    from roborl.policies.vla.backbone import tiny_language_config, tiny_vision_config

    torch.manual_seed(0)
    SiglipVisionModel(tiny_vision_config(spec(image_size=48))).save_pretrained(tmp_path / "siglip")
    tok = char_tokenizer(32)
    lm = AutoModelForCausalLM.from_config(tiny_language_config(spec(language_model="llama"), tok))
    lm.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    policy = TokenVLAPolicy(spec(vision_path=str(tmp_path / "siglip"), language_path=str(tmp_path / "lm")), STATE, A)
    bb = policy.backbone
    assert bb.vision.config.image_size == 48 and type(bb.lm).__name__ == "LlamaForCausalLM"
    assert torch.equal(bb.lm.get_input_embeddings().weight, lm.get_input_embeddings().weight)
    obs = obs_batch()
    with torch.no_grad():
        act = policy.act(obs)
        assert torch.allclose(policy.evaluate(obs, act)[0], act.log_prob, atol=1e-6)


def test_a_paligemma_checkpoint_splits_into_vision_and_language_directories(tmp_path):
    """pi0's VLM (PaliGemma), tiny: policies.vla.convert writes what vision_path / language_path load."""
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration

    from roborl.policies.vla.backbone import tiny_vision_config
    from roborl.policies.vla.convert import split_vlm

    torch.manual_seed(0)
    tok = char_tokenizer(32)
    text = GemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, vocab_size=len(tok))
    vlm = PaliGemmaForConditionalGeneration(PaliGemmaConfig(vision_config=tiny_vision_config(spec()).to_dict(),
                                                            text_config=text.to_dict(), projection_dim=32))
    vlm.save_pretrained(tmp_path / "paligemma")
    tok.save_pretrained(tmp_path / "paligemma")
    vision, language = split_vlm(tmp_path / "paligemma", tmp_path / "split")
    policy = FlowVLAPolicy(spec(vision_path=str(vision), language_path=str(language)), STATE, A, 2, 1)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        logits = policy.backbone.lm(input_ids=ids).logits
        expect = vlm.model.language_model(input_ids=ids).last_hidden_state @ vlm.lm_head.weight.T
        assert torch.allclose(logits, expect, atol=1e-5)
        assert policy.act(obs_batch(), deterministic=True).action.shape == (4, 2, A)


def test_roborl_checkpoints_save_tied_embeddings_and_load_them_back(tmp_path):
    from roborl.checkpoint import Checkpoint, save_checkpoint

    policy = token_vla(language_model="gemma")  # Gemma ties the LM head to the input embeddings
    save_checkpoint(tmp_path / "ckpt.safetensors", policy, None, {}, {})
    other = token_vla(language_model="gemma", finetune="full")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    Checkpoint(str(tmp_path / "ckpt.safetensors")).load_policy(other)
    lm = other.backbone.lm
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), other.state_dict().values()))
