"""Dispatchers turn allocation changes into actions on nodes (see base.py)."""
