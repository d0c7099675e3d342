"""Sphinx configuration for the ptxops documentation.

Build (warnings are errors, as in CI):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The instruction reference (``docs/instructions/``) is generated from ``ptxops.spec`` here,
before Sphinx reads any source (see ``gen_reference.py``); it is git-ignored.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

# CuTeDSL compiles without a GPU for this target (autodoc imports ptxops.ops and
# collectives.device, which load CuTeDSL).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import gen_reference  # noqa: E402

gen_reference.generate(DOCS / "instructions")

project = "ptxops"
author = "ptxops developers"
copyright = "ptxops developers"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3

# torch and nvshmem4py are not installed where the docs are built (CI has no GPU stack):
# collectives' host modules are documented against mocks of them, here too.
autodoc_mock_imports = ["torch", "nvshmem"]
autodoc_member_order = "bysource"
# Documented objects stay out of the pages' tables of contents: the navigation of every page
# copies the whole tree, and the API pages' thousands of entries made that most of the build.
toc_object_entries = False
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

html_theme = "furo"
html_title = "ptxops"
html_static_path: list[str] = []
pygments_style = "sphinx"
