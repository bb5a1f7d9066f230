"""Regenerate the results table in bench/README.md from bench/results/*.json."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import RESULTS

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def table() -> str:
    lines = ["| benchmark | metric | value | target | met | measured |", "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        rows = data.get("summary", [])
        if not isinstance(rows, list):  # a benchmark's own summary shape (watch_cost.py's): not table rows
            continue
        for row in rows:
            met = row.get("met")
            lines.append(
                f"| {data['benchmark']} | {row['metric']} | {row['value']} {row.get('unit', '')} "
                f"| {row.get('target', '')} | {'yes' if met else ('no' if met is False else '')} "
                f"| {data.get('measured_at', '')[:10]} |"
            )
    return "\n".join(lines)


def main() -> None:
    text = README.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    README.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")
    print(f"updated {README}")


if __name__ == "__main__":
    main()
