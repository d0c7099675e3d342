"""Host time of a Python function, line by line: where an eager call's microseconds go.

cProfile times functions (and, on a slow host, its resolution and overhead hide the hot path's
few microseconds per line); torch's profiler times its operators only.  :func:`instrument`
recompiles a function with a timer call before each statement (the statements of its ``if``,
``for``, ``while``, ``with`` and ``try`` blocks too), so that a run of calls says how long each line
took, its callees (launches, allocations) included::

    from collectives import moe
    from collectives.tools import line_time
    lines = line_time.instrument(moe, "dispatch_with", "combine_with")
    ...  # calls
    print("\\n".join(lines.table(calls)))

On GPUs (an eager MoE layer, small collectives' plan hits)::

    torchrun --nproc-per-node 2 -m collectives.tools.line_time

Each line's time is from its timer call to the next one (a ``return``'s, to the function's
return).  Timed functions that call timed functions pay their callees' timer calls too.  A
timer call costs about 0.5-1 us (0.6-0.9 on the 2 x H200 hosts measured); :meth:`Lines.table`
measures it and reports each line net of it beside the line's time, and each function's total.
"""

from __future__ import annotations

import __future__
import ast
import inspect
import textwrap
import time
from collections import defaultdict
from types import ModuleType

_now = time.perf_counter_ns


class Lines:
    """Nanoseconds spent per (function, line) by the functions :func:`instrument` replaced."""

    def __init__(self) -> None:
        self.ns: dict[tuple[str, int], int] = defaultdict(int)
        self.hits: dict[tuple[str, int], int] = defaultdict(int)
        self.text: dict[tuple[str, int], str] = {}
        self.total: dict[str, int] = defaultdict(int)
        self._last: list[tuple[tuple[str, int] | None, int]] = []  # (line, since) per active call (a stack)

    def mark(self, where: tuple[str, int] | None) -> None:
        """A timer call: the time since the active call's previous mark goes to that mark's line."""
        now = _now()
        last, since = self._last[-1]
        if last is not None:
            self.ns[last] += now - since
            self.hits[last] += 1
        self._last[-1] = (where, _now())

    def enter(self) -> int:
        self._last.append((None, 0))
        return _now()

    def leave(self, name: str, start: int) -> None:
        self.mark(None)  # (the last line's time)
        self._last.pop()
        self.total[name] += _now() - start

    def clear(self) -> None:
        self.ns.clear()
        self.hits.clear()
        self.total.clear()

    def table(self, calls: int) -> list[str]:
        """Microseconds per call of each line hit (in source order): as timed, and net of the timer
        calls in it (one a hit, :func:`_mark_cost`); each function's total first."""
        overhead = _mark_cost()
        lines = [f"(one timer call: about {overhead:.2f} us, in every line's time; net: without it)"]
        for name in sorted({k[0] for k in self.ns}):
            lines.append(f"{name}: {self.total[name] / calls / 1e3:.2f} us per call")
            for key in sorted(k for k in self.ns if k[0] == name):
                us, hits = self.ns[key] / calls / 1e3, self.hits[key] / calls
                lines.append(f"  {key[1]:5d} {us:8.2f} us  net {max(us - overhead * hits, 0.0):7.2f}  x{hits:<4.1f} "
                             f"{self.text[key][:100]}")
        return lines


def _mark_cost(n: int = 20000) -> float:
    """Microseconds of one :meth:`Lines.mark` (timed on a :class:`Lines` of its own)."""
    probe = Lines()
    probe.enter()
    start = _now()
    for _ in range(n):
        probe.mark(("probe", 0))
    return (_now() - start) / n / 1e3


class _Marks(ast.NodeTransformer):
    """Puts ``__line_mark((name, lineno))`` before each statement of every block."""

    def __init__(self, name: str, offset: int, source: list[str], lines: Lines) -> None:
        self.name, self.offset, self.source, self.lines = name, offset, source, lines

    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            self.visit(stmt)
            line = stmt.lineno + self.offset
            self.lines.text[(self.name, line)] = self.source[stmt.lineno - 1].strip()
            mark = ast.Expr(ast.Call(ast.Name("__line_mark", ast.Load()),
                                     [ast.Tuple([ast.Constant(self.name), ast.Constant(line)], ast.Load())], []))
            out += [ast.copy_location(mark, stmt), stmt]
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, field, self._block(block))
        for handler in getattr(node, "handlers", []):
            handler.body = self._block(handler.body)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # (nested functions are not timed line by line: their calls are their line's)

    visit_AsyncFunctionDef = visit_FunctionDef


def instrument(module: ModuleType, *names: str, lines: Lines | None = None) -> Lines:
    """Replace ``module``'s functions ``names`` (module-level or ``Class.method``, no closure) with
    copies timed line by line into ``lines`` (a new :class:`Lines` by default); callers that reach
    them through the module's globals or the class (the module's own functions) call the copies."""
    lines = lines or Lines()
    module.__dict__["__line_mark"] = lines.mark
    for name in names:
        owner, attr = _owner(module, name)
        fn = owner.__dict__[attr]
        source, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(source)))
        fdef = tree.body[0]
        fdef.decorator_list = []
        marks = _Marks(f"{module.__name__}.{name}", first - 1, [s.rstrip("\n") for s in source], lines)
        fdef.body = marks._block(fdef.body)
        ast.fix_missing_locations(tree)
        space: dict = {}
        # (annotations postponed, as in our modules: a copy defined now evaluates none of them)
        code = compile(tree, inspect.getsourcefile(fn) or "<instrumented>", "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, module.__dict__, space)
        timed, label = space[attr], f"{module.__name__}.{name}"

        def wrapper(*args, __timed=timed, __label=label, **kwargs):
            start = lines.enter()
            try:
                return __timed(*args, **kwargs)
            finally:
                lines.leave(__label, start)

        wrapper.__wrapped__ = fn
        setattr(owner, attr, wrapper)
    return lines


def _owner(module: ModuleType, name: str) -> tuple[object, str]:
    """(the module or class holding ``name``, its last part)."""
    *path, attr = name.split(".")
    owner: object = module
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def restore(module: ModuleType, *names: str) -> None:
    """Put back the functions :func:`instrument` replaced."""
    for name in names:
        owner, attr = _owner(module, name)
        setattr(owner, attr, owner.__dict__[attr].__wrapped__)


def main(argv: list[str] | None = None) -> None:
    """Under ``torchrun``: rank 0 prints, line by line, an eager MoE layer's dispatch and
    combine (low latency, hidden 7168, top-8 of 256 experts, at each ``--tokens``) and the plan
    hits of a 4 KB all-reduce (symmetric and plain) and of the barrier, over ``--calls`` calls."""
    import argparse

    import torch
    import torch.distributed as dist

    import collectives
    from collectives import api, moe
    from collectives.algorithms import plan
    from collectives.runtime.communicator import communicator

    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m collectives.tools.line_time",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,128")
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    comm = communicator()

    def run(title: str, step, timed: list[tuple[ModuleType, tuple[str, ...]]]) -> None:
        step()
        collectives.synchronize()
        dist.barrier()
        lines = Lines()
        for module, names in timed:
            instrument(module, *names, lines=lines)
        for _ in range(200):
            step()
        collectives.synchronize()
        dist.barrier()
        lines.clear()
        for _ in range(args.calls):
            step()
        collectives.synchronize()
        for module, names in timed:
            restore(module, *names)
        if comm.rank == 0:
            print(f"\n== {title} ({torch.cuda.get_device_name()} x {comm.world}, {args.calls} calls)")
            print("\n".join(lines.table(args.calls)), flush=True)
        dist.barrier()

    for tokens in (int(t) for t in args.tokens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(comm.rank)
        x = torch.randn((tokens, 7168), device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.argsort(torch.rand((tokens, 256), device="cuda", generator=gen), 1)[:, :8]
        weights = torch.rand((tokens, 8), device="cuda", generator=gen)

        def layer() -> None:
            d = moe.dispatch(x, ids, weights, 256, max_tokens=tokens)
            moe.combine(d[0], d[2])

        run(f"MoE layer, {tokens} tokens per rank", layer,
            [(moe, ("dispatch_with", "combine_with")), (plan, ("Plan.run",))])
    symmetric = collectives.empty(2048, torch.bfloat16)
    plain = torch.ones(2048, dtype=torch.bfloat16, device="cuda")
    for title, t in (("symmetric", symmetric), ("plain", plain)):
        run(f"all_reduce, 4 KB bf16, {title}, plan hit", lambda t=t: api.all_reduce(t),
            [(api, ("all_reduce",)), (plan, ("Plan.run",))])
    run("barrier, plan hit", lambda: api.barrier(), [(api, ("barrier",)), (plan, ("Plan.run",))])
    collectives.synchronize()
    dist.barrier()
    collectives.current().close()


if __name__ == "__main__":
    main()
