"""``python -m fedlab reproduce ...``: see :mod:`fedlab.reproduce`."""
import sys

from .reproduce import main

if __name__ == "__main__":
    sys.exit(main())
