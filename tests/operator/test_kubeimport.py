"""The Kubernetes client's packages imported name by name (``rljob_operator.kubeimport``): what the operator
loads is what it uses, and every name of the lazy packages is still the object the eager import gives."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from rljob_operator.kubeimport import PACKAGES

#: Libraries only the kubeconfig loader and the client's parts the operator does not use import.
UNUSED = ("google", "requests", "requests_oauthlib", "oauthlib", "cryptography", "websocket", "kubernetes.dynamic",
          "kubernetes.stream", "kubernetes.informer", "kubernetes.leaderelection", "kubernetes.config.kube_config")

_NAMES = textwrap.dedent("""
    import importlib, json, sys
    {prelude}
    out = {{}}
    for package in {packages!r}:
        module = importlib.import_module(package)
        for name in sorted({names!r}.get(package) or dir(module)):
            value = getattr(module, name)
            out[f"{{package}}.{{name}}"] = (getattr(value, "__name__", None) if isinstance(value, type(sys))
                                            else f"{{getattr(value, '__module__', None)}}.{{getattr(value, '__qualname__', repr(value))}}")
    print(json.dumps(out))
""")


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_the_operator_imports_only_the_client_parts_it_uses() -> None:
    """The runner, the in-cluster credentials, the REST client, the watch and the quantity parser: none of the
    kubeconfig loader's libraries, nor the client's other parts, are imported."""
    loaded = json.loads(_python(textwrap.dedent("""
        import json, sys
        import rljob_operator.cluster.runner
        from kubernetes.config import incluster_config
        from kubernetes.config import load_incluster_config, ConfigException
        import kubernetes.client.api_client, kubernetes.client.rest
        from kubernetes import client, watch
        from kubernetes.utils.quantity import parse_quantity
        assert client.ApiClient is kubernetes.client.api_client.ApiClient
        assert load_incluster_config is incluster_config.load_incluster_config
        print(json.dumps(sorted(sys.modules)))
    """)))
    assert "kubernetes.client.api_client" in loaded and "kubernetes.watch" in loaded
    unused = [m for m in loaded if m in UNUSED or m.startswith(tuple(f"{u}." for u in UNUSED))]
    assert unused == [], unused


def test_every_name_of_the_lazy_packages_is_what_the_eager_import_gives() -> None:
    """``dir()`` of each package as its own ``__init__`` makes it, then each of those names read through the lazy
    package: the same modules, classes and functions, including a name the ``__init__`` defines itself
    (``kubernetes.config.load_config``, which runs that ``__init__``)."""
    eager = json.loads(_python(_NAMES.format(prelude="", packages=PACKAGES, names={})))
    names: dict[str, list[str]] = {}
    for key in eager:
        package, _, name = key.rpartition(".")
        if not name.startswith("__"):
            names.setdefault(package, []).append(name)
    assert "load_config" in names["kubernetes.config"] and "client" in names["kubernetes"]
    lazy = json.loads(_python(_NAMES.format(prelude="import rljob_operator", packages=PACKAGES, names=names)))
    expected = {k: v for k, v in eager.items() if not k.rpartition(".")[2].startswith("__")}
    assert lazy == expected


def test_a_name_neither_package_has_is_an_attribute_error() -> None:
    out = _python(textwrap.dedent("""
        import rljob_operator, kubernetes, kubernetes.config
        for module, name in ((kubernetes, "no_such_name"), (kubernetes.config, "load_nothing")):
            try:
                getattr(module, name)
            except AttributeError as e:
                print(e)
        print(kubernetes.__version__)
    """)).splitlines()
    assert out[0] == "module 'kubernetes' has no attribute 'no_such_name'"
    assert out[1] == "module 'kubernetes.config' has no attribute 'load_nothing'"
    assert out[2].count(".") >= 1  # a constant of the __init__, read without running it
