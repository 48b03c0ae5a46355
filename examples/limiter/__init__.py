"""At most N calls at once across workers: a semaphore (see limiter.py)."""
