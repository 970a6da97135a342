"""The `zebra` command line: one module per command group, each parsing flags and rendering results.

Every zebra process (the console script, `python -m zebra.cli.rank` of each training rank) imports this package
first, so Python's bytecode cache is set up here, before torch and transformers load (`zebra.core.caches`).
"""

from zebra.core.caches import use_bytecode_cache

use_bytecode_cache()
