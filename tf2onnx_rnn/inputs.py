"""Seeded random inputs for checking a converted model against its source."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .errors import ConversionError


def random_inputs(specs: Sequence, seed: int = 0, sizes: Optional[dict] = None) -> list:
    """Seeded random arrays for (name, shape, numpy dtype) specs; dynamic dims take ``sizes``."""
    rng = np.random.default_rng(seed)
    sizes = sizes or {}
    arrays = []
    for _name, shape, dtype in specs:
        concrete = [sizes.get(axis, 3 if axis == 0 else 5) if d is None or d < 0 else d
                    for axis, d in enumerate(shape)]
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(concrete).astype(dtype))
        elif dtype.kind in "iu":
            arrays.append(rng.integers(0, 3, concrete).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.random(concrete) < 0.7)
        else:
            raise ConversionError(f"cannot make random inputs of type {dtype}")
    return arrays
