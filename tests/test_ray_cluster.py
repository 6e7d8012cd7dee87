"""Ray env workers on a real two-node Ray cluster on this machine: a head (`ray start --head`) and a second
node (`ray start --address ...`), each with a custom resource that `resources.worker_nodes` places a worker
by. Stopping the second node mid-run gets its worker replaced on the head, and the run finishes."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from helpers import ROOT

from roborl.config import load_config
from roborl.learners import free_port
from roborl.runner import Runner

RAY = str(Path(sys.executable).with_name("ray"))


def wait_for_nodes(count: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) == count:
            return alive
        time.sleep(0.5)
    raise AssertionError(f"the Ray cluster did not reach {count} live nodes: {ray.nodes()}")


@pytest.fixture
def two_node_cluster(tmp_path):
    """A head with resource `head` and a second node with resource `node_b`, both on loopback."""
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=2", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--include-dashboard=false", '--resources={"head": 2}', *common],
                   check=True, env=env, capture_output=True, timeout=120)
    node_b = subprocess.Popen([RAY, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1",
                               '--resources={"node_b": 2}', "--block", *common],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="ERROR")
        wait_for_nodes(2)
        yield f"127.0.0.1:{port}", node_b
    finally:
        ray.shutdown()
        if node_b.poll() is None:
            os.killpg(node_b.pid, signal.SIGKILL)
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_workers_on_two_nodes_and_one_node_lost(tmp_path, two_node_cluster):
    address, node_b = two_node_cluster
    cfg = load_config(str(ROOT / "configs" / "ppo_reach.yaml"), [
        f"train.run_dir={tmp_path}", "train.name=cluster", "train.video=false", "train.progress=false",
        "train.total_steps=16000", "train.eval_every=100", "train.eval_episodes=8", "train.eval_envs=8",
        "resources.env_workers=2", "resources.worker_cpus=0.5", f"resources.ray_address={address}",
        "resources.worker_nodes=[head, node_b]"])
    runner = Runner(cfg)
    pool = runner.collector.pool
    by_resource = {label: pool.node_with(label) for label in ("head", "node_b")}
    assert pool.nodes() == [by_resource["head"], by_resource["node_b"]]  # one worker on each node
    stopped = threading.Event()

    def stop_node_b_at_iteration_2() -> None:
        while runner.iteration < 2:
            time.sleep(0.01)
        os.killpg(node_b.pid, signal.SIGTERM)  # `ray start --block` takes its node down
        node_b.wait(timeout=60)
        stopped.set()

    threading.Thread(target=stop_node_b_at_iteration_2, daemon=True).start()
    start = time.time()
    summary = runner.train()
    assert stopped.is_set() and time.time() - start < 300
    assert summary["env_steps"] == 16000 and summary["iterations"] == 5
    assert summary["worker_restarts"] >= 1 and summary["lost_env_steps"] > 0, summary
    assert [n["NodeID"] for n in ray.nodes() if n["Alive"]] == [by_resource["head"]]
    assert json.loads((tmp_path / "cluster" / "summary.json").read_text())["worker_restarts"] >= 1
