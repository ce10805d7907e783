"""Entry point for `python -m model_build`."""

from model_build.cli import main

raise SystemExit(main())
