"""Scores and verdicts over nodes: whole-GPU fit, network locality, and where a share of a GPU goes."""
