"""An async queue worker with per-key locks (see worker.py)."""
