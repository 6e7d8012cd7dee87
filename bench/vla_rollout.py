"""Where a VLA rollout step's time goes, and what the three shortcuts save, all measured in one run:

1. the chunked rgb env's step (64 envs, 2 control steps per decision) with the inner step `unobserved`
   (frames rendered once per decision, as `ActionChunkEnv` does) against rendering every control step;
2. rendering the 64 frames in tiles of one framebuffer read back once (`sim/render.py`) against a framebuffer
   of one tile, each frame drawn and read back alone;
3. the token VLA's action decoding on its key/value cache (`ActionTokenDecoder.generate`) against
   re-running the decoder over all tokens so far for each new one;
4. a whole decision (env step + `act`) of the flow VLA and the token VLA of the few-shot configs.

The policies are built from the configs with fresh weights: the times do not depend on them.
Writes `docs/results/vla_rollout.{md,json,png}`.
Usage: python bench/vla_rollout.py [--envs 64] [--repeats 20]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from study import write_results

from roborl.builder import build
from roborl.config import load_config
from roborl.sim.render import BatchRenderer

CONFIGS = {"flow_vla": "configs/ppo_flow_vla_fewshot.yaml", "token_vla": "configs/ppo_token_vla_fewshot.yaml"}


def ms(fn: Callable[[], object], repeats: int) -> float:
    """Mean milliseconds per call after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def measure(family: str, path: str, envs: int, repeats: int) -> list[tuple[str, float, float | None]]:
    cfg = load_config(path, [f"env.num_envs={envs}"])
    env, policy = build(cfg, torch.device("cpu"))
    obs = {"now": env.reset(seed=0)}
    chunk = torch.zeros(envs, cfg.env.action_chunk, env.action_dim)
    rows: list[tuple[str, float, float | None]] = []

    def every_step_rendered() -> None:
        for k in range(cfg.env.action_chunk):  # what the chunk env did before `unobserved`
            env.env.step(chunk[:, k])

    def decision() -> None:
        with torch.no_grad():
            action = policy.act(obs["now"]).action
        obs["now"] = env.step(action)[0]

    if family == "flow_vla":
        rows.append(("chunked env step", ms(lambda: env.step(chunk), repeats), ms(every_step_rendered, repeats)))
        world = env.env
        one_tile = BatchRenderer(world.model, *world.render_size, world.camera)  # envs=1: one tile, one frame a read
        rows.append(("rendering the frames", ms(world.render, repeats),
                     ms(lambda: one_tile.render(world.state, world._markers()), repeats)))
        one_tile.close()
    else:
        with torch.no_grad():
            hidden, mask = policy.backbone.hidden_states(obs["now"], policy.text_ids(obs["now"]))

        def cached() -> torch.Tensor:
            return policy.decoder.generate(hidden, mask, lambda logits: logits.argmax(-1))

        def uncached() -> torch.Tensor:
            bins = hidden.new_zeros(envs, 0, dtype=torch.long)
            for _ in range(policy.num_tokens):
                with torch.no_grad():
                    logits = policy.decoder(hidden, mask, bins)[:, -1]
                bins = torch.cat([bins, logits.argmax(-1)[:, None]], 1)
            return bins

        if not torch.equal(cached(), uncached()):
            raise SystemExit("cached and uncached greedy decoding chose different tokens")
        rows.append(("token decoding", ms(cached, repeats), ms(uncached, repeats)))
    rows.append((f"{family} decision (env step + act)", ms(decision, repeats), None))
    env.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for family, path in CONFIGS.items() for row in measure(family, path, args.envs, args.repeats)]
    lines = [f"| per decision, {args.envs} envs | with the shortcut (ms) | without it (ms) | speed-up |", "|---|---|---|---|"]
    for name, now, before in rows:
        extra = f"{before:.1f} | {before / now:.2f}×" if before is not None else "– | –"
        lines.append(f"| {name} | {now:.1f} | {extra} |")
    data = {"rows": [{"step": name, "ms": now, "ms_without_shortcut": before} for name, now, before in rows]}
    write_results("vla_rollout", "VLA rollouts: where a decision's time goes", lines, data,
                  seeds="not applicable (speed; fresh weights)", bars={name: now for name, now, _ in rows},
                  bar_label="milliseconds per decision")


if __name__ == "__main__":
    main()
