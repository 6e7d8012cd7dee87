"""What PPO on a full-size pi0 costs on a GPU: transformers' PI0ForConditionalGeneration at pi0_base's sizes
(PI0Config's defaults: a PaliGemma prefix of SigLIP So400m/14 at 224 px and Gemma 2B, a Gemma 300M action
expert, chunks of 50 actions of up to 32 dims), with random weights saved in bfloat16 and loaded through
`policy.pi0.path` as a user's checkpoint is. configs/ppo_pi0_tabletop.yaml (flow-noise PPO, 4 denoising steps)
drives `--envs` LangTabletop envs rendered at 224×224 with it, as docs/guides/vla.md says to run a real
checkpoint: bfloat16 prefix, float32 expert. Per setting (`frozen`: the prefix runs without autograd; `lora`:
adapters on its language model, more minibatches so that a minibatch's activations fit) it runs PPO iterations
in one process (the first setting's first iteration warms it up) and reports the last: seconds of the rollout and
of the update, env steps/s end to end, and the peak GPU memory since the setting's start. The weights are random,
so no learning is measured.

Writes docs/results/pi0_gpu.{md,json}. Needs a CUDA GPU; `--tiny` runs the same path with a tiny pi0 on the CPU
and only prints (a check of the script, not a measurement).
Usage: python bench/pi0_gpu.py [--envs 64] [--settings frozen lora] [--iterations 2] [--tiny]
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch
from study import started_runner, write_results

from roborl.config import load_config
from roborl.policies.configuration_pi0 import Pi0Spec
from roborl.policies.pi0 import tiny_pi0
from roborl.policies.vla.tokenizer import word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_pi0_tabletop.yaml"
SETTINGS = {  # name: overrides
    "frozen": ["policy.pi0.finetune=frozen"],
    "lora": ["policy.pi0.finetune=lora", "algo.minibatches=32"],
}
TINY_HORIZON = 4


def write_checkpoint(directory: Path, tiny: bool, device: torch.device) -> int:
    """A random pi0 as `save_pretrained` writes it (bfloat16), with roborl's word tokenizer (PaliGemma's is not
    on this machine; the prompt's length is what costs, not its ids). Returns its parameter count."""
    from transformers import PI0Config, PI0ForConditionalGeneration

    tokenizer = word_tokenizer(0)
    with torch.device(device):
        model = tiny_pi0(Pi0Spec(), len(tokenizer), 32, 32, TINY_HORIZON, 4) if tiny else \
            PI0ForConditionalGeneration(PI0Config())
    model.to(torch.bfloat16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    count = sum(p.numel() for p in model.parameters())
    del model
    return count


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(overrides: list[str], iterations: int, device: torch.device) -> dict[str, float]:
    """Rollout and update seconds, env steps/s and peak GPU memory (GiB) of the last of `iterations` iterations."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with started_runner(CONFIG, [f"train.device={device}", "algo.critic_warmup=0", "algo.target_kl=null",
                                 *overrides]) as trainer:
        load_s = time.perf_counter() - start
        for _ in range(iterations):
            synchronize(device)
            start = time.perf_counter()
            stats, _ = trainer.iterate(iterations)
            synchronize(device)
            seconds = time.perf_counter() - start
            trainer.iteration += 1
            print(f"  iteration {trainer.iteration}: {seconds:.1f} s", flush=True)
        steps = trainer.algo.env_steps
        rollout_s = steps / stats["collect_sps"]
        trained = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
    del trainer
    gc.collect()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"load_s": load_s, "env_steps": steps, "rollout_s": rollout_s, "update_s": seconds - rollout_s,
            "sps": steps / seconds, "peak_gib": peak, "trained_params": trained}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--iterations", type=int, default=2,
                        help="of the first setting, the first of them a warm-up; later settings run one in the warm process")
    parser.add_argument("--tiny", action="store_true", help="a tiny pi0 on the CPU: checks the script")
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/pi0_gpu.py needs a CUDA GPU (or --tiny, a check of the script on the CPU)")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        params = write_checkpoint(Path(tmp), args.tiny, device)
        print(f"random pi0 of {params / 1e9:.2f}B parameters written in {time.perf_counter() - start:.0f} s", flush=True)
        size = [] if args.tiny else ["env.render_size=[224,224]", "train.threads=8"]
        common = [f"env.num_envs={args.envs}", "policy.init=null", f"policy.pi0.path={tmp}",
                  f"policy.horizon={TINY_HORIZON if args.tiny else 50}", "policy.pi0.dtype=bfloat16", *size]
        for i, name in enumerate(args.settings):
            print(f"{name}:", flush=True)
            try:
                rows[name] = measure(common + SETTINGS[name], args.iterations if i == 0 else 1, device)
            except torch.OutOfMemoryError as exc:
                rows[name] = {"error": f"out of GPU memory: {str(exc).splitlines()[0]}"}
                gc.collect()
                torch.cuda.empty_cache()
            print(f"{name}: {rows[name]}", flush=True)
            report(rows, params, args)  # after each setting, so a run cut short keeps what it measured


def report(rows: dict[str, dict], params: int, args: argparse.Namespace) -> None:
    cfg = load_config(CONFIG, [])
    what = "a tiny pi0 on the CPU (a check of the script)" if args.tiny else \
        f"pi0_base's architecture, {params / 1e9:.2f}B parameters, random weights"
    lines = [f"PPO (flow-noise, {cfg.policy.steps} denoising steps) of {what}: {args.envs} envs of "
             f"{cfg.env.id}, {cfg.train.rollout_steps} decisions of {cfg.env.action_chunk} control steps per iteration, "
             f"{cfg.algo.epochs} epochs; the prefix in bfloat16, the expert in float32", "",
             "| prefix | minibatches | trained parameters | rollout s | update s | env steps/s end to end | "
             "peak GPU memory (GiB) | checkpoint load s |", "|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        minibatches = load_config(CONFIG, SETTINGS[name]).algo.minibatches
        if "error" in row:
            lines.append(f"| {name} | {minibatches} | | | | | {row['error']} | |")
            continue
        lines.append(f"| {name} | {minibatches} | {row['trained_params'] / 1e6:.1f}M | {row['rollout_s']:.1f} | "
                     f"{row['update_s']:.1f} | {row['sps']:.0f} | {row['peak_gib']:.1f} | {row['load_s']:.0f} |")
    steps = next((row["env_steps"] for row in rows.values() if "env_steps" in row), 0)
    lines += ["", f"All rows come from one process. The first row is the last of {args.iterations} iterations (the first "
              f"warms the process up); each later row is one iteration in the warm process. {steps} env steps per "
              "iteration; the update runs every epoch (no early stop on the KL)."]
    if args.tiny:
        print("\n".join(lines))
        return
    write_results("pi0_gpu", "PPO on a full-size pi0: GPU memory and time per iteration", lines,
                  {"params": params, "rows": rows}, seeds="not applicable (cost, random weights)")


if __name__ == "__main__":
    main()
