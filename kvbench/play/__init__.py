"""``kvbench play``: state.py (the exercise on the real caches, no screen), app.py (the Textual app)."""
