"""The consolidator Lambda (``handler.py``)."""
