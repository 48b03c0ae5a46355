"""Optimistic version-checked updates compared with a lock (see cas.py)."""
