"""Integers as users pass them.

Sizes, counts, ordinals and timeouts come from configuration files, NumPy arrays and shapes as
often as from literals: a ``numpy.int64`` width is as good as an ``int`` one. Every argument
checked as an integer goes through :func:`as_int`, which takes any :class:`numbers.Integral`
(``int``, its subclasses, NumPy's integers) and refuses ``bool``, floats and strings, so that a
checked value reaching cffi, a struct or JSON is always a plain ``int``.
"""
from __future__ import annotations

import numbers


def as_int(value: object) -> int | None:
    """``value`` as a plain ``int`` if it is an integer of any kind (not a ``bool``), else None."""
    if value.__class__ is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None
