"""Runnable examples of aiolock; run them from the repository root (see each README.md)."""
