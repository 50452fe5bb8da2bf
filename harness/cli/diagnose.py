"""``routerbench diagnose``: being built (issue 12)."""

COMMANDS = ()
