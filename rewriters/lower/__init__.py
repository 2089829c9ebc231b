"""A written model lowered for one runtime of :mod:`..runtimes`'s table: :func:`.ladder.lower_for`."""
from .ladder import check, lower_for

__all__ = ["check", "lower_for"]
