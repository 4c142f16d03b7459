"""Trajectory replay for RL learners (DESIGN §4): built in a later issue.

The package exists now so that the distribution's three import packages are fixed from the
start; it exports nothing yet.
"""

__all__: list[str] = []
