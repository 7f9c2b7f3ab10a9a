"""``python -m airgraph``: the ``airgraph`` command."""

from airgraph.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
