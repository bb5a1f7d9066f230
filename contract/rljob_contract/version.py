"""rljob's version: pyproject.toml's ``[project] version``, written here by ``make generate``
(``tools/gen_version.py``), so code that runs from the source folders (the images) knows it without
package metadata. The chart, the images' tags and the CRDs' ``app.kubernetes.io/version`` label carry
the same number; ``tests/delivery/test_version.py`` fails on drift."""

VERSION = "0.1.0"
