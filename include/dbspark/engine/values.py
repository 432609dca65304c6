"""Python values in and out of a tier's columns.

The reference engine holds a DOUBLE as a float (one NaN object), an array as a tuple;
a tier's columns take floats for DOUBLE (Python ints are valid DOUBLE values in
dbspark) and lists for arrays. Both tiers convert with these, so a value collected
from either compares equal to the reference's.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

from dbspark.core.types import DOUBLE, TIMESTAMP, element_type, is_array, is_decimal

_NAN = float("nan")


def to_column_value(value: Any, type_name: str) -> Any:
    """A Python value as a column of ``type_name`` takes it."""
    if value is None:
        return None
    if type_name == DOUBLE:
        return float(value)
    if is_decimal(type_name) and not isinstance(value, Decimal):
        return Decimal(value)
    if is_array(type_name):
        inner = element_type(type_name)
        return [to_column_value(v, inner) for v in value]
    return value


def from_column_value(value: Any, type_name: str) -> Any:
    """A collected value as the reference engine holds it (arrays as tuples, one NaN)."""
    if value is None:
        return None
    if type_name == DOUBLE and math.isnan(value):
        return _NAN
    if type_name == TIMESTAMP:
        # Arrow gives an aware datetime; Spark's Row a naive one in the driver's local time.
        return value.astimezone(dt.UTC)
    if is_array(type_name):
        inner = element_type(type_name)
        return tuple(from_column_value(v, inner) for v in value)
    return value
