"""The table of operator settings, rendered from their declarations (``settings.py``).

``tools/gen_docs.py`` writes it into ``docs/reference/operator-settings.md`` (``make generate``);
``tests/delivery/test_docs.py`` checks the page is current, ``tests/operator/test_settings.py`` what it says.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rljob_operator.settings import BY_CHART, OperatorSettings, SettingInfo, env_name, env_text


def _default(f: dataclasses.Field[Any], info: SettingInfo) -> str:
    if info.shown_default is not None:
        return f"`{info.shown_default}`"
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    text = env_text(value)
    return f"`{text}`" if text else "(empty)"


def markdown_cell(text: str) -> str:
    """One line of Markdown: ``code`` as `code`, and <placeholders> outside code escaped (not HTML)."""
    parts = re.sub(r"\s+", " ", text).replace("``", "`").replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def table() -> str:
    """The Markdown table of every setting: variable, flag, chart value, default, meaning."""
    rows = ["| Variable | Flag | Chart value | Default | Meaning |", "| --- | --- | --- | --- | --- |"]
    for f in dataclasses.fields(OperatorSettings):
        info: SettingInfo = f.metadata["setting"]
        chart = "set by the chart" if info.chart == BY_CHART else f"`{info.chart}`" if info.chart else "—"
        flag = f"`{info.flag.name}`" if info.flag else "—"
        rows.append(f"| `{env_name(f.name)}` | {flag} | {chart} | {markdown_cell(_default(f, info))} "
                    f"| {markdown_cell(info.help)} |")
    return "\n".join(rows) + "\n"
