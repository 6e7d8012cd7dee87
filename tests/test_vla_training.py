"""The VLA pipeline end to end on LangTabletop images: scripted demos with images and instructions ->
`roborl bc` of both VLA families -> PPO and GRPO starting from the SFT checkpoint (`policy.init`) and
residual PPO on it (`residual.base`), on tiny backbones and a few steps. Learning itself is
`bench/vla.py`'s (minutes, not a test)."""
import os
from dataclasses import replace

import pytest
import torch
from helpers import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402, F401  scripts/setup.sh installs it: fail, not skip, without it

from roborl.algos.bc import demo_batches
from roborl.builder import load_pretrained, make_env, make_policy  # noqa: E402
from roborl.checkpoint import Checkpoint, save_checkpoint  # noqa: E402
from roborl.config import load_config  # noqa: E402
from roborl.demos import load_demos, record_demos  # noqa: E402
from roborl.errors import UserError  # noqa: E402
from roborl.runner import Runner  # noqa: E402
from roborl.train import train_bc  # noqa: E402

TASK = "mujoco/LangTabletop-ReachPushLift"
TINY = ["policy.vla.image_size=32", "policy.vla.vision_hidden=32", "policy.vla.hidden=32", "policy.vla.bins=16",
        "policy.vla.max_text_tokens=64", "policy.vla.value_hidden=[16]", "policy.vla.expert_hidden=[64,64]"]
TINY_PI0 = ["policy.pi0.image_size=32", "policy.pi0.vision_hidden=32", "policy.pi0.vlm_hidden=32",
            "policy.pi0.expert_hidden=32", "policy.pi0.value_hidden=[16]", "policy.pi0.finetune=full"]
FAMILIES = {"token_vla": ["policy.horizon=2", *TINY], "flow_vla": ["policy.horizon=4", "policy.steps=2", *TINY],
            "pi0": ["policy.horizon=4", "policy.steps=2", *TINY_PI0]}
# what RL changes: the VLAs' value head stops at a shared backbone, pi0's prefix freezes
RL = {"token_vla": ["policy.vla.detach_value=true"], "flow_vla": ["policy.vla.detach_value=true", "policy.rl_mode=flow_noise"],
      "pi0": ["policy.pi0.finetune=frozen", "policy.rl_mode=flow_noise"]}


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("lang_demos")
    record_demos(TASK, 6, out, num_envs=6, seed=1, rgb=True, render_size=(32, 32), progress=False, episode_length=20)
    return out


def config(kind: str, run_dir, *overrides: str):
    env = [f"env.id={TASK}", "env.obs_mode=rgb", "env.render_size=[32,32]", "env.episode_length=20",
           "env.action_chunk=2", "env.num_envs=8"]
    train = ["train.threads=1", "train.eval_episodes=4", "train.eval_envs=4", "train.video=false",
             "train.progress=false", f"train.run_dir={run_dir}"]
    other_kind = any(o.startswith("policy.kind=") for o in overrides)  # then the VLA's own keys do not apply
    family = [] if other_kind else [f"policy.kind={kind}", *FAMILIES[kind]]
    return load_config(None, [*env, *train, *family, *overrides])


@pytest.mark.parametrize("kind", list(FAMILIES))
@pytest.mark.learning
def test_sft_lowers_the_demo_loss_and_rl_starts_from_it(kind, demos, tmp_path):
    cfg = config(kind, tmp_path, f"bc.demos={demos}", "bc.steps=60", "bc.eval_every=60", "bc.batch_size=16",
                 "bc.lr=3e-3", "bc.success_only=false", f"train.name=sft_{kind}")
    summary = train_bc(cfg)
    assert summary["bc_steps"] == 60 and 0 <= summary["success_rate"] <= 1
    assert summary["demo_windows"] == 6 * 20
    best = tmp_path / f"sft_{kind}" / "checkpoints" / "best.safetensors"

    # the SFT weights fit the demos better than the initial weights they started from
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    data = load_demos(demos, 1, cfg.policy.horizon, success_only=False, images=True)
    losses = {}
    for name, state in (("start", None), ("sft", Checkpoint(best).policy_state)):
        torch.manual_seed(cfg.train.seed)
        policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
        if state is not None:
            policy.load_state_dict(state)
        batch = demo_batches(data, policy, torch.device("cpu"))
        idx = torch.arange(len(data.actions))
        torch.manual_seed(1)
        with torch.no_grad():
            losses[name] = policy.bc_loss(batch(idx), data.actions).item()
    env.close()
    assert losses["sft"] < 0.7 * losses["start"], losses

    # PPO (value head) and GRPO (group resets, prompt tokens carried in extras) start from it
    rl = [*RL[kind], f"policy.init={best}", "train.rollout_steps=10", "train.total_steps=160",
          "algo.epochs=1", "algo.minibatches=2", "train.eval_every=1"]
    for algorithm in ("ppo", "grpo"):
        groups = ["grpo.group_size=4"] if algorithm == "grpo" else []
        trainer = Runner(config(kind, tmp_path, *rl, f"train.algorithm={algorithm}", *groups,
                                f"train.name={algorithm}_{kind}"))
        out = trainer.train()
        assert out["iterations"] == 1 and out["env_steps"] >= 160 and 0 <= out["success_rate"] <= 1, out
        assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())

    # residual PPO on the frozen SFT VLA: the VLA runs its chunks inside the env, the residual acts every step
    trainer = Runner(config(kind, tmp_path, "policy.kind=residual", "policy.hidden=[16]", "env.action_chunk=1",
                                  f"residual.base={best}", "train.rollout_steps=10", "train.total_steps=80",
                                  "algo.epochs=1", "algo.minibatches=2", "train.eval_every=1",
                                  f"train.name=res_{kind}"))
    assert trainer.env.execute == 2 and trainer.env.observation_space["base_action"].shape == (4,)
    out = trainer.train()
    assert out["iterations"] == 1 and out["env_steps"] >= 80 and 0 <= out["success_rate"] <= 1, out


def test_init_modules_takes_the_pretrained_backbone_and_keeps_a_new_expert(tmp_path):
    """`policy.init_modules=[backbone]`: pi0's start, a pretrained backbone under a freshly initialized
    expert (and value head); without it every tensor of the checkpoint is loaded."""
    cfg = config("flow_vla", tmp_path, "policy.rl_mode=flow_noise")
    env = make_env(cfg.env, 1, 0, torch.device("cpu"))
    torch.manual_seed(0)
    pretrained = make_policy(cfg.policy, env, cfg.env.action_chunk)
    path = tmp_path / "pretrained.safetensors"
    save_checkpoint(path, pretrained, None, {}, {})
    torch.manual_seed(1)
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    fresh = {k: v.clone() for k, v in policy.state_dict().items()}
    load_pretrained(policy, str(path), ["backbone"])
    theirs, ours = pretrained.state_dict(), policy.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if k.startswith("backbone."))
    assert all(torch.equal(ours[k], fresh[k]) for k in ours if not k.startswith("backbone."))
    assert not torch.equal(ours["denoiser.net.0.weight"], theirs["denoiser.net.0.weight"])
    load_pretrained(policy, str(path))
    assert all(torch.equal(v, theirs[k]) for k, v in policy.state_dict().items() if not k.startswith("reference."))
    with pytest.raises(UserError, match=r"policy.init_modules \['vision'\] are not modules of both"):
        load_pretrained(policy, str(path), ["vision"])
    env.close()


def test_vla_sft_needs_images(demos, tmp_path):
    cfg = load_config(None, [f"env.id={TASK}", "env.obs_mode=state", "policy.kind=token_vla", f"bc.demos={demos}",
                             f"train.run_dir={tmp_path}"])
    with pytest.raises(UserError, match="policy.kind token_vla needs rgb observations; set env.obs_mode to rgb"):
        train_bc(cfg)


@pytest.mark.parametrize("family", ["flow_vla", "token_vla"])
def test_the_six_configs_load_and_rl_fits_its_sft_checkpoint(family):
    """PPO and GRPO start from the SFT run's checkpoint: the same env, policy kind, horizon and backbone."""
    sft = load_config(ROOT / f"configs/sft_{family}.yaml", [])
    for algorithm in ("ppo", "grpo"):
        rl = load_config(ROOT / f"configs/{algorithm}_{family}.yaml", [])
        assert rl.train.algorithm == algorithm and rl.train.name == f"{algorithm}_{family}"
        assert sft.train.name == f"sft_{family}" and rl.policy.init == f"runs/sft_{family}/checkpoints/best.safetensors"
        assert (rl.env.id, rl.env.episode_length, rl.env.action_chunk, rl.env.obs_mode) == \
               (sft.env.id, sft.env.episode_length, sft.env.action_chunk, "rgb")
        assert (rl.policy.kind, rl.policy.horizon, rl.policy.steps) == (family, sft.policy.horizon, sft.policy.steps)
        backbone = ("hidden", "layers", "vision_hidden", "image_size", "patch_size", "bins", "expert_hidden",
                    "max_text_tokens")
        assert all(getattr(rl.policy.vla, k) == getattr(sft.policy.vla, k) for k in backbone)
        assert rl.policy.vla.finetune in ("frozen", sft.policy.vla.finetune)  # the same weights, maybe frozen
        if algorithm == "grpo":
            assert rl.train.rollout_steps * rl.env.action_chunk == rl.env.episode_length
    residual = load_config(ROOT / f"configs/residual_ppo_{family}.yaml", [])
    assert residual.policy.kind == "residual" and residual.train.name == f"residual_ppo_{family}"
    assert residual.residual.base == f"runs/sft_{family}/checkpoints/best.safetensors"
    assert (residual.env.id, residual.env.episode_length, residual.env.obs_mode, residual.env.render_size,
            residual.env.action_chunk) == (sft.env.id, sft.env.episode_length, "rgb", sft.env.render_size, 1)


def test_the_state_configs_pose_the_vla_tasks_on_privileged_state():
    """`bench/vla.py --families flow_state`: the flow VLA's env, chunking and flow chain on privileged state,
    so its RL gain is what RL can add on these tasks without perception."""
    vla = load_config(ROOT / "configs/sft_flow_vla.yaml", [])
    sft = load_config(ROOT / "configs/sft_flow_state.yaml", [])
    assert sft.train.name == "sft_flow_state" and sft.env.obs_mode == "state" and sft.policy.kind == "flow"
    assert (sft.env.id, sft.env.episode_length, sft.env.action_chunk, sft.policy.horizon, sft.policy.steps) == \
           (vla.env.id, vla.env.episode_length, vla.env.action_chunk, vla.policy.horizon, vla.policy.steps)
    for algorithm in ("ppo", "grpo"):
        rl = load_config(ROOT / f"configs/{algorithm}_flow_state.yaml", [])
        assert rl.train.algorithm == algorithm and rl.train.name == f"{algorithm}_flow_state"
        assert rl.policy.init == "runs/sft_flow_state/checkpoints/best.safetensors"
        assert rl.policy.rl_mode == "flow_noise"
        assert (rl.env.id, rl.env.obs_mode, rl.env.episode_length, rl.env.action_chunk) == \
               (sft.env.id, "state", sft.env.episode_length, sft.env.action_chunk)
        assert (rl.policy.horizon, rl.policy.steps, rl.policy.denoiser, rl.policy.hidden) == \
               (sft.policy.horizon, sft.policy.steps, sft.policy.denoiser, sft.policy.hidden)
        if algorithm == "grpo":
            assert rl.train.rollout_steps * rl.env.action_chunk == rl.env.episode_length
    privileged = make_env(sft.env, 1, 0, torch.device("cpu"))
    proprio = make_env(vla.env, 1, 0, torch.device("cpu"))
    try:  # the state holds the objects and the goal on top of the proprio the VLA sees
        assert privileged.observation_space["state"].shape[0] > proprio.observation_space["state"].shape[0]
    finally:
        privileged.close()
        proprio.close()


def test_the_fewshot_configs_put_a_new_expert_on_the_flow_sft_backbone(monkeypatch):
    """`bench/vla.py --families flow_vla_fewshot`: SFT takes only the backbone of `sft_flow_vla` (frozen) and
    clones a new expert from 15 demos; PPO and GRPO start from it with the same backbone and expert."""
    import importlib.util
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as when run as a script: bench/study.py importable
    spec = importlib.util.spec_from_file_location("bench_vla", ROOT / "bench/vla.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    vla = load_config(ROOT / "configs/sft_flow_vla.yaml", [])
    sft = load_config(ROOT / "configs/sft_flow_vla_fewshot.yaml", [])
    assert sft.policy.init == "runs/sft_flow_vla/checkpoints/best.safetensors"
    assert sft.policy.init_modules == ["backbone"] and sft.policy.vla.finetune == "frozen"
    assert bench.pretraining_stage(sft.policy.init) == "sft_flow_vla"
    assert bench.pretraining_stage(vla.policy.init) is None
    assert sft.bc.max_episodes == 15 and sft.train.name == "sft_flow_vla_fewshot"
    assert sft.policy.vla == vla.policy.vla.__class__(**{**vars(vla.policy.vla), "finetune": "frozen",
                                                        "readout": "attention", "detach_value": True})
    assert (sft.env, sft.policy.horizon, sft.policy.steps) == (vla.env, vla.policy.horizon, vla.policy.steps)
    for algorithm in ("ppo", "grpo"):
        rl = load_config(ROOT / f"configs/{algorithm}_flow_vla_fewshot.yaml", [])
        assert rl.train.algorithm == algorithm and rl.train.name == f"{algorithm}_flow_vla_fewshot"
        assert rl.policy.init == "runs/sft_flow_vla_fewshot/checkpoints/best.safetensors" and not rl.policy.init_modules
        assert rl.policy.vla == sft.policy.vla and rl.policy.rl_mode == "flow_noise"
        assert rl.algo.anneal_lr and rl.train.total_steps == 2_400_000  # 1.2M steps gained 2-8 points less
        assert rl.train.max_minutes >= 100  # the cap lets a run finish (and its lr reach 0) beside another
        assert (rl.env.id, rl.env.obs_mode, rl.env.episode_length, rl.env.action_chunk) == \
               (sft.env.id, "rgb", sft.env.episode_length, sft.env.action_chunk)


def test_the_token_fewshot_configs_put_an_action_token_decoder_on_the_same_frozen_backbone():
    """`bench/vla.py --families token_vla_fewshot`: the token VLA in the flow few-shot recipe. Its backbone
    settings equal the flow SFT's (so `policy.init_modules: [backbone]` loads it, the vocabulary included:
    both reserve 256 action ids), and the decoder, with its own 32 bins and the pooled prefix at every token, is
    the actor, PPO clipping one ratio per token with GRPO's advantage scaling (group resets and per-task
    standardization) and GRPO crediting each step with its return to go."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_vla", ROOT / "bench/vla.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    vla = load_config(ROOT / "configs/sft_flow_vla.yaml", [])
    flow = load_config(ROOT / "configs/sft_flow_vla_fewshot.yaml", [])
    sft = load_config(ROOT / "configs/sft_token_vla_fewshot.yaml", [])
    assert sft.policy.kind == "token_vla" and sft.policy.init == flow.policy.init
    assert sft.policy.init_modules == ["backbone"] and bench.pretraining_stage(sft.policy.init) == "sft_flow_vla"
    assert sft.policy.vla == vla.policy.vla.__class__(**{**vars(vla.policy.vla), "finetune": "frozen",
                                                        "action_head": "decoder", "detach_value": True, "bins": 32,
                                                        "decoder_pooled": True,
                                                        "expert_hidden": sft.policy.vla.expert_hidden})  # flow only
    assert sft.policy.vla.action_tokens == vla.policy.vla.action_tokens == 256
    assert sft.env == flow.env and sft.bc.max_episodes == 60  # from 15 the decoder overfit
    for algorithm in ("ppo", "grpo"):
        rl = load_config(ROOT / f"configs/{algorithm}_token_vla_fewshot.yaml", [])
        same_kind = load_config(ROOT / f"configs/{algorithm}_flow_vla_fewshot.yaml", [])
        assert rl.train.algorithm == algorithm and rl.train.name == f"{algorithm}_token_vla_fewshot"
        assert rl.policy.init == "runs/sft_token_vla_fewshot/checkpoints/best.safetensors"
        assert not rl.policy.init_modules
        ratio, target_kl = ("token", 0.01) if algorithm == "ppo" else ("action", 0.05)  # PPO: one ratio per token
        assert rl.policy.vla.ratio == ratio and rl.algo.target_kl == target_kl
        assert rl.policy.vla == replace(sft.policy.vla, ratio=ratio) and rl.policy.horizon == sft.policy.horizon
        assert rl.grpo.reward == ("return_to_go" if algorithm == "grpo" else same_kind.grpo.reward)
        scaling = (8, True) if algorithm == "ppo" else (same_kind.algo.group_size, same_kind.algo.norm_adv_by_task)
        assert (rl.algo.group_size, rl.algo.norm_adv_by_task) == scaling
        assert (replace(rl.algo, target_kl=same_kind.algo.target_kl, group_size=same_kind.algo.group_size,
                        norm_adv_by_task=same_kind.algo.norm_adv_by_task),
                replace(rl.grpo, reward=same_kind.grpo.reward),
                rl.env.num_envs, rl.train.total_steps) == (same_kind.algo, same_kind.grpo, same_kind.env.num_envs,
                                                           same_kind.train.total_steps)


def test_asymmetric_critic_reads_the_privileged_critic_state_and_starts_fresh_on_a_bc_checkpoint(tmp_path):
    """`env.critic_state=true`: the value head reads the task's privileged state beside the backbone
    features (the policy does not); a BC checkpoint's value head, built for the features alone, is not
    loaded into it, and the policy's other weights are. PPO trains with it for every family."""
    symmetric = config("flow_vla", tmp_path, "policy.rl_mode=flow_noise")
    cfg = config("flow_vla", tmp_path, "policy.rl_mode=flow_noise", "env.critic_state=true")
    env = make_env(cfg.env, 2, 0, torch.device("cpu"))
    torch.manual_seed(0)
    pretrained = make_policy(symmetric.policy, make_env(symmetric.env, 1, 0, torch.device("cpu")), 2)
    path = tmp_path / "sft.safetensors"
    save_checkpoint(path, pretrained, None, {}, {})
    torch.manual_seed(1)
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk)
    fresh = {k: v.clone() for k, v in policy.critic.state_dict().items()}
    load_pretrained(policy, str(path))
    theirs = pretrained.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in policy.state_dict().items()
               if not k.startswith(("reference.", "critic.")))
    assert all(torch.equal(v, fresh[k]) for k, v in policy.critic.state_dict().items())

    obs = env.reset(seed=0)
    with torch.no_grad():
        value = policy.value(obs)
        moved = policy.value({**obs, "critic_state": obs["critic_state"] + 0.5})
        blind = policy.act({k: v for k, v in obs.items() if k != "critic_state"}).value
    assert torch.isfinite(value).all() and not torch.allclose(value, moved)
    assert torch.isnan(blind).all()  # no privileged state (deployment): no value, and none that looks like one
    env.close()

    for kind in FAMILIES:
        rl = ["env.critic_state=true", "train.rollout_steps=10", "train.total_steps=160", "algo.epochs=1",
              "algo.minibatches=2", "train.eval_every=1", f"train.name=asym_{kind}"]
        mode = [] if kind == "token_vla" else ["policy.rl_mode=flow_noise"]
        trainer = Runner(config(kind, tmp_path, *rl, *mode))
        critic = [p.clone() for p in trainer.policy.critic.parameters()]
        out = trainer.train()
        assert out["iterations"] == 1 and trainer.policy.critic.critic_state_dim > 0
        assert all(not torch.equal(a, b) for a, b in zip(critic, trainer.policy.critic.parameters()))
    with pytest.raises(UserError, match="env.critic_state is read only by the value heads of policy.kind"):
        Runner(config("flow_vla", tmp_path, "env.critic_state=true", "env.obs_mode=state",
                            "policy.kind=gaussian", "env.action_chunk=1"))
