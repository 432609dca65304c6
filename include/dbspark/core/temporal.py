"""Reading DATE and TIMESTAMP values from text, and calendar arithmetic on them.

Casts from strings, vector input and SQL literals all read the same ISO forms, a
subset of what Spark's casts read, so that every engine reads them alike:

* a DATE is ``yyyy-[m]m-[d]d``, optionally followed by a space or ``T`` and anything
  (Spark ignores what follows the date);
* a TIMESTAMP is a date with an optional ``[h]h:mm[:ss[.ffffff]]`` after a space or
  ``T``, and an optional zone, ``Z`` or ``+hh:mm``/``-hh:mm``; without one it is UTC
  (dbspark's Spark sessions run with ``spark.sql.session.timeZone=UTC``).

Month arithmetic is Spark's ``add_months``: the day is clamped to the last day of the
target month.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

DATE_SYNTAX = r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([ T].*)?$"
TIMESTAMP_SYNTAX = (
    r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"([ T][0-9]{1,2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?(Z|[+-][0-9]{2}:[0-9]{2})?$"
)
_ZONE = re.compile(r"([+-])([0-9]{2}):([0-9]{2})$")


def parse_date(text: str) -> dt.date | None:
    """The date ``text`` (stripped) names, or None."""
    text = text.strip()
    if not re.match(DATE_SYNTAX, text):
        return None
    year, month, day = re.split(r"[-T ]", text)[:3]
    try:
        return dt.date(int(year), int(month), int(day))
    except ValueError:
        return None


def parse_timestamp(text: str) -> dt.datetime | None:
    """The instant ``text`` (stripped) names, in UTC, or None."""
    text = text.strip()
    if not re.match(TIMESTAMP_SYNTAX, text):
        return None
    zone: dt.tzinfo = dt.UTC
    if text.endswith("Z"):
        text = text[:-1]
    elif (offset := _ZONE.search(text)) is not None:
        sign = -1 if offset.group(1) == "-" else 1
        delta = dt.timedelta(hours=int(offset.group(2)), minutes=int(offset.group(3)))
        zone = dt.timezone(sign * delta)
        text = text[: offset.start()]
    date_part, _, time_part = text.replace("T", " ").partition(" ")
    year, month, day = (int(x) for x in date_part.split("-"))
    hour = minute = second = micro = 0
    if time_part:
        pieces = time_part.split(":")
        hour, minute = int(pieces[0]), int(pieces[1])
        if len(pieces) > 2:
            whole, _, fraction = pieces[2].partition(".")
            second, micro = int(whole), int(fraction.ljust(6, "0")) if fraction else 0
    try:
        moment = dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
    except ValueError:
        return None
    return moment.astimezone(dt.UTC)


def add_months(day: dt.date, months: int) -> dt.date:
    """``day`` moved by ``months``, its day clamped to the target month's last day."""
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    last = calendar.monthrange(year, month + 1)[1]
    return dt.date(year, month + 1, min(day.day, last))
