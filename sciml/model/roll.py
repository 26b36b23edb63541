"""Repeated groups of a large kernel rolled back into loops.

A model written as a loop over cells or copies (``for i in range(n): out += [...]``)
is traced into straight-line outputs: n copies of the same few expressions on
other states and constants. Printed as they are, a kernel's code grows with n;
past a few thousand outputs it no longer fits the caches (its time per output
grows) and LLVM compiles it without optimising (`sciml.model.llvm.BIG`). Here
such runs become one `code.Loop` again, as the model's author wrote them:

1. each output's expression is abstracted into a *shape*: its nodes in order,
   each leaf replaced by a slot (an element of a loaded array: which array; a
   number; any other symbol: itself);
2. a *run* is a stretch of outputs periodic in shape with some period P (one
   group's outputs), whose P-output blocks have the same joint shape (the
   subexpressions they share included) and whose array indices, the outputs'
   and the leaves', step by the same amount from each block to the next;
3. the run becomes ``for i in range(N)``: block 0's expressions with element
   ``a[j]`` read as ``a[j + i d]``, and each number that differs between blocks
   read from a constant table of the kernel (`code.Kernel.tables`);
4. runs are looked for again among the outputs left over, and consecutive runs
   that repeat each other with every index stepping evenly from one to the next
   (a 2-D grid's rows) become one loop nest.

A sum of many terms written to one output (a vjp's parameter gradient sums over
every group) is first split into its terms, each added to the output, so that
its repeated terms roll into a loop that accumulates.

Only whole runs change form: what is not in a run is returned as it came.
"""

import numpy as np

from .code import Assign, At, Loop, index
from .graph import LEAVES, _children, postorder

__all__ = ["roll", "MIN_BLOCKS"]

MIN_BLOCKS = 8  # a run repeats its block at least this often
MAX_PERIOD = 16  # outputs in a block
BUDGET = 300  # nodes in one output's expression beyond which it is left as it is
SPLIT_FROM = 64  # a sum of at least this many terms is split into its terms


class _Shape:
    """The shape of some outputs' expressions (``key``: hashable) and the values of
    its slots: ``idx`` (the outputs' array indices, then the loaded leaves'), ``num`` (the
    numbers); ``at`` and ``nums``: the leaf nodes of those slots."""

    __slots__ = ("key", "idx", "num", "at", "nums")


def _leaf(nd, cx):
    """The token of a node that shapes do not look inside, None for the others: a shared
    node (itself), an input symbol (its loaded array's name, or the symbol where it is
    not loaded) and a number."""
    loads, shared = cx
    if nd in shared:
        return ("shared", nd)
    if nd.op == "sym":
        ld = loads.get(nd.args[0])
        return ("sym", nd.args[0]) if ld is None else ("at", ld.args[0])
    if nd.op == "num":
        return ("num",)
    return None


def _element(target):
    """Whether an output's target is an array element at a constant index (all a run's
    targets must be)."""
    return isinstance(target, At) and target.args[1].is_Integer


def _shape(items, cx, budget):
    """The joint `_Shape` of ``items`` ((target element, node, add)), or None when
    larger than ``budget`` nodes or a target is not an element of an array."""
    loads = cx[0]
    ids, toks, idx, num, lv_idx, lv_num = {}, [], [], [], [], []
    heads = []
    for target, _, add in items:
        if not _element(target):
            return None
        heads.append((target.args[0], add))
        idx.append(int(target.args[1]))

    entered = [0]  # nodes entered: bounds the size and the recursion's depth

    def walk(nd):
        k = ids.get(nd)
        if k is not None:
            return k
        entered[0] += 1
        if entered[0] > budget:
            raise _TooLarge
        op = nd.op
        tok = _leaf(nd, cx)
        if tok is not None:
            if tok[0] == "at":  # a slot: the element's index
                idx.append(int(loads[nd.args[0]].args[1]))
                lv_idx.append(nd)
            elif tok[0] == "num":  # a slot: the number
                num.append(nd.args[0])
                lv_num.append(nd)
        elif op == "fn":
            tok = ("fn", nd.args[0], *[walk(c) for c in nd.args[1:]])
        else:
            tok = (op, *[walk(c) for c in nd.args])
        k = ids[nd] = len(toks)
        toks.append(tok)
        return k

    try:
        roots = tuple([walk(nd) for _, nd, _ in items])
    except _TooLarge:
        return None
    s = _Shape()
    s.key = (tuple(heads), tuple(toks), roots)
    s.idx, s.num, s.at, s.nums = idx, num, lv_idx, lv_num
    return s


class _TooLarge(Exception):
    pass


def _kinds(items, cx):
    """Each item's kind: equal for items whose expressions have the same tree (leaves as
    `_shape` abstracts them, shared subexpressions not told apart: `_run` checks the
    joint shapes), distinct negative numbers for items over `BUDGET` nodes."""
    sig, size, ids = {}, {}, {}

    def walk(nd, depth):
        got = sig.get(nd)
        if got is not None:
            return got
        if depth > BUDGET:
            raise _TooLarge
        op = nd.op
        key, n = _leaf(nd, cx), 1
        if key is None:
            kids = nd.args[1:] if op == "fn" else nd.args
            sub = [walk(c, depth + 1) for c in kids]
            n = 1 + sum([size[c] for c in kids])
            if n > BUDGET:
                raise _TooLarge
            key = (op, nd.args[0], *sub) if op == "fn" else (op, *sub)
        got = sig[nd] = ids.setdefault(key, len(ids))
        size[nd] = n
        return got

    kind = np.empty(len(items), dtype=np.int64)
    for k, (target, nd, add) in enumerate(items):
        try:
            if not _element(target):
                raise _TooLarge
            kind[k] = ids.setdefault((target.args[0], add, walk(nd, 0)), len(ids))
        except _TooLarge:
            kind[k] = -1 - k
    return kind


def _split(g, items):
    """``(zeros, items)``: each sum of `SPLIT_FROM` terms or more written to one element,
    as its terms added one by one, and the statements zeroing the elements that were
    assigned (to run before any of the rest)."""
    out, zeros = [], []
    for target, nd, add in items:
        if nd.op == "add" and len(nd.args) >= SPLIT_FROM:
            if not add:
                zeros.append(Assign(target, g.ZERO))
            out.extend((target, c, True) for c in nd.args)
        else:
            out.append((target, nd, add))
    return zeros, out


def _periodic(kind, n):
    """``(cover, period)``, arrays over the start a: the most outputs from a covered by
    whole blocks of some period P <= `MAX_PERIOD` that repeat the kinds of the first
    (of `MIN_BLOCKS` blocks or more), and that P (smallest on ties; 0: none)."""
    best_cover = np.zeros(n, dtype=np.int64)
    best_p = np.zeros(n, dtype=np.int64)
    for p in range(1, MAX_PERIOD + 1):
        if n < p * MIN_BLOCKS:
            break
        same = np.zeros(n, dtype=np.int64)
        same[: n - p] = kind[: n - p] == kind[p:]
        # run[a]: how many of a, a+1, ... in a row have kind equal to P further on
        run = np.zeros(n + 1, dtype=np.int64)
        z = np.flatnonzero(same == 0)
        nxt = np.full(n + 1, n, dtype=np.int64)
        # next position >= a where `same` is 0 (n when none)
        nxt[z] = z
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
        run[:n] = nxt[:n] - np.arange(n)
        cover = (run[:n] // p + 1) * p
        cover = np.minimum(cover, n - np.arange(n)) // p * p
        better = cover > best_cover
        best_cover[better] = cover[better]
        best_p[better] = p
    return best_cover, best_p


def roll(g, items, loads, new_table, temps):
    """``(stmts, rest, leaves)``: statements to run first, `code.Loop` statements for the
    runs among ``items`` ((target array element, graph node, add)) after any zeroing of
    split sums' outputs; the items outside runs, in order, to run after them; and the
    symbols the loops read (for the kernel's loads).

    Runs are looked for again among the items left (the boundary cells of a grid's rows
    repeat from row to row), and consecutive runs that repeat each other with every index
    stepping evenly from run to run (a grid's rows) become one loop nest.

    ``loads`` maps each input symbol to the array element it is loaded from;
    ``new_table(values)`` returns the Symbol of a new constant table of the kernel;
    ``temps`` yields the loops' temporaries.
    """
    zeros, rest = _split(g, items)
    cx = (loads, _shared(rest))
    runs = []
    for _ in range(3):
        found, rest = _runs(rest, cx)
        runs += found
        if not found:
            break
    stmts, leaves, hoisted = list(zeros), set(), {}
    for k, nest in enumerate(_nests(runs)):
        new, read = _loop(g, nest, cx, hoisted, new_table, temps, k)
        stmts += new
        leaves |= read
    return stmts, rest, leaves


def _shared(items):
    """The nodes that more than `MAX_PERIOD` items read (a total over every state, a
    product of parameters): in shapes they are leaves of their own, the same node in
    every block, so a loop reads them computed once before it."""
    count, seen = {}, set()
    for _, nd, _ in items:
        stack, mine = [nd], set()
        while stack:
            x = stack.pop()
            if x in mine or x.op in LEAVES:
                continue
            mine.add(x)
            if x in seen:  # first reached by an earlier item: counted, not walked again
                count[x] = count.get(x, 1) + 1
                continue
            seen.add(x)
            stack.extend(_children(x))
    return frozenset(x for x, c in count.items() if c > MAX_PERIOD)


def _runs(items, cx):
    """``(runs, rest)``: the runs among ``items`` as ``(block items, block shapes)``, and
    the items outside them, in order."""
    n = len(items)
    if n < MIN_BLOCKS:
        return [], items
    kind = _kinds(items, cx)
    cover, period = _periodic(kind, n)
    runs, rest = [], []
    a = 0
    while a < n:
        p = int(period[a])
        if p == 0 or cover[a] < p * MIN_BLOCKS:
            rest.append(items[a])
            a += 1
            continue
        blocks = _run(items[a:a + int(cover[a])], p, cx)
        if len(blocks) < MIN_BLOCKS:
            skip = p
            if len(blocks) > 2:
                # the indices stepped evenly and then did not (a grid row's end): a run
                # of period P starting inside these blocks breaks there too
                skip = p * len(blocks)
            else:
                # kinds repeating every P repeat every multiple of P: the indices may
                # step only at a multiple (two terms of one group in a sum, say)
                for q in range(2 * p, MAX_PERIOD + 1, p):
                    if cover[a] < q * MIN_BLOCKS:
                        break
                    blocks = _run(items[a:a + int(cover[a]) // q * q], q, cx)
                    if len(blocks) >= MIN_BLOCKS:
                        p = q
                        break
            if len(blocks) < MIN_BLOCKS:
                rest.extend(items[a:a + skip])
                a += skip
                continue
        runs.append((items[a:a + p], blocks))
        a += p * len(blocks)
    return runs, rest


def _step(x, y):
    return [u - v for u, v in zip(x.idx, y.idx)]


def _nests(runs):
    """``runs`` grouped: each group consecutive runs of equal shape, length and step whose
    first blocks' indices step evenly from one run to the next."""
    groups = []
    for run in runs:
        if groups:
            last = groups[-1]
            (_, b0), (_, b1) = last[0], run
            if b1[0].key == b0[0].key and len(b1) == len(b0) \
                    and _step(b1[1], b1[0]) == _step(b0[1], b0[0]):
                d = _step(b1[0], b0[0])
                if len(last) == 1 or d == [len(last) * x for x in _step(last[1][1][0], b0[0])]:
                    last.append(run)
                    continue
        groups.append([run])
    return groups


def _run(items, p, cx):
    """The joint shapes of the leading blocks of P items that form a run: equal shapes,
    every index stepping by the same amount from block to block."""
    first = _shape(items[:p], cx, BUDGET * p)
    if first is None:
        return []
    blocks = [first]
    step = None
    for b in range(p, len(items) - p + 1, p):
        s = _shape(items[b:b + p], cx, BUDGET * p)
        if s is None or s.key != first.key:
            break
        d = _step(s, first)
        if step is None:
            step = d
        elif any(x != len(blocks) * y for x, y in zip(d, step)):
            break
        blocks.append(s)
    if step is not None:
        # outputs assigned (not added) must be distinct elements in every iteration
        for (_, _, add), d in zip(items[:p], step):
            if not add and d == 0:
                return blocks[:1]
    return blocks


def _loop(g, nest, cx, hoisted, new_table, temps, k):
    """``(statements, leaves read)``: the `code.Loop` of a run (a loop nest of runs), the
    first block's items with their slots indexed by the counters and the numbers that
    differ read from tables (row-major over the nest), after the shared nodes it reads
    that no loop before it computed (``hoisted``: node -> its temporary)."""
    loads, shared = cx
    block, shapes = nest[0]
    first, n = shapes[0], len(shapes)
    i = index(f"r{k}")
    step = _step(shapes[1], first)
    if len(nest) > 1:
        o = index(f"q{k}")
        outer = _step(nest[1][1][0], first)
        pos = o * n + i
    else:
        o, outer, pos = 0, [0] * len(step), i
    n_out = len(block)
    sub = {}
    for leaf, b, d, e in zip(first.at, first.idx[n_out:], step[n_out:], outer[n_out:]):
        if d or e:
            sub[leaf] = g.sym(At(loads[leaf.args[0]].args[0], b + d * i + e * o))
    for j, leaf in enumerate(first.nums):
        values = [s.num[j] for _, run in nest for s in run]
        if any(v != values[0] for v in values):
            sub[leaf] = g.sym(At(new_table(tuple(values)), pos))
    pre = []

    def hoist(x):
        t = hoisted.get(x)
        if t is None:
            t = hoisted[x] = next(temps)
            pre.append((t, x, False))
        return g.sym(t)

    memo = {x: hoist(x) for x in _reached(block, shared)}
    body = []
    for (target, nd, add), b, d, e in zip(block, first.idx, step, outer):
        body.append((At(target.args[0], b + d * i + e * o) if d or e else target,
                     _substitute(g, nd, sub, memo), add))
    head, read = g.emit(pre, temps) if pre else ([], set())
    stmts, read2 = g.emit(body, temps)
    loop = Loop(i, 0, n, tuple(Assign(t, v, a) for t, v, a in stmts))
    loop = loop if len(nest) == 1 else Loop(o, 0, len(nest), (loop,))
    return [Assign(t, v, a) for t, v, a in head] + [loop], read | read2


def _reached(items, shared):
    """The shared nodes ``items`` read (not looking inside them)."""
    out, stack, seen = set(), [nd for _, nd, _ in items], set()
    while stack:
        x = stack.pop()
        if x in seen or x.op in LEAVES:
            continue
        seen.add(x)
        if x in shared:
            out.add(x)
        else:
            stack.extend(_children(x))
    return out


def _substitute(g, nd, sub, memo):
    """`nd` with its leaves replaced as ``sub`` says (the same structure: no folding)."""
    def leaf(x):
        if x.op in LEAVES:
            return sub.get(x, x)
        return None

    def combine(x, memo):
        a = x.args
        new = (a[0],) + tuple(memo[c] for c in a[1:]) if x.op == "fn" else \
            tuple(memo[c] for c in a)
        return x if all(u is v for u, v in zip(new, a)) else g._node(x.op, new)

    return postorder(nd, memo, _children, combine, leaf)
