"""``routerbench study``: being built (issue 12)."""

COMMANDS = ()
