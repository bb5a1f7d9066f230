#!/usr/bin/env python3
"""Follow a decision's context through the code: the functions it reaches, in order, and their modules.

    python tools/context_walk.py                         # plan_failure's ctx, the whole walk
    python tools/context_walk.py --summary               # only the turns per module
    python tools/context_walk.py rljob_operator.decisions.lifecycle:progress ctx
    python tools/context_walk.py --root /tmp/old/operator rljob_operator.decisions.failures:plan_failure

A reader follows a parameter (``ctx``) into every call that receives it, or a value made from it
(``job = ctx.job``, ``seen = observe(ctx)``), and on into the callee's parameter: depth first, in the
order Python evaluates the calls, each function read once (later calls are listed, not read again).
Printed: the path (the modules in reading order, a run of one as one entry) and, per module, how
often the reader turns to it (its runs in that order).
A decision whose steps are each in one module turns to each once; one split by noun across two
modules makes its reader go back and forth (issue #44 point 3: ``plan_failure`` turned to failures.py
5 times, restarts.py 4 and plan.py 4). Counted twice: with the Situation's derived values
(``ctx.current``) as functions of situation.py, and as the context itself (reading one, and what it
computes, turns to no module).

Static (the AST, nothing imported): a call is resolved through the module's own functions, its
``from ... import`` names (those under ``if TYPE_CHECKING`` too) and the methods of a parameter
annotated with a class of the package, or of a value a call annotated to return one.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "rljob_operator.decisions"
SKIP_DECORATED = ("staticmethod",)


@dataclass
class Module:
    name: str
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, dict[str, ast.FunctionDef]] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Local name → (module, name) for ``from X import name``."""


def load(root: Path, package: str) -> dict[str, Module]:
    """Every module of ``package`` (a folder under ``root``) by dotted name."""
    base = root / package.replace(".", "/")
    modules: dict[str, Module] = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = _index(name, ast.parse(path.read_text(encoding="utf-8")))
    return modules


def _index(name: str, tree: ast.Module) -> Module:
    module = Module(name)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        elif isinstance(node, ast.ImportFrom) and node.module:
            _imported(module, node)
        elif isinstance(node, ast.If):  # if TYPE_CHECKING: imports for annotations
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    _imported(module, inner)
    return module


def _imported(module: Module, node: ast.ImportFrom) -> None:
    for alias in node.names:
        module.imports[alias.asname or alias.name] = (node.module or "", alias.name)


@dataclass
class Step:
    depth: int
    module: str
    function: str
    expanded: bool
    derived: bool = False
    """A value derived from the context, read as an attribute (``ctx.current``)."""


@dataclass
class Walk:
    modules: dict[str, Module]
    steps: list[Step] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def function(self, module: str, name: str, tracked: dict[str, str | None], depth: int = 0,
                 derived: bool = False) -> None:
        """Walk ``module.name`` (a function, or ``Class.method``) with ``tracked`` parameters (name → class)."""
        node = self._lookup(module, name)
        key = (module, name)
        expand = node is not None and key not in self.seen
        self.steps.append(Step(depth, module, name, expand, derived))
        if not expand:
            return
        assert node is not None
        self.seen.add(key)
        scope = Scope(self, module, dict(tracked), depth + 1, name.split(".")[0] if "." in name else None)
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.arg in scope.tracked and scope.tracked[arg.arg] is None:
                scope.tracked[arg.arg] = _annotation(arg.annotation)
        for statement in node.body:
            scope.statement(statement)

    def _lookup(self, module: str, name: str) -> ast.FunctionDef | None:
        m = self.modules.get(module)
        if m is None:
            return None
        if "." in name:
            cls, method = name.split(".", 1)
            return m.classes.get(cls, {}).get(method)
        return m.functions.get(name)

    def resolve(self, module: str, name: str) -> tuple[str, str] | None:
        """(module, function or Class) that ``name`` means in ``module``, within the walked package."""
        m = self.modules[module]
        if name in m.functions or name in m.classes:
            return module, name
        if name in m.imports:
            source, original = m.imports[name]
            if source in self.modules:
                return self.resolve(source, original)
        return None

    def class_of(self, module: str, annotation: str | None) -> tuple[str, str] | None:
        if annotation is None:
            return None
        found = self.resolve(module, annotation)
        return found if found is not None and annotation in self.modules[found[0]].classes else None


def _annotation(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split("|")[0].strip()
    if isinstance(node, ast.BinOp):  # X | None
        return _annotation(node.left)
    return None


class Scope:
    """One function's body: the names that carry the context, and the calls they reach."""

    def __init__(self, walk: Walk, module: str, tracked: dict[str, str | None], depth: int, cls: str | None) -> None:
        self.walk, self.module, self.tracked, self.depth, self.cls = walk, module, tracked, depth, cls

    def carries(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.tracked for n in ast.walk(node))

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = node.value
            if value is not None:
                self.expression(value)
                if self.carries(value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    kind = self._type_of(value)
                    for name in (n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                        self.tracked.setdefault(name.id, kind)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.statement(child)
            elif isinstance(child, ast.expr):
                self.expression(child)
            else:
                for grandchild in ast.iter_child_nodes(child):
                    if isinstance(grandchild, ast.stmt):
                        self.statement(grandchild)
                    elif isinstance(grandchild, ast.expr):
                        self.expression(grandchild)

    def expression(self, node: ast.expr) -> None:
        """Calls and derived attributes of ``node`` in evaluation order (arguments before the call)."""
        if isinstance(node, ast.Lambda):
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child)
            elif isinstance(child, ast.comprehension):
                self.expression(child.iter)
                for cond in child.ifs:
                    self.expression(cond)
            elif isinstance(child, ast.keyword):
                self.expression(child.value)
        if isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            self._attribute(node)

    def _call(self, node: ast.Call) -> None:
        args = [*node.args, *(k.value for k in node.keywords)]
        target = self._callee(node.func)
        if target is None:
            return
        module, name, receiver = target
        if not (receiver or any(self.carries(a) for a in args)):
            return
        m = self.walk.modules[module]
        if name in m.classes:  # a constructor: its __init__ or __post_init__, when the class writes one
            init = next((f for f in ("__init__", "__post_init__") if f in m.classes[name]), None)
            if init is None:
                return
            name = f"{name}.{init}"
        params = self._parameters(module, name)
        tracked: dict[str, str | None] = {p: None for p, a in zip(params, args, strict=False) if self.carries(a)}
        tracked.update({k.arg: None for k in node.keywords if k.arg and self.carries(k.value)})
        if receiver:
            tracked["self"] = None
        self.walk.function(module, name, tracked, self.depth)

    def _callee(self, func: ast.expr) -> tuple[str, str, bool] | None:
        if isinstance(func, ast.Name):
            found = self.walk.resolve(self.module, func.id)
            return (found[0], found[1], False) if found else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.tracked:
            cls = self._class_of_name(func.value.id)
            if cls is not None and func.attr in self.walk.modules[cls[0]].classes[cls[1]]:
                return cls[0], f"{cls[1]}.{func.attr}", True
        return None

    def _attribute(self, node: ast.Attribute) -> None:
        """``ctx.current``: a derived value (a decorated method read as an attribute) is a call too."""
        if not (isinstance(node.value, ast.Name) and node.value.id in self.tracked):
            return
        cls = self._class_of_name(node.value.id)
        if cls is None:
            return
        method = self.walk.modules[cls[0]].classes[cls[1]].get(node.attr)
        if method is not None and method.decorator_list and not any(
                isinstance(d, ast.Name) and d.id in SKIP_DECORATED for d in method.decorator_list):
            self.walk.function(cls[0], f"{cls[1]}.{node.attr}", {"self": None}, self.depth, derived=True)

    def _class_of_name(self, name: str) -> tuple[str, str] | None:
        if name == "self" and self.cls is not None:
            return self.module, self.cls
        return self.walk.class_of(self.module, self.tracked.get(name))

    def _parameters(self, module: str, name: str) -> list[str]:
        node = self.walk._lookup(module, name)
        if node is None:
            return []
        params = [a.arg for a in node.args.args]
        return params[1:] if "." in name and params[:1] == ["self"] else params

    def _type_of(self, value: ast.expr) -> str | None:
        """The class a call returns, from its annotation (``d = ctx.draft()`` → StatusDraft)."""
        if not isinstance(value, ast.Call):
            return None
        target = self._callee(value.func)
        if target is None:
            return None
        module, name, _ = target
        if name in self.walk.modules[module].classes:
            return name
        node = self.walk._lookup(module, name)
        return _annotation(node.returns) if node is not None else None


def reading_order(steps: list[Step], derived: bool = True) -> list[str]:
    """The modules of the functions read, in the walk's order, each function once. ``derived=False``: a
    value derived from the context (``ctx.current``) is the context itself: reading it, and what it
    computes, is reading no module."""
    read: list[str] = []
    skip_below = None
    for step in steps:
        if skip_below is not None and step.depth > skip_below:
            continue
        skip_below = None
        if not derived and step.derived:
            skip_below = step.depth
        elif step.expanded:
            read.append(step.module)
    return read


def path(steps: list[Step], derived: bool = True) -> list[str]:
    """The modules in reading order, a run of one module as one entry: the turns a reader takes."""
    read = reading_order(steps, derived)
    return [m for i, m in enumerate(read) if i == 0 or read[i - 1] != m]


def visits(steps: list[Step], derived: bool = True) -> Counter[str]:
    """How often a reader turns to each module: its runs in the reading order."""
    return Counter(path(steps, derived))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("start", nargs="?", default=f"{PACKAGE}.failure:plan_failure",
                        help="module:function to start from")
    parser.add_argument("parameter", nargs="?", default="ctx", help="the parameter to follow")
    parser.add_argument("--root", type=Path, default=REPO / "operator", help="the folder the package is in")
    parser.add_argument("--summary", action="store_true", help="only the turns per module")
    args = parser.parse_args(argv)
    module, function = args.start.split(":")
    walk = Walk(load(args.root, PACKAGE))
    if module not in walk.modules:
        parser.error(f"{module}: no such module under {args.root}")
    walk.function(module, function, {args.parameter: None})
    short = {m: m.removeprefix(PACKAGE + ".") for m in walk.modules}
    if not args.summary:
        for step in walk.steps:
            print(f"{'  ' * step.depth}{short[step.module]}.{step.function}{'' if step.expanded else '  (again)'}")
    for label, derived in (("derived values as situation.py's", True), ("derived values as the context", False)):
        print(f"turns, {label}:", ", ".join(f"{short[m]} {n}" for m, n in visits(walk.steps, derived).most_common()))
    print("path, derived values as the context:", " → ".join(short[m] for m in path(walk.steps, False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
