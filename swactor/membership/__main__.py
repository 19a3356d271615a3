"""``python -m swactor.membership``: run one SWIM member (see `swactor.membership.cli`)."""

from __future__ import annotations

import sys

from swactor.membership.cli import main

if __name__ == "__main__":
    sys.exit(main())
