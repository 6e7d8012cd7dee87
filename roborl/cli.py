"""`roborl train CONFIG [key=value ...]`, `roborl bc CONFIG [key=value ...]`, `roborl demos TASK`,
`roborl eval CHECKPOINT [...] [--out DIR]`, `roborl export CHECKPOINT`, `roborl serve ARTIFACT`,
`roborl twin [SERVER]`, `roborl actor LEARNER`, `roborl envs`."""
from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from roborl.errors import UserError


def _train(args: argparse.Namespace) -> int:
    from roborl.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.config is None and not cfg.train.resume:
        raise UserError("roborl train needs a config file (e.g. roborl train configs/ppo_reach.yaml) or "
                        "resume=PATH (a checkpoint of the run to continue)")
    from roborl.train import train  # after the config is checked: seconds of imports

    summary = train(cfg)
    if summary is not None:  # None: a learner of rank > 0 under torchrun
        print(json.dumps(summary))
    return 0


def _bc(args: argparse.Namespace) -> int:
    from roborl.config import load_config
    from roborl.train import train_bc

    summary = train_bc(load_config(args.config, args.overrides))
    print(json.dumps(summary))
    return 0


def _demos(args: argparse.Namespace) -> int:
    from roborl import tasks  # noqa: F401
    from roborl.demos import record_demos

    env_id = args.task if "/" in args.task else f"mujoco/{args.task}"
    record_to = args.out
    if args.format == "lerobot":  # recorded as HDF5 beside the target, then written as a LeRobot dataset
        import os
        import shutil
        from pathlib import Path

        from roborl.lerobot_dataset import write_dataset

        target = Path(args.out)
        if target.exists() and any(target.iterdir()):
            raise UserError(f"'{target}' exists and is not empty: LeRobot datasets are written to a new directory")
        record_to = target.with_name(f".{target.name}.hdf5-{os.getpid()}")
    try:
        result = record_demos(env_id, args.episodes, record_to, num_envs=args.envs, seed=args.seed, rgb=args.rgb,
                              render_size=(args.size, args.size), action_noise=args.noise, progress=not args.quiet,
                              episode_length=args.episode_length, dart=args.dart, camera=args.camera,
                              proprio_only=args.proprio_only)
        if args.format == "lerobot":
            result = {**result, **write_dataset(record_to, args.out, progress=not args.quiet)}
    finally:
        if args.format == "lerobot":
            shutil.rmtree(record_to, ignore_errors=True)
    print(json.dumps(result))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from roborl.eval_suite import Suite, checked

    given = {"episodes": args.episodes, "seeds": args.seeds, "seed": args.seed, "envs": args.envs,
             "device": args.device, "video": False if args.no_video else None}
    settings = {k: v for k, v in given.items() if v is not None}
    if args.suite or args.out or args.tasks or args.seeds or len(args.checkpoints) > 1:
        return _eval_suite(args, settings)
    if not args.checkpoints:
        raise UserError("roborl eval needs a CHECKPOINT (or several, or --suite FILE)")
    from pathlib import Path

    from roborl.evaluate import evaluate_checkpoint

    s = checked(Suite({}, **settings))
    checkpoint = args.checkpoints[0]
    video = args.video_path or (str(Path(checkpoint).with_suffix(".mp4")) if args.video else None)
    result = evaluate_checkpoint(checkpoint, s.episodes, s.envs, s.seed, s.device, video)
    if video:
        result["video"] = video
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {value}")
    return 0


def _eval_suite(args: argparse.Namespace, settings: dict) -> int:
    """Tasks × checkpoints × evaluation seeds: the table on stdout; with --out DIR also DIR/eval.json,
    DIR/eval.md and videos (roborl/eval_report.py)."""
    import tempfile
    from pathlib import Path

    from roborl.builder import resolve_device
    from roborl.eval_report import build_report, markdown, write_report
    from roborl.eval_suite import run_suite, suite_from_checkpoints, suite_from_yaml

    if not args.out:
        settings = {**settings, "video": False}  # nowhere to keep videos
    if args.suite and (args.checkpoints or args.tasks):
        raise UserError("give checkpoints (and --tasks) or --suite FILE, not both")
    if args.suite:
        suite = suite_from_yaml(args.suite, **settings)
    elif args.checkpoints:
        suite = suite_from_checkpoints(args.checkpoints, args.tasks, **settings)
    else:
        raise UserError("roborl eval needs checkpoints or --suite FILE")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch)
        results = run_suite(suite, out, progress=not args.quiet)
        report = build_report(results, {"episodes_per_run": suite.episodes,
                                        "eval_seeds": [suite.seed + s for s in range(suite.seeds)], "envs": suite.envs,
                                        "device": str(resolve_device(suite.device)), "video": suite.video,
                                        "suite": args.suite})
        if args.out:
            write_report(report, out)
    print(json.dumps(report) if args.json else markdown(report), end="\n" if args.json else "")
    return 0


def _reward_classifier(args: argparse.Namespace) -> int:
    from roborl.reward_classifier import train_reward_classifier

    print(json.dumps(train_reward_classifier(args.demos, args.out, epochs=args.epochs, holdout=args.holdout,
                                             seed=args.seed, progress=not args.quiet)))
    return 0


def _export(args: argparse.Namespace) -> int:
    from roborl.deploy.export import export_checkpoint

    if args.format == "pretrained":
        from roborl.deploy.pretrained import export_pretrained

        print(json.dumps(export_pretrained(args.checkpoint, args.out)))
        return 0
    meta = export_checkpoint(args.checkpoint, args.format, args.out)
    print(json.dumps({"artifact": meta["artifact"], "runtime": meta["runtime"],
                      "max_abs_diff": meta["check"]["max_abs_diff"], "shields": meta["shields"]["in_artifact"]}))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os

    from roborl.deploy.server import serve

    serve(args.artifact, args.host, args.port, args.token or os.environ.get("ROBORL_SERVER_TOKEN"), args.max_batch)
    return 0


def _twin(args: argparse.Namespace) -> int:
    from roborl.deploy.client import PolicyClient, PolicyUnavailable
    from roborl.robot.episodes import run_episodes
    from roborl.robot.twin import TwinRobot, TwinSettings, parse_perturb, start_twin

    try:
        client = PolicyClient(args.server, token=args.token)
    except PolicyUnavailable as exc:
        raise UserError(f"{exc} (start one with `roborl serve ARTIFACT`)") from exc
    env = client.metadata["env"]
    try:
        perturb = parse_perturb(args.perturb)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    view = {}
    if "rgb" in client.metadata["observation"]:  # an image policy: the twin renders the task's camera at its size
        view = {"camera": "front", "render_size": tuple(client.metadata["observation"]["rgb"]["shape"][:2])}
    proc, uri = start_twin(TwinSettings(env["id"], env["controller"], env["control_freq"], perturb, args.seed, **view,
                                        proprio_only=env.get("proprio_only", False)))
    try:
        robot = TwinRobot(uri)
        robot.connect()
        result = run_episodes(robot, client, args.episodes, args.seed)
        robot.close()
    finally:
        proc.kill()
        client.close()
    print(json.dumps(result))
    return 0


def _actor(args: argparse.Namespace) -> int:
    from roborl.robot.actor import run_actor
    from roborl.robot.franka import FrankaError

    try:
        run_actor(args.learner, args.episodes, args.exit_with_stdin)
    except FrankaError as exc:  # the arm refused or failed: stopped, and said in one line
        raise UserError(str(exc)) from exc
    return 0


def _envs(args: argparse.Namespace) -> int:
    from roborl import (
        sim,
        tasks,  # noqa: F401
    )

    print("\n".join(sim.available()))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as roborl reports every bad input: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"roborl: error: {self.prog}: {message} (see {self.prog} --help)\n")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuses an output path that cannot be written before the command's work, not after it."""
    from roborl.files import unwritable

    folder = args.command in ("demos", "eval", "reward-classifier") or getattr(args, "format", None) == "pretrained"
    for name, is_folder in (("out", folder), ("video_path", False)):
        if (path := getattr(args, name, None)) and (reason := unwritable(path, is_folder)):
            raise UserError(f"--{name.replace('_', '-')}: {reason}")


def make_parser() -> argparse.ArgumentParser:
    """The `roborl` command line; docs/reference/cli.md is generated from it (roborl/reference.py)."""
    parser = OneLineParser(prog="roborl", description="Robot RL: train, evaluate and export policies.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train with a YAML config; override any key with key=value")
    p.add_argument("config", nargs="?", help="configs/*.yaml (optional with resume=PATH)")
    p.add_argument("overrides", nargs="*", help="e.g. train.total_steps=200000 env.num_envs=128 resume=PATH")
    p.set_defaults(func=_train)
    p = sub.add_parser("bc", help="behaviour cloning of a diffusion, flow or VLA policy on demonstrations")
    p.add_argument("config", help="configs/bc_*.yaml")
    p.add_argument("overrides", nargs="*", help="e.g. bc.steps=5000 bc.max_episodes=10")
    p.set_defaults(func=_bc)
    p = sub.add_parser("demos", help="record scripted-expert demonstrations to robomimic-style HDF5 or a LeRobot dataset")
    p.add_argument("task", help="a task with a scripted expert, e.g. Push or mujoco/PickPlace")
    p.add_argument("--episodes", type=int, default=100, help="episodes to record")
    p.add_argument("--out", required=True, help="directory; hdf5: the file is DIR/demos.hdf5; lerobot: the dataset's root")
    p.add_argument("--format", default="hdf5", choices=["hdf5", "lerobot"],
                   help="hdf5 (robomimic-style) or lerobot (a LeRobot v3 dataset: parquet, AV1 videos, meta/)")
    p.add_argument("--envs", type=int, default=16, help="environments recorded in parallel")
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode's initial state")
    p.add_argument("--rgb", action="store_true", help="also record obs/rgb frames")
    p.add_argument("--camera", help="with --rgb: the scene's camera to record (default: the task's, 'front'); several "
                   "joined by + are recorded side by side in one frame, e.g. front+workspace")
    p.add_argument("--size", type=int, default=64, help="rgb frame size")
    p.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise added to the expert's actions")
    p.add_argument("--dart", action="store_true",
                   help="with --noise: execute the noisy action, record the expert's (demos of recovering)")
    p.add_argument("--episode-length", type=int, help="control steps per episode (default: the task's)")
    p.add_argument("--proprio-only", action="store_true", help="record the arm's proprioception alone as the state "
                   "(for env.proprio_only policies; with --rgb the camera shows the rest)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_demos)
    p = sub.add_parser("eval", help="evaluate checkpoints deterministically; over tasks and seeds with --out DIR")
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT",
                   help="several: several training seeds of one method (or, without --tasks, grouped by task)")
    p.add_argument("--tasks", nargs="+", help="evaluate every checkpoint on these env ids (default: its own)")
    p.add_argument("--suite", help="YAML file: tasks -> checkpoints (see roborl/eval_suite.py)")
    p.add_argument("--seeds", type=int, help="evaluation seeds per checkpoint (--seed, --seed+1, ...; default 1)")
    p.add_argument("--out", help="write DIR/eval.json, DIR/eval.md and DIR/videos/ (mean, IQM, bootstrap CIs)")
    p.add_argument("--episodes", type=int, help="episodes per checkpoint and seed (default 50)")
    p.add_argument("--envs", type=int, help="environments run in parallel (default 25)")
    p.add_argument("--seed", type=int, help="the (first) evaluation seed (default 12345)")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--video", action="store_true", help="one checkpoint: write an mp4 beside it")
    p.add_argument("--video-path", help="one checkpoint: write the mp4 here instead")
    p.add_argument("--no-video", action="store_true", help="with --out: no videos")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)
    p = sub.add_parser("reward-classifier", help="train a success classifier on labelled camera frames (the reward "
                                                 "of real-world RL)")
    p.add_argument("demos", help="a demos file (or its directory) with obs/rgb, e.g. from `roborl demos TASK --rgb`")
    p.add_argument("--out", required=True, help="directory for reward_classifier.safetensors")
    p.add_argument("--epochs", type=int, default=30, help="passes over the training frames")
    p.add_argument("--holdout", type=float, default=0.25, help="fraction of episodes held out to measure accuracy")
    p.add_argument("--seed", type=int, default=0, help="split and initialization seed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_reward_classifier)
    p = sub.add_parser("export", help="export a checkpoint to one TorchScript or ONNX file (+ metadata JSON), or a "
                                      "pi0 / LeRobot policy to its own pretrained directory")
    p.add_argument("checkpoint", help="a checkpoint written by `roborl train` or `roborl bc` (.safetensors)")
    p.add_argument("--format", default="torchscript", choices=["torchscript", "onnx", "pretrained"],
                   help="artifact format; pretrained: a directory transformers (pi0) or LeRobot loads alone")
    p.add_argument("--out", help="artifact path (default: beside the checkpoint, .pt, .onnx or a directory)")
    p.set_defaults(func=_export)
    p = sub.add_parser("serve", help="serve an exported policy over websocket + msgpack")
    p.add_argument("artifact", help="a file written by `roborl export`")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    p.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (or set ROBORL_SERVER_TOKEN)")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch of observations per request")
    p.set_defaults(func=_serve)
    p = sub.add_parser("twin", help="run a served policy on a MuJoCo digital twin of its task, in real time")
    p.add_argument("server", nargs="?", default="ws://127.0.0.1:8000", help="the policy server's URI")
    p.add_argument("--token", help="the server's token, if it was started with one")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run")
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode's initial state")
    p.add_argument("--perturb", nargs="*", default=[], help="e.g. object_mass=1.5 friction=0.5 latency_ms=20 obs_noise=0.01")
    p.set_defaults(func=_twin)
    p = sub.add_parser("actor", help="the actor of a real-world RL run: steps the robot with the learner's newest "
                                     "policy and streams its transitions (resources.actor robot)")
    p.add_argument("learner", help="HOST:PORT the learner listens on (its robot.learner)")
    p.add_argument("--episodes", type=int, help="stop after this many episodes (default: when the run is over)")
    p.add_argument("--exit-with-stdin", action="store_true",
                   help="stop the robot and exit once stdin closes (how a learner that starts its actor stops it)")
    p.set_defaults(func=_actor)
    p = sub.add_parser("envs", help="list the available environment ids")
    p.set_defaults(func=_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.command in ("train", "bc") and args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    try:
        check_outputs(args)
        return args.func(args)
    except UserError as exc:
        print(f"roborl: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # what no check foresaw: a full disk, a folder removed meanwhile, a connection lost
        said = (f"'{exc.filename}': {exc.strerror} (check the path, its permissions and the free space)"
                if exc.filename else " ".join(str(exc.strerror or exc).split()))  # one line
        print(f"roborl: error: {said}", file=sys.stderr)
        return 2
    except Exception as exc:
        from roborl.sim.errors import SimError

        if isinstance(exc, SimError):
            print(f"roborl: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
