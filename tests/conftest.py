"""Shared pytest setup: the control-plane plugin (tests/cluster) and the trainer's helpers."""

pytest_plugins = ["tests.cluster.fixtures"]
