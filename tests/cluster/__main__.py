"""``python -m tests.cluster up|down|status``: the dev cluster behind `make dev-cluster`.

``up`` starts a detached control plane in ``.dev-cluster/`` (admin kubeconfig at
``.dev-cluster/kubeconfig``) and returns; ``down`` stops it and removes the
folder; ``status`` says what runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.cluster import realnode, registry
from tests.cluster.binaries import REPO_ROOT
from tests.cluster.controlplane import ClusterConfig, ControlPlane
from tests.cluster.nodes import GpuNodeShape

DEFAULT_WORKDIR = REPO_ROOT / ".dev-cluster"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="state folder (default: .dev-cluster)"
    )
    parser.add_argument("--gpu-nodes", type=int, default=4, help="fake GPU nodes to create (default: 4)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node (default: 8)")
    parser.add_argument("--kueue", action="store_true", help="start Kueue too (its CRDs, webhooks and manager)")
    parser.add_argument("--real-node", action="store_true",
                        help="add one real node (containerd, kubelet, kube-proxy, CoreDNS; needs root), with the "
                             f"local images {', '.join(realnode.DEV_IMAGES)} loaded when podman has them")
    parser.add_argument("--registry", action="store_true",
                        help="start an OCI registry (plain HTTP on 127.0.0.1; the real node pulls from it): "
                             "`make release REGISTRY=<printed address>/rljob PLAIN_HTTP=1` pushes to it")
    args = parser.parse_args(argv)

    if args.command == "down":
        stopped = ControlPlane.down(args.workdir)
        print("dev cluster stopped" if stopped else "no dev cluster was running")
        return 0

    state = ControlPlane.describe(args.workdir)
    if args.command == "status":
        if state is None:
            print("no dev cluster")
            return 1
        for name, running in state["processes"].items():
            print(f"{name:25} {'running' if running else 'STOPPED'}")
        print(f"server: {state['server']}\nkubeconfig: {args.workdir / 'kubeconfig'}")
        if state.get("registry"):
            print(f"registry: {state['registry']} (plain HTTP)")
        return 0 if all(state["processes"].values()) else 1

    if state is not None and state["processes"] and all(state["processes"].values()):
        print(f"dev cluster already running: {state['server']}")
        print(f"export KUBECONFIG={args.workdir / 'kubeconfig'}")
        return 0
    images = realnode.existing_images(realnode.DEV_IMAGES) if args.real_node else ()
    config = ClusterConfig(gpu_nodes=args.gpu_nodes, node_shape=GpuNodeShape(gpus=args.gpus_per_node),
                           kueue=args.kueue, real_node=args.real_node, real_node_images=images,
                           registry=args.registry)
    started = time.monotonic()
    plane = ControlPlane(args.workdir, config, detached=True).start()
    print(
        f"dev cluster up in {time.monotonic() - started:.1f}s: {plane.server}, "
        f"{args.gpu_nodes} fake GPU nodes"
        f"{f', Kueue (ready to admit in {plane.kueue_start_seconds:.1f}s)' if plane.kueue_start_seconds else ''}"
        f"{_real_node_line(plane, images)}\n"
        f"{_registry_line(plane)}"
        f"export KUBECONFIG={plane.admin_kubeconfig}\n"
        f"logs: {plane.logs_dir}"
    )
    return 0


def _registry_line(plane: ControlPlane) -> str:
    if plane.registry_address is None:
        return ""
    return (f"registry: {plane.registry_address} (plain HTTP; the real node pulls from it): "
            f"make release REGISTRY={plane.registry_address}/{registry.NAMESPACE} PLAIN_HTTP=1\n")


def _real_node_line(plane: ControlPlane, images: tuple[str, ...]) -> str:
    if plane.real_node is None:
        return ""
    steps = ", ".join(f"{step} {seconds:.1f}s" for step, seconds in plane.real_node_start_seconds.items())
    return (f", real node {realnode.NODE_NAME} at {plane.real_node.gateway} ({steps}; "
            f"images: base{''.join(', ' + image for image in images)}; imported "
            f"{len(plane.real_node_images['imported'])}, kept {len(plane.real_node_images['kept'])} from earlier nodes)")


if __name__ == "__main__":
    sys.exit(main())
