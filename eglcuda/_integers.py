"""Integers and flags as users pass them.

Sizes, counts, ordinals and timeouts come from configuration files, NumPy arrays and shapes as
often as from literals: a ``numpy.int64`` width is as good as an ``int`` one. Every argument
checked as an integer goes through :func:`as_int`, which takes any :class:`numbers.Integral`
(``int``, its subclasses, NumPy's integers) and refuses ``bool``, floats and strings, so that a
checked value reaching cffi, a struct or JSON is always a plain ``int``. A flag is ``True`` or
``False`` (NumPy's ``bool_`` too): :func:`check_flag` refuses the string ``"no"`` or a number, whose
truth would silently turn an option on.
"""
from __future__ import annotations

import numbers

from .errors import UsageError, shown


def as_int(value: object) -> int | None:
    """``value`` as a plain ``int`` if it is an integer of any kind (not a ``bool``), else None."""
    if value.__class__ is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def is_bool(value: object) -> bool:
    """Whether ``value`` is a ``bool`` or NumPy's ``bool_`` (not a :class:`numbers.Number`, yet
    ``int()`` takes it)."""
    if value is True or value is False:
        return True
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")


def check_flag(value: object, what: str) -> bool:
    """``value`` as a plain ``bool`` if it is one (NumPy's ``bool_`` too), else
    :class:`UsageError` naming ``what``."""
    if value is True or value is False:
        return value
    if is_bool(value):
        return bool(value)
    raise UsageError(f"{what} is True or False, got {shown(value)}")
