"""The Kubernetes client's packages, imported on first use of a name rather than all at once.

``import kubernetes`` (which any ``kubernetes.<anything>`` runs first) imports every part of the client:
``config`` with its kubeconfig loader (requests, oauthlib, google-auth and cryptography for the auth
providers), ``dynamic``, ``stream`` (websockets), ``informer``, ``leaderelection``. The operator uses the
REST client, the in-cluster credentials, ``watch`` and ``utils.quantity``. Imported all at once they hold
about 17 MiB more in every replica, memory a deployed operator never reads (it has no kubeconfig).

:func:`install` puts ``kubernetes`` and ``kubernetes.config`` in ``sys.modules`` as what their
``__init__`` would make, without running it: each name their ``__init__`` imports (``from . import client``,
``from .kube_config import load_kube_config``) is imported on first use, as the client already does for its
models (``kubernetes.client.__getattr__``), and so is a submodule (``kubernetes.config.incluster_config``).
A name their ``__init__`` defines itself (``load_config``) runs the whole ``__init__`` on first use, so every
name still resolves to the same object as before.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import threading
from typing import Any

#: The packages made lazy, parents first.
PACKAGES = ("kubernetes", "kubernetes.config")


def install() -> None:
    """Make :data:`PACKAGES` lazy; nothing for a package already imported (its names are all there)."""
    for name in PACKAGES:
        if name not in sys.modules:
            _install(name)


def _exports(source: str, package: str) -> tuple[dict[str, tuple[str, str | None]], dict[str, Any]]:
    """What ``source`` (a package's ``__init__``) imports at its top level, ``{name: (module, attribute)}`` (no
    attribute: the name is that module), and the constants it assigns (``__version__``)."""
    imports: dict[str, tuple[str, str | None]] = {}
    constants: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            for alias in node.names:
                if node.module is None:  # ``from . import client``: a submodule
                    imports[alias.asname or alias.name] = (f"{base}.{alias.name}", None)
                else:
                    imports[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    return imports, constants


def _install(name: str) -> None:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # its parent is not installed (``pip install rljob`` without the operator's extra)
        return
    if spec is None or spec.origin is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed, or not a package: an import of it fails or works as it would have
    module = importlib.util.module_from_spec(spec)
    with open(spec.origin, encoding="utf-8") as f:
        imports, constants = _exports(f.read(), name)
    module.__dict__.update(constants)
    lock = threading.Lock()
    ran = [False]

    def run_init() -> None:
        """The package's own ``__init__``, once: for a name it defines itself."""
        with lock:
            if not ran[0]:
                ran[0] = True
                assert spec.loader is not None
                spec.loader.exec_module(module)

    def __getattr__(attribute: str) -> Any:
        found = imports.get(attribute)
        if found is not None:
            target, inner = found
            imported = importlib.import_module(target)
            value = imported if inner is None else getattr(imported, inner)
        elif attribute.startswith("__") or ran[0]:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        elif importlib.util.find_spec(f"{name}.{attribute}") is not None:  # a submodule its __init__ omits
            value = importlib.import_module(f"{name}.{attribute}")
        else:
            run_init()
            if attribute not in module.__dict__:
                raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
            value = module.__dict__[attribute]
        setattr(module, attribute, value)
        return value

    def __dir__() -> list[str]:
        return sorted(module.__dict__.keys() | imports.keys())

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


__all__ = ["PACKAGES", "install"]
