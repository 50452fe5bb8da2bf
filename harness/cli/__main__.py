"""``python -m harness.cli``: the same as the ``routerbench`` command."""

from . import main

main()
