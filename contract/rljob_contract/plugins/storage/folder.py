"""A folder: a local path or a mounted volume (the default, and any location without a registered scheme)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rljob_contract.plugins.storage.base import StorageBackend

#: Any ``scheme://`` prefix: a location with a scheme no backend registered is refused, not taken as a folder.
SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class FolderBackend(StorageBackend):
    """Files copied and MD5-verified; whether they outlive the pods depends on the volume the path is on
    (``decisions/checkpoints.durability`` looks). ``known``: the registry's backends by scheme, which
    the refusal of any other scheme lists."""

    def __init__(self, known: Mapping[str, StorageBackend]) -> None:
        self.known = known

    def check(self, uri: str) -> str:
        if SCHEME_RE.match(uri):
            forms = ", ".join(b.form for b in self.known.values())
            raise ValueError(f"{uri!r}: use {forms} or a local path")
        return uri
