"""Kept for the commands recorded in results/*/table.md: the same as ``mutual-rl compare ...``."""

import sys

from mutual_rl.cli import main

if __name__ == "__main__":
    main(["compare", *sys.argv[1:]])
