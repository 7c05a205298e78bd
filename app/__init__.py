"""attnmeta.app: the command line, the demo and the benchmark, above every library layer."""
