"""Admission gates: what decides, outside the operator, when a job's gang may run (one folder each).

``gate.py`` is the pure protocol the decisions speak, ``client.py`` what the cluster layer needs
of a gate, ``registry.py`` the gates the operator knows; ``kueue/`` is the first gate.
"""
