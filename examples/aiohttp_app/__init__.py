"""An aiohttp flash sale with aiolock (see app.py)."""
