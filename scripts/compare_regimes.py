"""Kept for the commands recorded in results/*/table.md: the same as ``mutual-rl compare ...``."""

from mutual_rl.compare.cli import main

if __name__ == "__main__":
    main(prog="python scripts/compare_regimes.py")
