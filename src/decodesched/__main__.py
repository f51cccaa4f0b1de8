"""``python -m decodesched ...``: the `decodesched` command."""

from decodesched.cli import main

raise SystemExit(main())
