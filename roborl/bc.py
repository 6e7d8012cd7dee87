"""Behaviour cloning: `roborl bc CONFIG` fits a diffusion, flow or VLA policy to demonstrations (action
chunks of `policy.horizon`, `env.obs_history` states, normalizer fitted on the demos; VLAs also get each
step's image and its episode's instruction), evaluates it in the simulator every `bc.eval_every` steps and
writes checkpoints in the RL format, so `policy.init` of an RL config can start from them."""
from __future__ import annotations

import math
import os
import time

import torch
import yaml

from roborl.builder import VLA_KINDS, load_pretrained, make_env, make_policy, resolve_device
from roborl.checkpoint import save_checkpoint
from roborl.config import Config, config_to_dict
from roborl.demos import DemoWindows, load_demos
from roborl.errors import UserError
from roborl.evaluate import evaluate
from roborl.logger import Logger
from roborl.plots import plot_curves
from roborl.run_dir import new_run_dir, write_json


def train_bc(cfg: Config) -> dict:
    b, t = cfg.bc, cfg.train
    vla = cfg.policy.kind in VLA_KINDS
    if cfg.policy.kind not in ("diffusion", "flow", *VLA_KINDS):
        raise UserError(f"roborl bc trains diffusion, flow, token_vla or flow_vla policies; policy.kind is "
                        f"'{cfg.policy.kind}'")
    if vla and cfg.env.obs_mode != "rgb":
        raise UserError(f"a {cfg.policy.kind} policy sees images: set env.obs_mode rgb (it is '{cfg.env.obs_mode}')")
    if not b.demos:
        raise UserError("bc.demos is empty: set it to a directory written by `roborl demos TASK --out DIR`")
    device = resolve_device(t.device)
    torch.set_num_threads(t.threads or max(1, (os.cpu_count() or 1) // 2))
    torch.manual_seed(t.seed)
    data = load_demos(b.demos, cfg.env.obs_history, cfg.policy.horizon, b.max_episodes, b.success_only, images=vla)
    demo_env = data.env_args.get("env_id")
    if demo_env and demo_env != cfg.env.id:
        raise UserError(f"the demonstrations were recorded on '{demo_env}' but env.id is '{cfg.env.id}'")
    env = make_env(cfg.env.for_evaluation(), min(t.eval_envs, t.eval_episodes), t.seed + 1, device)
    policy = make_policy(cfg.policy, env, cfg.env.action_chunk).to(device)
    if data.obs.shape[1] != env.observation_space["state"].shape[0]:
        raise UserError(f"demonstration states have {data.obs.shape[1]} dims but the env's have "
                        f"{env.observation_space['state'].shape[0]}: record the demos with this env's settings")
    if cfg.policy.init:  # go on from an earlier SFT run's weights
        load_pretrained(policy, cfg.policy.init, cfg.policy.init_modules)
    policy.fit_normalizer(data.obs.to(device))
    batch = demo_batches(data, policy, device)
    actions = data.actions.to(device)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=b.lr, weight_decay=b.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / b.steps, 1))))
    run_dir = new_run_dir(t.name, t.run_dir, f"bc_{cfg.env.id.replace('/', '_')}", resume_hint=False)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    logger = Logger(run_dir, b.steps, 0, t.progress)
    gen = torch.Generator(device=device).manual_seed(t.seed)
    history: list[list[float]] = []
    best, start, result = -1.0, time.time(), {}
    summary: dict = {}
    try:
        for step in range(1, b.steps + 1):
            idx = torch.randint(0, len(actions), (b.batch_size,), device=device, generator=gen)
            loss = policy.bc_loss(batch(idx), actions[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            if step % 100 == 0:
                logger.scalars("bc", {"loss": loss.item(), "lr": schedule.get_last_lr()[0]}, step)
                logger.advance(100, {"loss": loss.item(), **({"eval_success": result["success_rate"]} if result else {})})
            if step % b.eval_every == 0 or step == b.steps:
                policy.eval()
                result = evaluate(policy, env, t.eval_episodes, seed=t.seed + 1000)
                policy.train()
                wall = time.time() - start
                history.append([step, round(wall, 2), result["success_rate"]])
                logger.scalars("eval", result, step)
                logger.bar.write(f"[{step} steps, {wall:.0f}s] loss {loss.item():.4f} eval success {result['success_rate']:.3f}")
                state = {"env_steps": 0, "iteration": 0, "best_success": max(best, result["success_rate"]),
                         "lr": cfg.algo.lr, "run_dir": str(run_dir), "last_eval": result, "wall_time_s": wall,
                         "bc_step": step, "demo_episodes": data.episodes, "eval_history": []}
                if result["success_rate"] > best:
                    best = result["success_rate"]
                    save_checkpoint(run_dir / "checkpoints" / "best.safetensors", policy, None, config_to_dict(cfg), state)
                save_checkpoint(run_dir / "checkpoints" / "last.safetensors", policy, None, config_to_dict(cfg), state)
                summary = {"success_rate": result["success_rate"], "best_success_rate": best, "bc_steps": step,
                           "demo_episodes": data.episodes, "demo_windows": len(actions), "wall_time_s": round(wall, 2),
                           "env": cfg.env.id, "run_dir": str(run_dir), "eval_history": history}
                write_json(run_dir / "summary.json", summary)
                plot_curves(run_dir / "eval_curve.png", {"deterministic eval": [(s, r) for s, _, r in history]},
                            f"{run_dir.name}: BC on {data.episodes} demos", xlabel="gradient steps")
    finally:
        logger.close()
        env.close()
    return summary


def demo_batches(data: DemoWindows, policy: torch.nn.Module, device: torch.device):
    """`batch(idx)`: the observations of demo windows `idx` as the policy reads them. For a VLA these are
    the current frame, the proprio state and the instruction's prompt tokens (tokenized once per distinct
    instruction); the frames stay on the CPU as uint8 and only a batch moves to `device`."""
    states = data.obs.to(device)
    if data.rgb is None:
        return lambda idx: {"state": states[idx]}
    texts = sorted(set(data.instructions))
    prompt_ids = policy.backbone.encode_text(texts, device)
    row = {text: i for i, text in enumerate(texts)}
    which = torch.tensor([row[text] for text in data.instructions], device=device)
    rgb = data.rgb

    def batch(idx: torch.Tensor) -> dict:
        return {"state": states[idx], "rgb": rgb[idx.cpu()].to(device), "text_ids": prompt_ids[which[idx]]}

    return batch
