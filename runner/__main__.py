"""``python -m runner``: the process the sandbox starts."""

import sys

from runner.harness import main

if __name__ == "__main__":
    sys.exit(main())
