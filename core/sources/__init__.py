"""Node sources (see base.py)."""
