"""Real-world RL on the perturbed Push twin (configs/hil_sac_push.yaml): the twin runs in real time in its own
process, an actor process steps it with the newest policy, and a SAC learner (RLPD: 20 demonstrations sampled
50/50 with online data) trains from the stream. The reward is success as a reward classifier judges it on the
twin's camera frames (trained first, on labelled frames of other episodes); with `--judge`, a scripted judge
(the twin's success flag, standing in for a person watching the cell) checks each success the classifier claims,
and the actor refits the classifier on the verdicts between episodes (roborl/robot/judged_reward.py).

Three arms, one seed each (the twin runs in real time, so each RL arm costs its robot minutes of wall time):
- BC alone: a flow policy cloned from the same demonstrations (configs/bc_flow_push.yaml);
- RL: the loop without an operator;
- RL + interventions: a scripted operator takes over when the policy heads away from the cube (the TCP's
  distance to the cube grew for three steps in a row, more than 5 cm from it) and guides the TCP behind the
  cube and through it for 20 steps; those steps go to the demonstration buffer too.

With `--images` the RL arms' policies see what a robot without a perception stack has: the front camera's 64×64
frames and the arm's proprioception, not the cube's pose (`env.obs_mode: rgb`, `env.proprio_only: true`); their
demonstrations are the same episodes recorded that way.

Success is measured by the learner's deterministic evaluation: 50 episodes in the simulation with the twin's
perturbation, every 24 learner iterations (2 robot minutes where the learner keeps up with the robot, more where it
takes a backlog of the stream at once). Prints the table and writes docs/results/real_world_rl.md (the success
flag as reward), real_world_rl_classifier.md or real_world_rl_judged.md.

    python bench/real_world_rl.py [--minutes 30] [--reward classifier [--judge]] [--images] [--runs DIR] [--reuse]

The runs go to runs/ and the page's name (runs/real_world_rl, runs/real_world_rl_classifier or
runs/real_world_rl_judged; `_images` added with --images) unless --runs says otherwise.
"""
from __future__ import annotations

import argparse
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from study import ROOT, run_once, run_stage, train_stage, write_results

TASK = "mujoco/Push"
CONTROL_HZ = 20
def classifier_on_policy(checkpoint: Path, classifier: Path, episodes: int = 50, seed: int = 7) -> dict:
    """The reward classifier on a trained policy's own frames (stochastic actions, in the perturbed simulation):
    how often it calls a frame a success that the simulator does not (what an RL learner on its reward could
    exploit), and how many episodes each calls successful."""
    import torch

    from roborl.builder import make_env, make_run_policy
    from roborl.checkpoint import Checkpoint
    from roborl.config import config_from_dict
    from roborl.reward_classifier import RewardClassifier

    ckpt = Checkpoint(checkpoint)
    cfg = config_from_dict(ckpt.config)
    clf = RewardClassifier.load(classifier)
    cfg.env.obs_mode, cfg.env.render_size = "rgb", list(clf.metadata["size"])
    policy_cfg = config_from_dict(ckpt.config)  # what the policy sees (with images, the classifier's view)
    spaces = make_env(policy_cfg.env, 1, seed, torch.device("cpu"))
    policy = make_run_policy(policy_cfg, spaces)
    seen = list(spaces.observation_space.spaces)
    spaces.close()
    ckpt.load_policy(policy)
    env = make_env(cfg.env, episodes, seed, torch.device("cpu"))
    obs = env.reset(seed=seed)
    torch.manual_seed(seed)  # the same episodes for every classifier probed on this policy
    said = torch.zeros(episodes, dtype=torch.bool)
    true = torch.zeros(episodes, dtype=torch.bool)
    false_positive, negatives = 0, 0
    for _ in range(env.unwrapped.max_episode_steps):
        with torch.no_grad():
            obs, _, _, _, info = env.step(policy.act({k: obs[k] for k in seen}).action)
        called = clf.success_prob(obs["rgb"]) > 0.5
        success = info["success"].bool()
        false_positive += int((called & ~success).sum())
        negatives += int((~success).sum())
        said |= called
        true |= success
    env.close()
    return {"classifier_success": float(said.float().mean()), "true_success": float(true.float().mean()),
            "false_positive_rate": false_positive / max(negatives, 1)}


def robot_minutes(steps: float) -> float:
    return steps / CONTROL_HZ / 60


def tb_scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def per_window(points: list[tuple[int, float]], window_steps: int, total: int) -> list[float]:
    """The mean of `points` in consecutive windows of `window_steps` env steps (nan where a window is empty)."""
    out = []
    for start in range(0, total, window_steps):
        values = [v for s, v in points if start < s <= start + window_steps]
        out.append(float(np.mean(values)) if values else float("nan"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="robot (twin) minutes per RL arm")
    p.add_argument("--demos", type=int, default=20)
    p.add_argument("--classifier-episodes", type=int, default=120, help="labelled episodes the classifier learns from")
    p.add_argument("--runs", type=Path, help="where the runs go (default: runs/ and the page's name)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward", choices=["success", "classifier"], default="success",
                   help="the RL arms' reward: the twin's success flag, or the reward classifier on its camera")
    p.add_argument("--judge", action="store_true", help="a scripted judge checks the classifier's claimed successes, "
                   "and the classifier is refit on its verdicts (with --reward classifier)")
    p.add_argument("--refit-every", type=int, default=1, help="with --judge: refit the classifier once this many judged "
                   "frames are new (robot.refit_every)")
    p.add_argument("--images", action="store_true", help="the RL arms' policies see the camera (64×64) and the arm's "
                   "proprioception alone, not the cube's pose (env.obs_mode rgb, env.proprio_only)")
    p.add_argument("--reuse", action="store_true", help="reuse finished stages in --runs")
    args = p.parse_args()
    if args.judge and args.reward != "classifier":
        p.error("--judge checks the reward classifier's successes: add --reward classifier")
    page = {"success": "real_world_rl", "classifier": "real_world_rl_judged" if args.judge else "real_world_rl_classifier"}
    page = {k: v + ("_images" if args.images else "") for k, v in page.items()}
    args.runs = args.runs or ROOT / "runs" / page[args.reward]
    runs = args.runs.resolve()
    runs.mkdir(parents=True, exist_ok=True)
    demos, cls_demos, classifier = runs / "demos", runs / "classifier_demos", runs / "classifier"
    if not (args.reuse and (demos / "demos.hdf5").exists()):
        shutil.rmtree(demos, ignore_errors=True)  # recorded anew: roborl demos never records over a file
        run_stage(["demos", TASK, "--episodes", str(args.demos), "--out", str(demos), "--seed", "1000", "--quiet"],
                  runs / "demos.log")
    image_demos = runs / "image_demos"  # the same episodes (the same seed), seen as the image policies see them
    if args.images and not (args.reuse and (image_demos / "demos.hdf5").exists()):
        shutil.rmtree(image_demos, ignore_errors=True)
        run_stage(["demos", TASK, "--episodes", str(args.demos), "--out", str(image_demos), "--seed", "1000", "--rgb",
                   "--size", "64", "--proprio-only", "--quiet"], runs / "image_demos.log")
    if not (args.reuse and (classifier / "reward_classifier.safetensors").exists()):
        shutil.rmtree(cls_demos, ignore_errors=True)
        run_stage(["demos", TASK, "--episodes", str(args.classifier_episodes), "--rgb", "--size", "64", "--noise", "0.3",
                   "--out", str(cls_demos), "--seed", "5000", "--quiet"], runs / "classifier_demos.log")
        run_stage(["reward-classifier", str(cls_demos), "--out", str(classifier), "--quiet"], runs / "classifier.log")
    from safetensors import safe_open

    with safe_open(str(classifier / "reward_classifier.safetensors"), "pt") as f:
        classifier_meta = json.loads(f.metadata()["reward_classifier"])

    steps = int(args.minutes * 60 * CONTROL_HZ)
    images = ["env.obs_mode=rgb", "env.render_size=[64,64]", "env.proprio_only=true",
              f"sac.buffer_size={steps}"] if args.images else []  # every transition kept, frames included
    common = [*images, f"train.run_dir={runs}", f"train.seed={args.seed}", "train.progress=false",
              f"sac.demos={image_demos if args.images else demos}",
              f"train.total_steps={steps}", f"train.max_minutes={args.minutes * 1.5:g}",
              f"robot.reward={classifier if args.reward == 'classifier' else 'success'}",
              f"robot.judge={'roborl.robot.operators:success_flag_judge' if args.judge else 'none'}",
              f"robot.refit_every={args.refit_every}"]
    arms = {"RL": "none", "RL + interventions": "roborl.robot.operators:push_operator"}

    def arm(name: str) -> dict:
        run, op = ("hil" if "interventions" in name else "rl"), arms[name]
        return run_once(runs, run, args.reuse, lambda: train_stage(
            ["train", str(ROOT / "configs" / "hil_sac_push.yaml"), *common, f"train.name={run}",
             f"robot.operator={op}"], runs, run))
    with ThreadPoolExecutor(len(arms)) as pool:  # the arms run side by side, each with its own twin in real time
        summaries = dict(zip(arms, pool.map(arm, arms)))
    bc = run_once(runs, "bc", args.reuse, lambda: train_stage(
        ["bc", str(ROOT / "configs" / "bc_flow_push.yaml"), f"train.run_dir={runs}", "train.name=bc",
         f"bc.demos={demos}", f"bc.max_episodes={args.demos}", "train.progress=false", f"train.seed={args.seed}",
         "env.randomize.object_mass=[1.5,1.5]", "env.randomize.friction=[0.5,0.5]",
         "env.randomize.latency_ms=[20.0,20.0]", "train.eval_episodes=50", "train.eval_envs=50"], runs, "bc"))

    window = int(5 * 60 * CONTROL_HZ)  # 5 robot minutes
    per_5min = ["interventions"] + (["vetoes"] if args.judge else [])
    lines = ["| arm | final success | best success | robot min to 90% | robot min | episodes | updates / transition | "
             + " | ".join(f"{k} / episode, per 5 robot min" for k in per_5min) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(per_5min)]
    bc_curve = tb_scalars(runs / "bc" / "tb", "eval/success_once")
    bc_best = max(v for _, v in bc_curve)
    lines.append(f"| BC alone ({args.demos} demos) | {bc_curve[-1][1]:.2f} | {bc_best:.2f} | "
                 f"{'0 (offline)' if bc_best >= 0.9 else 'not reached'} | 0 | 0 | - |" + " - |" * len(per_5min))
    curves, data, probes = {}, {"bc": bc, "classifier": classifier_meta, "reward": args.reward}, []
    for name, s in summaries.items():
        run = runs / ("hil" if "interventions" in name else "rl")
        history = tb_scalars(run / "tb", "eval/success_once")
        reach = next((robot_minutes(st) for st, r in history if r >= 0.9), None)
        windows = {k: per_window(tb_scalars(run / "tb", f"rollout/{k}"), window, s["env_steps"]) for k in per_5min}
        absorbed = [v for _, v in tb_scalars(run / "tb", "train/transitions_absorbed")]
        ratio = [v for _, v in tb_scalars(run / "tb", "train/updates_per_transition")]
        # the updates made over the transitions absorbed (not logged by runs of roborl before it took backlogs)
        utd = float(np.dot(absorbed, ratio) / sum(absorbed)) if absorbed else float("nan")
        lines.append(f"| {name} | {history[-1][1]:.2f} | {max(r for _, r in history):.2f} | "
                     f"{'not reached' if reach is None else f'{reach:.1f}'} | {robot_minutes(s['env_steps']):.1f} | "
                     f"{s['actor_episodes']} | {utd:.2f} | " + " | ".join(', '.join('-' if np.isnan(v) else f'{v:.1f}' for v in w)
                                                              for w in windows.values()) + " |")
        curves[name] = [(robot_minutes(st), r) for st, r in history]
        if s["env_steps"] < steps:
            probes.append(f"{name}: stopped by its wall-clock cap (train.max_minutes {args.minutes * 1.5:g}) after "
                          f"{robot_minutes(s['env_steps']):.1f} of its {args.minutes:g} robot minutes")
        data[name] = {"summary": s, "updates_per_transition": utd, **{f"{k}_per_episode_per_5min": w for k, w in windows.items()}}
        judged = {"the classifier it started from": classifier}
        log = run / "reward_corrections" / "refits.jsonl"
        refits = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if args.judge:
            data[name]["refits"] = refits
        if refits:
            judged["the classifier refit on the judge's verdicts"] = run / "reward_corrections"
            probes.append(f"{name}: {refits[-1]['refits']} refits on {refits[-1]['judged_frames']} judged frames "
                          f"({refits[-1]['vetoed_frames']} vetoed); held-out accuracy after the last "
                          f"{refits[-1]['heldout_accuracy']:.3f}")
        elif args.judge:
            probes.append(f"{name}: no refit (fewer than robot.refit_every {args.refit_every} judged frames)")
        for which, path in judged.items():
            probe = classifier_on_policy(run / "checkpoints" / "last.safetensors", path)
            data[name].setdefault("classifier_on_policy", {})[which] = probe
            probes.append(f"{name}, {which}: calls {probe['classifier_success']:.2f} of the final policy's episodes "
                          f"successful, the simulator {probe['true_success']:.2f}; false positives on "
                          f"{probe['false_positive_rate']:.3f} of its failing frames")
    reward = {"success": "the twin's success flag (`--reward classifier` for the classifier's)",
              "classifier": "the reward classifier on the twin's camera"}[args.reward]
    if args.judge:
        reward += (", each success it claims checked by a scripted judge (the twin's success flag): a veto pays "
                   "nothing and the episode goes on, and the actor refits the classifier on the verdicts between "
                   "episodes (`robot.judge`)")
    lines += ["", f"Reward of the RL arms: {reward}. The reward classifier (64×64 front camera, trained on "
              f"{args.classifier_episodes} noisy-expert episodes): held-out accuracy {classifier_meta['heldout_accuracy']:.3f} "
              f"on {classifier_meta['heldout_frames']} frames of {classifier_meta['heldout_episodes']} episodes; on the "
              "final policies' own frames (50 stochastic episodes each, perturbed simulation):", "",
              *[f"- {p}" for p in probes], "",
              "Success: the task done at some step of an episode (a success ends the robot's episodes), in the "
              "learner's deterministic evaluation of 50 episodes in the simulation with the twin's perturbation, every "
              "24 learner iterations: 2 robot minutes where the learner keeps up with the robot, more where it takes "
              "a backlog of the stream at once (TensorBoard eval/success_once). Updates / transition: the learner's "
              "gradient updates over the transitions it absorbed (sac.utd_ratio where it keeps up with the robot, less "
              "where it is slower). Interventions (vetoes) per episode: the mean over the actor's episodes logged in "
              "each 5 robot minutes (TensorBoard rollout/interventions, rollout/vetoes). "
              "The RL policies see the front camera's 64×64 frames and the arm's proprioception (joints, gripper, TCP), "
              "not the cube's pose; BC alone sees the task's state (proprioception and the cube's pose: `roborl bc` "
              "clones no image policy of this kind)." if args.images else
              "The policies observe the task's state (proprioception and the cube's pose)."]
    title = "" if args.reward == "success" else f", rewarded by a {'judged ' if args.judge else ''}reward classifier"
    title += ", from images and proprioception" if args.images else ""
    write_results(page[args.reward], f"Real-world RL on the perturbed Push twin{title}", lines, data,
                  f"{args.seed} (one per arm)",
                  curves=curves, plot_title="eval success vs robot minutes", xlabel="robot minutes")


if __name__ == "__main__":
    main()
