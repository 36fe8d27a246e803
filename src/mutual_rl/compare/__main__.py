"""``python -m mutual_rl.compare ...``: the same as ``mutual-rl compare ...``."""

import sys

from mutual_rl.cli import main

if __name__ == "__main__":
    main(["compare", *sys.argv[1:]])
