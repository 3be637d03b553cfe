"""Deletion-cost refresher Lambda."""
