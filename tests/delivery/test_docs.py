"""The docs stay true: links and anchors resolve, named paths exist, the generated reference is current
and names every field, the README is short and its commands are make targets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel
from rljob_contract.experiment import RLExperimentSpec
from rljob_contract.job import RLTrainingJobSpec
from rljob_contract.runtime import RuntimeSpec

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
#: The pages a reader of the repository walks: the README, every page under docs/, the other READMEs.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
         REPO / "charts/rljob/README.md", REPO / "manifests/README.md", REPO / "bench/README.md"]
#: The pages whose `code` paths are this repository's (bench/README.md also names paths in other modules).
OURS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: Top-level folders whose paths the docs name in `code`.
TOP = ("bench", "charts", "contract", "crds", "docs", "examples", "manifests", "operator", "rljob", "tests",
       "tools", "trainer")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their lines are commands and YAML, not links or headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case; punctuation but - and _ dropped; spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``, repeats numbered -1, -2 as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), re.M):
        anchor = github_anchor(heading)
        out.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return out


def links(page: Path) -> Iterator[tuple[str, str]]:
    """(target, anchor) of every Markdown link and image on ``page``, outside code."""
    text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        yield path, anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_to_a_file_of_the_repository_and_its_heading(page: Path) -> None:
    """A person who clones the repository has nothing beside it: no link leaves it, each names a file
    that exists, and an anchor names a heading of that file."""
    for path, anchor in links(page):
        assert not re.match(r"[a-z]+:", path), f"{page.name} links {path}: outside the repository"
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(REPO), f"{page.name} links {path}, outside the repository"
        assert resolved.exists(), f"{page.name} links {path}, which does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name} links {path}#{anchor}: no such heading"


def named_paths(page: Path) -> Iterator[str]:
    """The repository paths ``page`` names in `code` outside code blocks (tests with ``::test_name``)."""
    for span in re.findall(r"`([^`\n]+)`", prose(page.read_text())):
        if re.match(rf"({'|'.join(TOP)})/[\w./:-]*$", span) and "…" not in span:
            yield span


@pytest.mark.parametrize("page", OURS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_and_test_the_docs_name_exists(page: Path) -> None:
    for span in named_paths(page):
        path, _, test = span.partition("::")
        assert (REPO / path.rstrip(".,")).exists(), f"{page.name} names {path}, which does not exist"
        if test:
            source = (REPO / path).read_text()
            assert re.search(rf"def {re.escape(test)}\b", source), f"{page.name} names {span}: no such test"


def test_the_checker_finds_anchors_paths_and_links_as_github_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Security: what a job creator can and cannot do\n## A real node (`make e2e`)\n## Notes\n"
                    "## Notes\n```console\n# not a heading [x](nowhere.md)\n```\n"
                    "See [a](other.md#x) and `tests/delivery/test_docs.py::test_x` and `[b](c.md)`.\n")
    assert anchors(page) == {"security-what-a-job-creator-can-and-cannot-do", "a-real-node-make-e2e", "notes",
                             "notes-1"}
    assert list(links(page)) == [("other.md", "x")]
    assert list(named_paths(page)) == ["tests/delivery/test_docs.py::test_x"]


# ------------------------------------------------------------------------------- the reference


@cache
def gen_docs() -> ModuleType:
    """``tools/gen_docs.py``."""
    return load_script(REPO / "tools" / "gen_docs.py")


@cache
def rendered() -> dict[Path, str]:
    pages: dict[Path, str] = gen_docs().rendered()
    return pages


def test_every_generated_page_is_current() -> None:
    for path, text in rendered().items():
        assert path.exists(), f"{path.relative_to(REPO)} is missing: run 'make generate'"
        assert path.read_text() == text, f"{path.relative_to(REPO)} drifted from the code: run 'make generate'"
    listed = {p.name for p in (REPO / "docs/reference").glob("*.md")}
    assert listed == {p.name for p in rendered()}, "docs/reference/ holds a page no generator writes"


def test_check_mode_reports_a_stale_page_and_writing_fixes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    module = gen_docs()
    pages = rendered()  # before the patch below: rendered() asks the module, whose rendered is then the patch
    monkeypatch.setattr(module, "REPO", tmp_path)
    monkeypatch.setattr(module, "REFERENCE", tmp_path / "docs" / "reference")
    monkeypatch.setattr(module, "rendered", lambda: {tmp_path / "docs/reference" / p.name: t
                                                     for p, t in pages.items()})
    assert module.main(["--check"]) == 1
    assert "docs/reference/cli.md: drifted from its source: run 'make generate'" in capsys.readouterr().err
    assert module.main([]) == 0 and module.main(["--check"]) == 0
    stale = tmp_path / "docs/reference/metrics.md"
    stale.write_text(stale.read_text().replace("rljob_trainer_eval", "rljob_trainer_evaluation"))
    assert module.main(["--check"]) == 1 and "metrics.md" in capsys.readouterr().err


def field_paths(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """Every field path of ``model`` by the names a manifest uses (lists as ``[]``)."""
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        yield path
        for sub, suffix in _models_in(info.annotation):
            yield from field_paths(sub, path + suffix)


def _models_in(annotation: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, suffix)]
    origin = getattr(annotation, "__origin__", None)
    inner = "[]" if origin is list else "{}" if origin is dict else ""
    return [m for arg in getattr(annotation, "__args__", ()) or () for m in _models_in(arg, suffix + inner)]


@pytest.mark.parametrize(("model", "page", "stop"), [
    (RLTrainingJobSpec, "rltrainingjob.md", None),
    (RLExperimentSpec, "rlexperiment.md", "spec.template."),
    (RuntimeSpec, "rltrainingruntime.md", None),
])
def test_the_reference_names_every_field_of_the_models(model: type[BaseModel], page: str, stop: str | None) -> None:
    text = (REPO / "docs/reference" / page).read_text()
    missing = [p for p in field_paths(model, "spec") if not (stop and p.startswith(stop)) and f"`{p}`" not in text]
    assert not missing, f"docs/reference/{page} lacks {missing}"


def test_the_metrics_page_shows_each_series_labels() -> None:
    """prometheus_client has no public accessor for label names: the generator reads them, and this
    holds it to labels the code declares."""
    text = (REPO / "docs/reference/metrics.md").read_text()
    assert "| `rljob_operator_gang_restarts_total` | counter | `reason` |" in text
    assert "| `rljob_operator_job_phase` | gauge | `namespace`, `job`, `phase` |" in text
    assert "| `rljob_trainer_eval` | gauge | `metric` |" in text


# ---------------------------------------------------------------------------------- the README


def test_readme_is_short_and_names_what_it_takes() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    for heading in ("## Prerequisites", "## Two commands", "## Try it locally", "## Install it on a cluster",
                    "## Develop it"):
        assert heading in readme
    for needed in ("x86-64", "Python 3.11", "Go 1.26", "root", "Kubernetes 1.30", "GiB"):
        assert needed in readme.split("## Two commands")[0], needed
    assert "make demo" in readme and "make test" in readme


def test_make_commands_in_the_docs_are_make_targets() -> None:
    makefiles = (REPO / "Makefile").read_text() + "".join(p.read_text() for p in (REPO / "mk").glob("*.mk"))
    for page in PAGES:
        text = page.read_text()
        commands = re.findall(r"`make ([a-z][a-z-]+)", text) + re.findall(r"^make ([a-z][a-z-]+)", text, re.M)
        for target in sorted(set(commands)):
            assert re.search(rf"^{target}:", makefiles, re.M), f"{page.name} mentions `make {target}`: no such target"
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")
