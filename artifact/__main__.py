"""python -m artifact: the command line (artifact/cli/)."""

import sys

from artifact.cli import main

if __name__ == "__main__":
    sys.exit(main())
