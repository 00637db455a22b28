"""keelway's tests.

Bytecode is written for what the suite imports, whatever PYTHONDONTWRITEBYTECODE says
(the shared box sets it): with it set, every pytest process (two under `-n 2`, more in
the crash matrix) rewrote and compiled every test module from source again, about 5 s
of each run's collection. This package is imported before any test module is rewritten,
so pytest's assertion rewriter sees the flag cleared and caches its rewrite too.
Processes the suite starts still inherit the variable (the CI compiles keelway's own
modules once for them)."""

import sys

sys.dont_write_bytecode = False
