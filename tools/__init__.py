"""Scripts for measuring and checking attnmeta on the lent GPU, run as files (python tools/NAME.py); a package
so that one script's helpers import by name ahead of any other tools package on the path."""
