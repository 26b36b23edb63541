"""Generated source as real modules, so that numba's on-disk cache works for it.

Every compiled model is a Python module written from text (its kernels, plus
the text of the solver-loop templates that call them) into a cache folder,
named by a hash of that text, and imported from there. numba caches beside
the file (`cache=True`), so a second process that builds the same model finds
both the module and its compiled code, and compiles nothing.

The folder is ``$SCIML_CACHE_DIR`` if set, else ``~/.cache/sciml-nets``.
"""

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

PREFIX = "sciml_gen_"


def cache_dir():
    d = os.environ.get("SCIML_CACHE_DIR") or os.path.join(Path.home(), ".cache", "sciml-nets")
    path = Path(d)
    path.mkdir(parents=True, exist_ok=True)
    return path


def module_name(source):
    return PREFIX + hashlib.sha256(source.encode()).hexdigest()[:20]


def build_module(source):
    """Import `source` as a module written under `cache_dir()`; the same text gives the same module.

    Returns the module (already imported modules are reused).
    """
    name = module_name(source)
    if name in sys.modules:
        return sys.modules[name]
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        # Write then rename: a concurrent process never imports half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def template_source(module):
    """The text of a template module, to be pasted into generated source.

    Templates are ordinary, importable, linted modules; the lines between
    ``# --- template begin`` and ``# --- template end`` are what gets pasted
    (above them sit the imports that make the file valid on its own).
    """
    text = Path(module.__file__).read_text()
    begin = text.index("# --- template begin")
    end = text.index("# --- template end")
    return text[begin:end]
