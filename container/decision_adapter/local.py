"""``python -m decision_adapter.local`` (what ``make run`` starts): the server's ``local`` command, kept at its
public name."""

from __future__ import annotations

import sys

from .server.local import main

if __name__ == "__main__":
    sys.exit(main())
