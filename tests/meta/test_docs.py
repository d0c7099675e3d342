"""Every code block of the documentation runs here, so the docs cannot rot.

Per page of ``docs/*.md`` and the README, the ``python`` blocks run in order in one namespace (a block may use
what an earlier one defined), on the CPU: kernels compile for sm_90a without a GPU.  A block
marked ``<!-- gpu -->`` on the line before its fence needs GPUs under torchrun: it is compiled
(syntax), every ``ptxops``/``collectives`` name it imports or uses must exist, and it may not
define kernels itself (a kernel it launches is defined and compiled by a CPU block of the same
page).  It is a whole program: its launch line first, every name it reads defined or imported in
it (a kernel imported from a CPU block of the page headed ``# NAME.py``, the file it is saved as).
``python -m ptxops ...`` and ``python -m collectives ptx ...`` lines of ``bash`` blocks run too, and
must exit 0.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
import shlex
import symtable
from pathlib import Path

import pytest

from tests.support.doc_blocks import DOCS, LAUNCH, PAGES, README, Block, blocks, page_modules, python_blocks
from tests.support.doc_programs import needs

PACKAGES = ("ptxops", "collectives")

# -- static checks of GPU-only blocks ----------------------------------------------------------


def module_names(module: str) -> set[str]:
    """Top-level names a module of ours defines, read from its source (never imported: the
    host modules of collectives import torch, which CI does not install)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if spec.submodule_search_locations:  # a package: its submodules, and lazy __all__ names
        for loc in spec.submodule_search_locations:
            names |= {p.stem for p in Path(loc).glob("*.py")} | {
                p.name for p in Path(loc).iterdir() if (p / "__init__.py").exists()
            }
        constants = {}  # module-level tuples of names, which __all__ may unpack (ptxops's does)
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id == "__all__":
                    for elt in node.value.elts:
                        starred = isinstance(elt, ast.Starred)
                        names |= set(constants[elt.value.id]) if starred else {ast.literal_eval(elt)}
                else:
                    try:
                        constants[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return names


def is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def check_names(block: Block) -> None:
    """Every ``from ptxops... import x`` / ``collectives.x`` in the block exists."""
    tree = ast.parse(block.code, filename=block.where)
    modules: dict[str, str] = {}  # local name -> module of ours it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    assert importlib.util.find_spec(a.name), f"{block.where}: no module {a.name}"
                    if a.asname:
                        modules[a.asname] = a.name
                    else:
                        modules[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            defined = module_names(node.module)
            for a in node.names:
                assert a.name in defined, f"{block.where}: {node.module} has no {a.name}"
                sub = f"{node.module}.{a.name}"
                if is_package(node.module) and importlib.util.find_spec(sub):
                    modules[a.asname or a.name] = sub
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            assert node.attr in module_names(module), f"{block.where}: {module} has no {node.attr}"


def check_gpu_block(block: Block) -> None:
    compile(block.code, block.where, "exec")
    assert "@cute.kernel" not in block.code and "@cute.jit" not in block.code, (
        f"{block.where}: a GPU-only block may not define kernels; define them in a CPU block "
        "(which the tests trace and compile) and launch them from here"
    )
    check_names(block)


# -- command lines ------------------------------------------------------------------------------


def commands(page: Path) -> list[tuple[Block, list[str]]]:
    out = []
    for b in blocks(page):
        if b.lang not in ("bash", "sh", "console") or b.gpu:
            continue
        for line in b.code.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith(("python -m ptxops ", "python -m collectives ptx")):
                argv = shlex.split(line, comments=True)
                out.append((b, argv[2:]))
    return out


def run_command(argv: list[str]) -> int:
    if argv[0] == "ptxops":
        from ptxops.cli import main
    else:
        pytest.importorskip("cutlass")
        from collectives.__main__ import main
    return main(argv[1:])


# -- tests --------------------------------------------------------------------------------------


def test_the_pages_have_code() -> None:
    names = {p.name for p in PAGES}
    for page in ("guide-memory-ordering.md", "tutorial-all-gather.md", "guide-collectives.md", "README.md"):
        assert page in names
        assert python_blocks(README if page == README.name else DOCS / page), f"{page} has no python blocks"


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU blocks run in order in one namespace; GPU blocks are checked statically."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    if importlib.util.find_spec("cutlass") is not None:  # a block's KeepPTX compile (the README's) writes its
        from cutlass.cutlass_dsl import CuTeDSL  # .ptx into CuTeDSL's dump directory: here, not the repository

        monkeypatch.setattr(CuTeDSL._get_dsl().envar, "dump_dir", str(tmp_path))
    todo = python_blocks(page)
    for optional in ("cutlass", "torch"):  # a page whose CPU blocks need one skips without it
        if any(not b.gpu and re.search(rf"^\s*(import|from)\s+{optional}\b", b.code, re.M) for b in todo):
            pytest.importorskip(optional)
    # CuTeDSL reads a kernel's source: the CPU blocks go into a file, each at its own line
    # numbers in the page, so tracebacks and DSL errors point into the Markdown.
    source = tmp_path / f"{page.name}.py"
    lines = [""] * len(page.read_text().splitlines())
    for block in todo:
        if not block.gpu:
            for k, text in enumerate(block.code.splitlines()):
                lines[block.line + k] = text
    source.write_text("\n".join(lines) + "\n")
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}", "__file__": str(source)}
    for block in todo:
        if block.gpu:
            check_gpu_block(block)
            continue
        code = compile("\n" * block.line + block.code, str(source), "exec")
        try:
            exec(code, namespace)
        except Exception as e:
            raise AssertionError(f"{block.where}: the block failed: {type(e).__name__}: {e}") from e


@pytest.mark.parametrize(
    ("block", "argv"),
    [c for p in PAGES for c in commands(p)],
    ids=lambda x: x.where if isinstance(x, Block) else " ".join(x),
)
def test_command_lines_run(block: Block, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert run_command(argv) == 0, f"{block.where}: python -m {' '.join(argv)} failed"


def unbound_names(block: Block) -> set[str]:
    """The global names ``block`` reads that it neither defines nor imports, builtins aside: what a
    copy of the block alone, saved as a file, would raise NameError on."""
    top = symtable.symtable(block.code, block.where, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    todo = [top]
    while todo:
        table = todo.pop()
        read |= {s.get_name() for s in table.get_symbols()
                 if s.is_referenced() and (table is top or s.is_global())}
        todo.extend(table.get_children())
    return read - bound - set(dir(builtins)) - {"__file__", "__name__"}


def check_complete(block: Block) -> None:
    """``block`` runs as a file of its own: every name it reads it defines or imports, and what it
    imports from a file of its page (a block headed ``# NAME.py``) that file defines."""
    unbound = unbound_names(block)
    assert not unbound, f"{block.where}: not a whole program: {sorted(unbound)} come from nowhere"
    modules = page_modules(block.page)
    for node in ast.walk(ast.parse(block.code)):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            source = modules[node.module]
            defined = {s.get_name() for s in symtable.symtable(source.code, source.where, "exec").get_symbols()
                       if s.is_assigned() or s.is_imported()}
            missing = [a.name for a in node.names if a.name not in defined]
            assert not missing, f"{block.where}: {node.module}.py ({source.where}) has no {missing}"


def check_program(block: Block) -> None:
    """A GPU block is a whole program: its launch line first, every name defined or imported, and
    under torchrun ``collectives.init()`` before any other use of collectives (a rank has no context
    before it; in one process, a world of ``collectives.testing`` gives each rank its context)."""
    lines = block.code.splitlines()
    launch = LAUNCH.match(lines[0])
    assert launch, f"{block.where}: a GPU program starts with its launch line, not {lines[0]!r}"
    check_complete(block)
    uses = sorted((n.lineno, n.col_offset, n.attr) for n in ast.walk(ast.parse(block.code))
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "collectives")
    if uses and " torchrun " in lines[0]:
        assert uses[0][2] == "init", (
            f"{block.where}: collectives.init() must come first (a rank has no context before it)")
    elif uses:
        assert "collectives.testing" in block.code, (
            f"{block.where}: one process without torchrun: collectives run in a world of collectives.testing")


GPU_PROGRAMS = [b for p in PAGES for b in python_blocks(p) if b.gpu]


@pytest.mark.parametrize("block", GPU_PROGRAMS, ids=lambda b: b.where)
def test_gpu_blocks_are_programs(block: Block) -> None:
    check_program(block)


@pytest.mark.parametrize("block", [b for p in PAGES for b in page_modules(p).values()], ids=lambda b: b.where)
def test_page_files_are_complete(block: Block) -> None:
    """A CPU block headed ``# NAME.py`` (a file a GPU program of its page imports) runs on its own."""
    check_complete(block)


def test_a_gpu_block_without_init_is_no_program() -> None:
    def program(code: str) -> Block:
        return Block(DOCS / "x.md", 1, "python", code, True)

    with pytest.raises(AssertionError, match="collectives.init"):
        check_program(program("# x.py: torchrun --nproc-per-node 2 x.py\nimport collectives\n"
                              "world = collectives.current().world_size\n"))
    with pytest.raises(AssertionError, match="launch line"):
        check_program(program("import collectives\ncollectives.init()\n"))
    with pytest.raises(AssertionError, match=r"\['a'\] come from nowhere"):
        check_program(program("# x.py: torchrun --nproc-per-node 2 x.py\nimport collectives\n"
                              "collectives.init()\n\ndef f():\n    return collectives.all_reduce(a)\n"))
    with pytest.raises(AssertionError, match="collectives.testing"):
        check_program(program("# x.py: python x.py\nimport collectives\ncollectives.barrier()\n"))
    check_program(program("# x.py: torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint h:1 x.py\n"
                          "import collectives\nnode = collectives.init()\n"))
    importer = Block(DOCS / "guide-torch-compile.md", 1, "python", "# y.py: python y.py\n"
                     "from row_parallel import ColumnParallel\nColumnParallel(8)\n", True)
    with pytest.raises(AssertionError, match=r"row_parallel.py \(guide-torch-compile.md:\d+\) has no \['ColumnParallel'\]"):
        check_program(importer)


def test_gpu_marker_is_checked() -> None:
    """The static checks catch a renamed building block in a GPU-only block."""
    bad = Block(DOCS / "x.md", 1, "python", "from collectives.device import no_such_block\n", True)
    with pytest.raises(AssertionError, match="no_such_block"):
        check_gpu_block(bad)
    kernel = Block(DOCS / "x.md", 1, "python", "import cutlass.cute as cute\n@cute.kernel\ndef k(): pass\n", True)
    with pytest.raises(AssertionError, match="may not define kernels"):
        check_gpu_block(kernel)


@pytest.mark.parametrize("block", GPU_PROGRAMS, ids=lambda b: b.where)
def test_gpu_programs_launch(block: Block) -> None:
    """``bash .ci/gpu docs`` (tests/support/doc_programs.py) reads how many nodes and GPUs each
    program's launch line asks for."""
    argv = shlex.split(block.code.splitlines()[0].split(":", 1)[1])
    nodes, gpus = needs(argv)
    assert nodes >= 1 and gpus >= 1 and argv[-1] == LAUNCH.match(block.code.splitlines()[0])["name"]
