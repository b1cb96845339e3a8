"""``python -m eerlctl``: the same as the ``eerlctl`` command."""

from eerlctl.main import main

if __name__ == "__main__":
    raise SystemExit(main())
