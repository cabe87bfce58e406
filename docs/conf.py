"""Sphinx configuration of the pymc-bigdata documentation site.

Build (warnings are errors, as in ``tests/test_docs.py``)::

    .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

Nothing is fetched at build time: no intersphinx, no remote images. The notebooks are not
executed here (the test suite runs them); the site renders the outputs stored in them.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout being built, installed or not

# -- Project -------------------------------------------------------------------------------

project = "pymc-bigdata"
author = "pymc-bigdata developers"
copyright = "pymc-bigdata developers"
try:
    release = _dist_version("pymc-bigdata")
except PackageNotFoundError:  # a plain checkout on sys.path
    release = "unknown"
version = ".".join(release.split(".")[:2])

# -- Notebooks: copied from ../notebooks at every build --------------------------------------
# The notebooks live in ``notebooks/`` (the test suite executes them there). Sphinx reads
# sources only under ``docs/``, so each build copies them into the git-ignored
# ``docs/_notebooks/``. A copy is rewritten only when its content changed (Sphinx rebuilds a
# page when its source's mtime moves), and copies of deleted notebooks are removed.

NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK_COPIES = DOCS / "_notebooks"

# Links in the notebooks' markdown that point from ``notebooks/`` into ``docs/``; from
# ``docs/_notebooks/`` the same pages are one folder up.
_LINK_REWRITES = {"](../docs/": "](../"}


def _rewrite_links(notebook: dict) -> dict:
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        for old, new in _LINK_REWRITES.items():
            text = text.replace(old, new)
        cell["source"] = text
    return notebook


def copy_notebooks(source: Path = NOTEBOOKS, target: Path = NOTEBOOK_COPIES) -> list[str]:
    """Copy ``source/*.ipynb`` into ``target`` (links into docs/ rewritten); return the names."""
    target.mkdir(exist_ok=True)
    names = []
    for path in sorted(source.glob("*.ipynb")):
        notebook = _rewrite_links(json.loads(path.read_text(encoding="utf-8")))
        text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
        copy = target / path.name
        if not copy.exists() or copy.read_text(encoding="utf-8") != text:
            # write then rename: a build running beside this one never reads half a file
            partial = copy.with_name(f".{path.name}.{os.getpid()}.tmp")
            partial.write_text(text, encoding="utf-8")
            partial.replace(copy)
        names.append(path.name)
    for stale in target.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    return names


copy_notebooks()

# -- Pages no toctree names: added to the user guide ---------------------------------------
# A glob in a toctree cannot do this: ``*`` would also match the pages of the other toctrees
# (and the root page), and a glob that matches nothing is itself a warning. So the user
# guide's toctree holds a marker line that ``setup()`` replaces, when the page is read, by
# every top-level page of docs/ that no toctree names: a page added to docs/ shows up in the
# user guide without an entry, whether or not such pages exist.

UNLISTED_PAGE = "guide"
UNLISTED_MARKER = "(pages of docs/ that no toctree names)"
_TOCTREE = re.compile(r"^(```+|:::+)\{toctree\}[^\n]*\n(.*?)^\1", re.MULTILINE | re.DOTALL)


def unlisted_pages(docs: Path = DOCS) -> list[str]:
    """Top-level ``*.md`` pages of ``docs`` (the root page apart) that no toctree names."""
    named: set[str] = set()
    pages = sorted(docs.glob("*.md"))
    for page in pages:
        for _, body in _TOCTREE.findall(page.read_text(encoding="utf-8")):
            named.update(line.strip().removesuffix(".md") for line in body.splitlines())
    return [page.stem for page in pages if page.stem not in named | {root_doc}]


def _insert_unlisted_pages(app, docname: str, source: list[str]) -> None:
    if docname == UNLISTED_PAGE:
        source[0] = source[0].replace(UNLISTED_MARKER, "\n".join(unlisted_pages()))


def _reread_unlisted_page(app, env, added, changed, removed) -> list[str]:
    # pages added or removed since the last build change the marker's expansion
    return [UNLISTED_PAGE] if UNLISTED_PAGE in env.found_docs else []


def _init_signature(app, what, name, obj, options, signature, return_annotation):
    """PyMC's step methods define ``__new__(cls, *args, **kwargs)``, which autodoc shows as
    the class's signature: show the parameters of ``__init__`` instead (their types are in
    the descriptions, ``autodoc_typehints = "description"``)."""
    if what != "class" or signature != "(*args, **kwargs)":
        return None
    parameters = list(inspect.signature(obj.__init__).parameters.values())[1:]
    plain = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in parameters]
    return str(inspect.Signature(plain)), return_annotation


def setup(app):
    app.connect("source-read", _insert_unlisted_pages)
    app.connect("env-get-outdated", _reread_unlisted_page)
    app.connect("autodoc-process-signature", _init_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# -- General -------------------------------------------------------------------------------

extensions = [
    "myst_nb",  # MyST markdown pages and .ipynb notebooks (includes myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# -- MyST ----------------------------------------------------------------------------------

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3  # `page.md#a-heading` links, GitHub's slugs

# -- MyST-NB: render the stored outputs, never execute --------------------------------------

nb_execution_mode = "off"
nb_merge_streams = True

# -- autodoc / napoleon --------------------------------------------------------------------

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# An overridden method without a docstring of its own would show the docstring of the class
# it overrides (PyMC's BlockStep, ...): document only what this package writes.
autodoc_inherit_docstrings = False

# -- HTML ----------------------------------------------------------------------------------

html_theme = "pydata_sphinx_theme"
html_title = f"pymc-bigdata {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False
