"""The documentation site builds with Sphinx's warnings as errors, every page included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def public_names() -> list[str]:
    """``pymc_bigdata.__all__``, read from the source (no import of PyMC in this process)."""
    tree = ast.parse((ROOT / "pymc_bigdata" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("pymc_bigdata/__init__.py defines no __all__")


def test_docs_build_without_warnings(tmp_path):
    """`sphinx-build -W --keep-going -b html docs` succeeds; the API page documents every
    public name and every notebook of notebooks/ has its page."""
    out = tmp_path / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html"]
    command += ["-d", str(tmp_path / "doctrees"), str(DOCS), str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr

    assert (out / "index.html").is_file()
    api = out / "api.html"
    assert api.is_file()
    html = api.read_text(encoding="utf-8")
    missing = [name for name in public_names() if f'id="pymc_bigdata.{name}"' not in html]
    assert not missing, f"public names without an entry in docs/api.md: {missing}"

    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    for notebook in notebooks:
        assert (out / "_notebooks" / f"{notebook.stem}.html").is_file(), notebook.name
