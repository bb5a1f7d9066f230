"""Real torchrun agents losing the node that hosts the rendezvous store (issue #48, point 1).

Two nodes, each the launcher's own agent (``build_launch_config`` from the pod's environment,
``in_place_agent``: ranks that lost a peer are restarted, any other failure ends the node, and
``run_redialling``), ranks on gloo. Worker 0's node, whose agent hosts the c10d store, is SIGKILLed
mid-run, agent and ranks, as a lost pod's are. Worker 1's agent ends with the store; its launcher runs it
again, dialling the same endpoint until a new worker 0 hosts a store there, and the two finish as a gang:
worker 0's loss costs one node, not the gang.
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
from rljob_trainer.launch import NodeSettings, Rounds, build_launch_config, in_place_agent, run_redialling
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as launch() sets it with in-place restarts
os.environ["RLJOB_ERROR_DIR"] = errors = tempfile.mkdtemp()  # where the ranks leave their exit codes
node = NodeSettings.from_env(default_nproc=1)
config, _ = build_launch_config(LaunchConfig, node, 10)
rounds = Rounds()
with in_place_agent(errors, lambda: None, on_round=rounds.started):
    run_redialling(lambda: elastic_launch(config, sys.executable)(sys.argv[1]), node, rounds, lambda: None)
print(f"node done after {rounds.count} rounds", flush=True)
"""


def _start_node(tmp_path: Path, name: str, rank: int, rdzv: str) -> subprocess.Popen[bytes]:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "node.py").write_text(NODE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLJOB_")}
    env.update({contract.NNODES_ENV: "2", contract.NODE_RANK_ENV: str(rank), contract.RDZV_ENDPOINT_ENV: rdzv,
                contract.RUN_ID_ENV: "rdzv-g0", contract.IN_PLACE_RESTARTS_ENV: "3", contract.RDZV_TIMEOUT_ENV: "120",
                "STEPS": "150", "PEER_LOST": str(contract.EXIT_PEER_LOST), "CUDA_VISIBLE_DEVICES": ""})
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


def test_losing_worker_0_and_the_store_its_agent_hosts_costs_one_node_the_survivor_dials_the_replacement(
        tmp_path: Path) -> None:
    rdzv = f"127.0.0.1:{free_port()}"
    nodes = {"worker-0": _start_node(tmp_path, "worker-0", 0, rdzv)}
    time.sleep(2)  # worker 0 hosts the store: let it listen first
    nodes["worker-1"] = _start_node(tmp_path, "worker-1", 1, rdzv)
    try:
        wait_for(lambda: "round: rank" in _log(tmp_path, "worker-0") and "round: rank" in _log(tmp_path, "worker-1"),
                 120, message="both nodes' ranks running")
        time.sleep(1)
        _kill_tree(nodes["worker-0"])
        # The survivor's agent lost the store and its ranks their peer; its node keeps dialling.
        wait_for(lambda: "lost the rendezvous store" in _log(tmp_path, "worker-1"), 120, message="the store's loss")
        time.sleep(3)
        assert nodes["worker-1"].poll() is None, _log(tmp_path, "worker-1")[-3000:]
        nodes["worker-0-new"] = _start_node(tmp_path, "worker-0-new", 0, rdzv)
        codes = {name: nodes[name].wait(timeout=300) for name in ("worker-1", "worker-0-new")}
        survivor, replacement = _log(tmp_path, "worker-1"), _log(tmp_path, "worker-0-new")
        assert codes == {"worker-1": 0, "worker-0-new": 0}, survivor[-3000:] + replacement[-3000:]
        # The survivor's node ran two rounds (its agent ran again, the process never ended) and finished
        # with the replacement, as a gang of two.
        assert survivor.count("round: rank") == 2 and "node done after 2 rounds" in survivor, survivor[-3000:]
        assert "done: rank" in survivor and "of 2" in survivor.rsplit("round: rank", 1)[1]
        assert "done: rank" in replacement and "node done after 1 rounds" in replacement
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                _kill_tree(proc)
