"""The bundle's entry point: the same `speculum` command as the installed package."""

import multiprocessing
import sys

from speculum.cli import main

if __name__ == "__main__":
    # A frozen program must handle multiprocessing's child start itself (Windows, macOS spawn).
    multiprocessing.freeze_support()
    sys.exit(main())
