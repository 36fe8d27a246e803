"""``python -m mutual_rl.compare ...``: the same as ``mutual-rl compare ...``."""

from mutual_rl.compare.cli import main

main(prog="python -m mutual_rl.compare")
