"""The `zebra` command line: one module per command group, each parsing flags and rendering results."""
