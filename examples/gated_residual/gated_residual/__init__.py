"""The gated_residual router for routerbench (its code: gated_residual/router.py)."""
