"""The README stays true: every manifest field is documented, and the two commands exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rljob_contract.job import RLTrainingJobSpec

REPO = Path(__file__).resolve().parents[2]


def field_names(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set()
    for name, info in model.model_fields.items():
        names.add(info.alias or name)
        for sub in _models_in(info.annotation):
            names |= field_names(sub, seen)
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out += _models_in(arg)
    return out


def test_readme_manifest_reference_names_every_spec_field() -> None:
    readme = (REPO / "README.md").read_text()
    reference = readme.split("## Manifest reference", 1)[1]
    missing = sorted(n for n in field_names(RLTrainingJobSpec) if not re.search(rf"\b{re.escape(n)}\b", reference))
    assert not missing, f"README's manifest reference lacks: {missing}"


def test_readme_commands_exist_as_make_targets() -> None:
    readme = (REPO / "README.md").read_text()
    makefiles = (REPO / "Makefile").read_text() + "".join(p.read_text() for p in (REPO / "mk").glob("*.mk"))
    for target in sorted(set(re.findall(r"make ([a-z][a-z-]+)", readme))):
        assert re.search(rf"^{target}:", makefiles, re.M), f"README mentions `make {target}`, no such target"
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")


def test_readme_and_docs_link_only_files_inside_the_repository() -> None:
    """A person who clones the repository has nothing beside it: every relative link resolves inside it."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(REPO), f"{doc.name} links {target}, outside the repository"
            assert resolved.exists(), f"{doc.name} links {target}, which does not exist"


def test_readme_experiment_reference_names_every_experiment_spec_field() -> None:
    from rljob_contract.experiment import RLExperimentSpec

    readme = (REPO / "README.md").read_text()
    reference = readme.split("### RLExperiment", 1)[1].split("\n## ", 1)[0]
    fields = field_names(RLExperimentSpec) - field_names(RLTrainingJobSpec) | {"template"}
    missing = sorted(n for n in fields if not re.search(rf"\b{re.escape(n)}\b", reference))
    assert not missing, f"README's RLExperiment reference lacks: {missing}"
