"""A FastAPI flash sale with aiolock (see app.py)."""
