"""Solution cell sources: `reference.py` is the notebook's solution cell, nbgrader markers included."""
