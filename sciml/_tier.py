"""The engine's first calls on a machine: interpreted while a second process compiles.

The engine's loops are compiled once per machine and cached on disk; compiling one
takes numba 1 to 12 s, and a first gradient needs four or five of them. A call for
which no compiled loop is in memory or on disk is therefore run by the interpreter
(`sciml._interpret`: the same source, slower but with no wait) while a background
process (`python -m sciml._tier`, one per process, started at the first such call)
compiles the loop into the disk cache. Once it has, the next call loads it from there
and every later call runs compiled.

An interpreted call stops when the compiled loop is ready, when the loop's interpreted
calls have taken `LIMIT` seconds together (on one core they take the compile's time), or
when it meets what the interpreter cannot run: its arguments are put back as they came,
and it runs compiled: it waits for the background process if that has begun the loop,
else compiles the loop here (the background process is busy with others, and this core
would only wait). The background process compiles meanwhile, so on two cores a call
that stops has lost nothing but its copies of the arguments.
The background process ends after this one, once the loop it is compiling is done: what
it finished stays cached (a script that then removes the cache folder must wait for it,
as `benchmarks.compile_latency` waits for its runs' process groups).

Interpreted and compiled results differ in the last bits (fastmath), which is enough to
send an optimiser down another path: a fit (`compiled_only`, on `sciml.fit` and
`NLME.fit`) waits for the compiled loops, so that it gives the same result with a cold
cache as with a warm one.

``SCIML_INTERPRET=0`` in the environment (or `ENABLED` False) switches this off:
every first call compiles, as numba does. ``SCIML_INTERPRET=always`` runs every call
from Python interpreted and compiles nothing: the engine as plain Python, for a debugger
or to check the interpreter against the compiled engine.
"""

import base64
import contextlib
import functools
import importlib
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from numba.core.compiler_lock import global_compiler_lock

from ._interpret import ENGINE_MODULES, NotInterpretable, TooSlow, begin_call, deadline, python

__all__ = ["ENABLED", "LIMIT", "entry", "compiled", "loaded", "compiled_only", "usable_cores",
           "one_blas_thread", "prepare"]

ENABLED = os.environ.get("SCIML_INTERPRET", "1") != "0"
ALWAYS = os.environ.get("SCIML_INTERPRET") == "always"


def usable_cores():
    """The cores this process may run on (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


@functools.cache
def _blas(with_scipy):
    """threadpoolctl's controller of the BLAS libraries loaded now (``with_scipy``: a key,
    whether scipy's is among them)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS runs on one thread: for work that fills the cores already
    (multistart's fits), or whose products are too small to share (L-BFGS-B's, and the
    interpreted engine's stand-ins, whose second BLAS thread only contends with the
    background compile: Beer_MolBioSystems2014's interpreted gradient 3.3x slower).
    scipy's own BLAS is limited once `scipy.linalg` is loaded (not imported for it: 0.08
    s of a cold first call that may not need it)."""
    return _blas("scipy.linalg" in sys.modules).limit(limits=1, user_api="blas")


#: seconds a loop's interpreted calls may take before it waits for its compile: on one
#: core they delay the compile by as much, on more they run beside it (Schwen_PONE2014's
#: first gradient, 14 s interpreted, came 27 s after its load with 10 s, 16 s with 30)
LIMIT = 30.0 if usable_cores() > 1 else 10.0
WAIT = 600.0  # seconds a call waits for the background compile before it compiles itself


_FITTING = [0]  # how many `compiled_only` blocks run, in any thread (a fit's own threads)
_FITTING_LOCK = threading.Lock()


class compiled_only(contextlib.ContextDecorator):
    """Inside it (or a function it decorates), no call runs interpreted: each waits for its
    compiled loop, so that its results are the same to the bit with a cold cache as with
    a warm one. `sciml.fit` and `NLME.fit` run in it; public as `sciml.compiled_only`
    for what a fit starts from (data simulated with `sciml.solve`: an interpreted solve
    differs in the last bits, enough to send an optimiser to another minimum)."""

    def __enter__(self):
        with _FITTING_LOCK:
            _FITTING[0] += 1

    def __exit__(self, *exc):
        with _FITTING_LOCK:
            _FITTING[0] -= 1


def _on_disk(disp, sig):
    """Whether the disk cache's index lists ``disp`` for ``sig`` (True where numba's cache
    has no index to look into). numba prepares its compiler before it looks (0.2 s, once a
    process): a cold process's first calls, which find nothing, need not wait for that."""
    try:
        cache = disp._cache
        key = cache._index_key(sig, disp.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except (AttributeError, OSError):  # caching off, another numba, an unreadable index:
        return True  # numba's own look decides


def loaded(disp, sig):
    """The compiled entry of ``disp`` for the argument types ``sig``, from memory or the
    disk cache; None if it would have to be compiled (numba's own first steps of
    `Dispatcher.compile`, without the last)."""
    hit = disp.overloads.get(sig)
    if hit is not None:
        return hit.entry_point
    with global_compiler_lock:
        if not _on_disk(disp, sig):
            return None
        cres = disp._cache.load_overload(sig, disp.targetctx)
        if cres is None:
            return None
        disp._cache_hits[sig] += 1
        disp.targetctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
        disp.add_overload(cres)
        return cres.entry_point


def _boxed(x):
    """An interpreted loop's result as numba returns it: numbers as Python's (the loop's
    arithmetic gives numpy scalars), in tuples and named tuples alike."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        items = [_boxed(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    return x


def _arrays(x, out):
    if isinstance(x, np.ndarray):
        out[id(x)] = x
    elif isinstance(x, tuple):
        for item in x:
            _arrays(item, out)
    return out


class Tier:
    """A loop for one tuple of argument types while it is not compiled: interpreted calls,
    then (background compile done, or an interpreted call stopped) the compiled loop."""

    def __init__(self, disp, sig):
        self.disp, self.sig = disp, sig
        self.fn = None
        self.job = _COMPILER.request(disp, sig)
        self.interpret = self.job is not None
        self.left = LIMIT  # seconds of interpreted calls left

    def __call__(self, *args):
        if (self.fn is None and self.interpret and not _FITTING[0]
                and not self.job.done.is_set()):
            kept = [(a, a.copy()) for a in _arrays(args, {}).values()]
            t0 = time.perf_counter()
            try:
                with (np.errstate(all="ignore"), deadline(self.left, self.job.done),
                      one_blas_thread()):
                    begin_call()
                    return _boxed(python(self.disp)(*args))
            except (TooSlow, NotInterpretable, ArithmeticError, LookupError, ValueError,
                    TypeError):
                # the compiled loop takes over from the arguments as they came
                self.interpret = False
                for a, copy in kept:
                    a[...] = copy
            finally:
                self.left -= time.perf_counter() - t0
        if self.fn is None:
            self.fn = self._compiled()
        return self.fn(*args)

    def _compiled(self):
        if self.job is not None and not self.job.started and not self.job.done.is_set():
            # the background process is still on other loops: this one here, on the core
            # that would otherwise wait (it loads what the other process finishes first)
            return self.disp.compile(self.sig)
        if self.job is not None:
            self.job.done.wait(WAIT)
            fn = loaded(self.disp, self.sig)
            if fn is not None:
                return fn
        return self.disp.compile(self.sig)


_TIERS = {}  # (id of dispatcher, argument types) -> its Tier


def entry(disp, args):
    """The compiled entry of ``disp`` for ``args``' types if it is in memory or on disk (or
    the tiers are off: then compiled now), else its `Tier`."""
    if ALWAYS:
        return _interpreted(disp)
    sig = tuple(disp.typeof_pyval(a) for a in args)
    if not ENABLED:
        return disp.compile(sig)
    tier = _TIERS.get((id(disp), sig))  # (it holds ``disp``: the id is not reused)
    if tier is not None:  # it looks for the compiled loop itself, not the disk each call
        return tier.fn if tier.fn is not None else tier
    fn = loaded(disp, sig)
    if fn is not None:
        return fn
    tier = _TIERS[(id(disp), sig)] = Tier(disp, sig)
    return tier


def _interpreted(disp):
    def run(*args):
        with np.errstate(all="ignore"), one_blas_thread():
            begin_call()
            return _boxed(python(disp)(*args))

    return run


def compiled(fn):
    """Whether ``fn`` (from `entry`) is compiled, to be kept by a caller that calls it
    again and again."""
    return not isinstance(fn, Tier) and not ALWAYS


# ------------------------------------------------------------------- the second process


def _name_of(disp):
    """``(module, attribute)`` naming ``disp`` among the engine's modules (or a function
    there that makes it: its ``made_by``), or None."""
    made_by = getattr(disp, "made_by", None)
    if made_by is not None:
        return made_by
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(ENGINE_MODULES):
            continue
        for attr, value in vars(mod).items():
            if value is disp:
                return mod_name, attr
    return None


def _dispatcher(module, attr):
    """The dispatcher that `_name_of` named."""
    found = getattr(importlib.import_module(module), attr)
    return found if hasattr(found, "overloads") else found()


class _Job:
    def __init__(self):
        self.started = False  # the background process is compiling it
        self.done = threading.Event()
        self.ok = False


class _Compiler:
    """The background process: requests go to its input, one line each; it answers
    ``started`` for each as it begins, then ``ok`` (or ``failed``) once the loop is in
    the disk cache."""

    def __init__(self):
        self.proc = None
        self.jobs = {}
        self.idle = []  # (job, line) of one-off functions, sent when no loop is left
        self.names = {}
        self.lock = threading.Lock()

    def request(self, disp, sig):
        """A `_Job` that ends when ``disp`` is compiled for ``sig`` (None: cannot be)."""
        name = self.names.get(id(disp))
        if name is None:
            name = self.names[id(disp)] = _name_of(disp) or ()
        if not name:
            return None
        with self.lock:
            key = (id(disp), sig)
            job = self.jobs.get(key)
            if job is not None:
                return job
            if not self._start():
                return None
            job = self.jobs[key] = _Job()
            line = base64.b64encode(pickle.dumps((key, *name, sig))) + b"\n"
            if getattr(disp, "once", False):
                self.idle.append((job, line))  # after the loops (`_send_idle`)
                self._send_idle()
            else:
                self._send(job, line)
            return job

    def _send(self, job, line):
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except OSError:
            job.done.set()

    def _send_idle(self):
        """The one-off functions asked for (``once``: a model's sparsity analysis, which
        the interpreter runs in milliseconds and numba compiles in 3 to 5 s), once a loop
        is compiled and none is left: they would hold up the loops that every solve runs.
        Called with the lock held, as a job ends or a one-off is asked."""
        held = {id(job) for job, _ in self.idle}
        loops = [job for job in self.jobs.values() if id(job) not in held]
        if held and loops and all(job.done.is_set() for job in loops):
            for job, line in self.idle:
                self._send(job, line)
            self.idle = []

    def _start(self):
        if self.proc is not None:
            return self.proc.poll() is None
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, SCIML_INTERPRET="0",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "sciml._tier"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        except OSError:
            return False
        self.fds = (self.proc.stdin.fileno(), self.proc.stdout.fileno())
        threading.Thread(target=self._answers, daemon=True, name="sciml-compile").start()
        return True

    def _answers(self):
        for line in self.proc.stdout:
            key, status = pickle.loads(base64.b64decode(line))
            with self.lock:
                job = self.jobs.get(key)
            if job is not None and status == "started":
                job.started = True
            elif job is not None:
                job.ok = status == "ok"
                job.done.set()
                with self.lock:
                    self._send_idle()
        with self.lock:  # the process ended: nothing more will come
            for job in self.jobs.values():
                job.done.set()


_COMPILER = _Compiler()


def _cold(disp):
    """Whether the disk cache's folder of ``disp`` (an engine function: they share one)
    holds no compiled function of the engine yet."""
    try:
        folder = disp._cache._cache_path
    except AttributeError:  # caching off, another numba: no guess
        return False
    try:
        return not any(name.endswith(".nbi") for name in os.listdir(folder))
    except OSError:  # not made yet
        return True


def prepare(disp):
    """Start the background process now if the engine's disk cache is empty (a first session
    on this machine, or after an upgrade): its own start (Python, numba and the engine
    imported: ~1.2 s) then overlaps the building of a model instead of following its first
    solve. ``disp``: any engine function, whose cache folder is looked into. Nothing where
    the tiers are off or the cache has compiled code (a warm session starts no process)."""
    if not ENABLED or ALWAYS or _COMPILER.proc is not None or not _cold(disp):
        return
    with _COMPILER.lock:
        _COMPILER._start()


def _forked():
    """In a forked child (`sciml.nlme`'s workers): the parent's background process and its
    answers are not this process's. Its jobs end (the loops load from the cache, or compile
    here), with fresh events: a lock held at the fork would never be released."""
    for job in _COMPILER.jobs.values():
        job.done = threading.Event()
        job.done.set()
    if _COMPILER.proc is not None:
        # This copy of the pipes must not keep the parent's process running. Not closed
        # through their file objects: the parent's answer thread, gone here, may have held
        # the reader's lock at the fork; their descriptors become /dev/null instead.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in _COMPILER.fds:
            os.dup2(null, fd)
        os.close(null)
    _COMPILER.__init__()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _serve():
    """The background process: compile what is asked, in order, until the input ends."""
    import queue

    asked = queue.Queue()

    def read():
        for line in sys.stdin.buffer:
            asked.put(line)
        os._exit(0)  # the process that asked has ended

    threading.Thread(target=read, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        key, module, attr, sig = pickle.loads(base64.b64decode(asked.get()))
        out.write(base64.b64encode(pickle.dumps((key, "started"))) + b"\n")
        out.flush()
        try:
            _dispatcher(module, attr).compile(sig)
            status = "ok"
        except Exception:  # the asking process compiles it itself, and reports the error
            status = "failed"
        out.write(base64.b64encode(pickle.dumps((key, status))) + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
