"""The benchmarks (`python -m benchmarks.<name>`, see README.md here).

They time the compiled engine: its first calls are not run interpreted while it compiles
(`sciml._tier`), in this process and in those it starts, unless a benchmark says so.
"""

import os

os.environ.setdefault("SCIML_INTERPRET", "0")
