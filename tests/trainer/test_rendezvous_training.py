"""Real torchrun agents around the rendezvous store served outside the workers (issue #48, point 1).

Two nodes, each the launcher's own agent (``build_launch_config`` from the pod's environment,
``in_place_agent``: ranks that lost a peer are restarted, any other failure ends the node), ranks on
gloo. Worker 0's node is SIGKILLed mid-run, agent and ranks, as a lost pod's are. With the store served
by ``python -m rljob_trainer.rendezvous`` (``RLJOB_RDZV_HOST=0``), worker 1's agent restarts its ranks
and meets a new worker 0 in the store's next round, and both finish. With the store in worker 0's agent
(today's default), worker 1's rendezvous dies with it and worker 1's node fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rljob_contract import pod as contract

from tests.cluster.waiting import wait_for
from tests.support.operator_process import free_port

pytestmark = pytest.mark.trainer

#: One rank per node: all-reduces a one until STEPS are done; a lost peer is exit EXIT_PEER_LOST.
RANK = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"round: rank {rank} of {world}", flush=True)
for step in range(int(os.environ["STEPS"])):
    total = torch.ones(1)
    try:
        dist.all_reduce(total)
    except Exception as e:  # as the worker does: the code left for the agent, then out (gloo may abort an exit)
        print(f"lost a peer at step {step}: {type(e).__name__}", flush=True)
        with open(os.path.join(os.environ["RLJOB_ERROR_DIR"], f"rank-{os.environ['RANK']}.exit"), "w") as f:
            f.write(os.environ["PEER_LOST"])
        os._exit(int(os.environ["PEER_LOST"]))
    assert total.item() == world
    time.sleep(0.1)
print(f"done: rank {rank} of {world}", flush=True)
dist.destroy_process_group()
"""

#: One node: the launcher's LaunchConfig from the pod's environment, its in-place agent.
NODE = """
import os, sys, tempfile
from rljob_trainer.launch import NodeSettings, build_launch_config, in_place_agent
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as launch() sets it with in-place restarts
os.environ["RLJOB_ERROR_DIR"] = errors = tempfile.mkdtemp()  # where the ranks leave their exit codes
node = NodeSettings.from_env(default_nproc=1)
config, _ = build_launch_config(LaunchConfig, node, 10)
with in_place_agent(errors, lambda: None):
    elastic_launch(config, sys.executable)(sys.argv[1])
print("node done", flush=True)
"""


def _start_node(tmp_path: Path, name: str, rank: int, rdzv: str, external: bool) -> subprocess.Popen[bytes]:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "node.py").write_text(NODE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLJOB_")}
    env.update({contract.NNODES_ENV: "2", contract.NODE_RANK_ENV: str(rank), contract.RDZV_ENDPOINT_ENV: rdzv,
                contract.RUN_ID_ENV: "rdzv-g0", contract.IN_PLACE_RESTARTS_ENV: "3", contract.RDZV_TIMEOUT_ENV: "120",
                "STEPS": "150", "PEER_LOST": str(contract.EXIT_PEER_LOST), "CUDA_VISIBLE_DEVICES": ""})
    if external:
        env[contract.RDZV_HOST_ENV] = "0"
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it; closed with the test's folder
    return subprocess.Popen([sys.executable, str(tmp_path / "node.py"), str(tmp_path / "rank.py")], env=env,
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a node and every process under it (its agent and ranks), as a lost pod's."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        p.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text(errors="replace")


@pytest.mark.parametrize("external", [True, False], ids=["store-outside-the-workers", "store-in-worker-0"])
def test_losing_worker_0_costs_one_node_only_when_the_store_is_served_outside_the_workers(
        tmp_path: Path, external: bool) -> None:
    port = free_port()
    rdzv = f"127.0.0.1:{port}"
    store = subprocess.Popen([sys.executable, "-m", contract.RENDEZVOUS_MODULE, "--port", str(port)]) \
        if external else None
    nodes = {"worker-0": _start_node(tmp_path, "worker-0", 0, rdzv, external)}
    time.sleep(0 if external else 2)  # worker 0 hosts the store: let it listen first
    nodes["worker-1"] = _start_node(tmp_path, "worker-1", 1, rdzv, external)
    try:
        wait_for(lambda: "round: rank" in _log(tmp_path, "worker-0") and "round: rank" in _log(tmp_path, "worker-1"),
                 120, message="both nodes' ranks running")
        time.sleep(1)
        _kill_tree(nodes["worker-0"])
        if not external:
            assert nodes["worker-1"].wait(timeout=180) != 0, _log(tmp_path, "worker-1")
            return
        nodes["worker-0-new"] = _start_node(tmp_path, "worker-0-new", 0, rdzv, external)
        codes = {name: nodes[name].wait(timeout=300) for name in ("worker-1", "worker-0-new")}
        survivor, replacement = _log(tmp_path, "worker-1"), _log(tmp_path, "worker-0-new")
        assert codes == {"worker-1": 0, "worker-0-new": 0}, survivor[-3000:] + replacement[-3000:]
        # The survivor's node ran two rounds (its ranks restarted, the agent never ended) and finished
        # with the replacement, as a gang of two.
        assert survivor.count("round: rank") == 2 and "node done" in survivor, survivor[-3000:]
        assert "done: rank" in survivor and "of 2" in survivor.rsplit("round: rank", 1)[1]
        assert "done: rank" in replacement and "node done" in replacement
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                _kill_tree(proc)
        if store is not None:
            store.send_signal(signal.SIGTERM)
            assert store.wait(timeout=20) == 0
