"""Loading an exported policy: the artifact with its own runtime (torch.jit or onnxruntime) and its
metadata sidecar, checked against each other before anything runs."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from roborl.errors import UserError

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
INPUTS = ("state", "rgb")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_runner(path: str | Path, runtime: str) -> Runner:
    """obs dict of numpy arrays (batched) -> {"action", "command"} with the artifact's runtime only."""
    if runtime == "torchscript":
        import warnings

        import torch

        with warnings.catch_warnings():
            for deprecated in (DeprecationWarning, FutureWarning):  # TorchScript is deprecated upstream, still supported
                warnings.simplefilter("ignore", deprecated)
            module = torch.jit.load(str(path), map_location="cpu")

        def run(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.no_grad():
                out = module(*[torch.from_numpy(obs[k]) for k in INPUTS if k in obs])
            return {"action": out[0].numpy(), "command": out[1].numpy()}
        return run
    try:
        import onnxruntime
    except ImportError as exc:
        raise UserError("running an ONNX artifact needs onnxruntime: pip install onnxruntime") from exc
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        action, command = session.run(["action", "command"], {k: obs[k] for k in INPUTS if k in obs})
        return {"action": action, "command": command}
    return run


class Artifact:
    """An exported policy: `metadata` (the sidecar) and `__call__(obs) -> {"action", "command"}`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        sidecar = self.path.with_name(self.path.name + ".json")
        if not self.path.is_file():
            raise UserError(f"artifact '{self.path}' does not exist (write one with `roborl export CHECKPOINT`)")
        if not sidecar.is_file():
            raise UserError(f"artifact '{self.path}' has no metadata file '{sidecar.name}' beside it; re-export it")
        try:
            self.metadata = json.loads(sidecar.read_text())
            runtime, digest = self.metadata["runtime"], self.metadata["sha256"]
        except (ValueError, KeyError) as exc:
            raise UserError(f"metadata '{sidecar}' is corrupt ({type(exc).__name__}); re-export the artifact") from exc
        if sha256(self.path) != digest:
            raise UserError(f"artifact '{self.path}' does not match the sha256 in its metadata: "
                            "it was modified or truncated; re-export it")
        try:
            self.run = load_runner(self.path, runtime)
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"artifact '{self.path}' could not be loaded by {runtime} "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc

    def warm_up(self, runs: int = 5) -> None:
        """Run the policy on zero observations: TorchScript optimizes its graph during the first calls,
        which would otherwise make the first control periods late."""
        obs = {k: np.zeros([1, *v["shape"]], dtype=v["dtype"]) for k, v in self.observation.items()}
        for _ in range(runs):
            self.run(obs)

    @property
    def observation(self) -> dict[str, dict]:
        return self.metadata["observation"]

    def __call__(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(obs)
