"""A written model lowered for one runtime of :mod:`..runtimes`'s table: :func:`.ladder.lower_for`."""
from .ladder import lower_for

__all__ = ["lower_for"]
