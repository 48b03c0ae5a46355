"""Orders paid exactly once: a lock per order from the decorator and the FastAPI dependency,
in a FastAPI app, an aiohttp app and queue workers (see README.md)."""
