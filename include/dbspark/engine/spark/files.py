"""Feeding a source from files: read a landing batch with Spark, strictly, before the epoch opens.

A :class:`FileBatch` names files of one format (``parquet``, ``csv`` with a header line,
``jsonl``: one JSON object per line). ``SparkEngine.run_epoch`` accepts it as a source's
batch; ``SparkEngine.check_batch`` reads and checks it before the epoch opens, so a bad
file commits nothing. Every problem is an :class:`~dbspark.engine.batches.InputError`
naming the source, the file and, where it can be found, the line or row and the column.

What a file must hold (the source's *declared schema*):

* an **upsert source**: exactly the user schema's columns;
* a **Z-set source**: the schema's columns plus an optional weight column ``__w``
  (BIGINT, never NULL); without it every row has weight 1. Rows are consolidated, so a
  row appearing twice counts twice and opposite weights cancel.

Columns are matched by name (their order in the file does not matter). A missing column,
an extra column or a column of the wrong type rejects the file. Types must match, except
for safe widening: any integer type to BIGINT, FLOAT and integers up to 32 bits to
DOUBLE, a column of NULLs (Spark's NullType) to any type. Per format:

* **parquet**: the file's own schema is checked (every file on its own), rows are then
  cast to the declared types. Rows are located by their 0-based position in the file.
* **csv**: the header line names the columns; an empty field is NULL; a value that does
  not parse as its column's type, or a line with too many or too few fields, is bad.
  ARRAY columns cannot be held in CSV. Lines are located 1-based, header included.
* **jsonl**: each non-blank line is one JSON object. JSON types map strictly, as in the
  conformance vectors: an integer for BIGINT (``1.0`` and ``"1"`` are not), any number
  for DOUBLE, a string for STRING, ``true``/``false`` for BOOLEAN, arrays for ARRAY. A
  key that is absent is NULL, as in a Python mapping row; an unknown key, a line that is
  not a JSON object and a key that appears twice are bad.

A CSV header that names a column twice (Spark would rename the repeats ``id0``, ``id2``)
or has a field with no name is refused as such. A text file that
:func:`~dbspark.engine.file_batches.check_utf8` did not read (one on another file system)
is checked for UTF-8 by the check of every row that runs anyway: a JSON line's bytes
(``is_valid_utf8``), a CSV row's U+FFFD (which Spark's CSV reader makes of bytes that
are not UTF-8, and which such a file therefore may not hold).

``DataFrame`` batches get the same check of names and types (:func:`check_frame`), not
of values. Rows read from files then pass the same checks as Python rows: for upsert
sources NULL keys and two different rows of one key with one watermark are found here
(naming the files that hold them), conflicts with the stored state at ingest. Spark's
text readers give no line numbers, so a text file's offending line is found only when
the error is raised: the file is read again as lines (:func:`_lines_holding`).

Spark's errors (a missing path, an unreadable Parquet footer) are turned into one line
that names the file instead of a Java stack trace.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any, NoReturn

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dbspark.core.columns import WEIGHT
from dbspark.core.errors import shown, shown_text
from dbspark.core.temporal import parse_date, parse_timestamp
from dbspark.core.types import (
    BIGINT,
    BOOLEAN,
    DATE,
    DOUBLE,
    STRING,
    TIMESTAMP,
    Schema,
    decimal_widens,
    element_type,
    is_array,
    is_decimal,
)
from dbspark.core.upsert import BadUpsertRow, UpsertConflict, UpsertSpec
from dbspark.engine.api import InputError
from dbspark.engine.file_batches import (
    FILE,
    POSITION,
    TEXT_FORMATS,
    FileBatch,
    check_header_fields,
    check_names,
    declared_columns,
    json_line_error,
    located,
    not_utf8,
    renamed_by_reader,
    utf8_checked,
    wrong_type,
)
from dbspark.engine.spark.compile import spark_type

_CORRUPT = "__corrupt"
_PROBLEM = "__problem"
_MAX_SHOWN = 5
#: What Spark's CSV reader makes of bytes that are not UTF-8.
_FFFD = "\ufffd"
#: The problem of a row of a text file that :func:`~dbspark.engine.file_batches.check_utf8`
#: did not read (one on another file system) and that is not UTF-8: the file is read
#: again to say where (:func:`_refuse_not_utf8`).
_NOT_UTF8 = "utf8\x00"
#: Why a line of such a CSV file that is UTF-8 but holds U+FFFD is refused all the same.
_HOLDS_FFFD = (
    "the line holds U+FFFD, which Spark's CSV reader also makes of bytes that are not "
    "UTF-8: a text file read without a UTF-8 check (one on another file system) must not "
    "hold it"
)


@dataclass(frozen=True)
class CheckedFrame:
    """A DataFrame or FileBatch read and checked against its source.

    ``frame`` holds the declared columns in schema order (cast to their types), ``__w``
    for a Z-set source, and the locating columns ``__file``/``__pos`` for file batches.
    It is materialised (a local checkpoint) for file batches, so the files are read once
    and what ingest sees is what was checked.
    """

    frame: DataFrame
    files: tuple[str, ...] = field(default=())
    #: An upsert batch's NULL keys and ties were looked for (``check_rows``): ingest
    #: does not look again.
    rows_checked: bool = False
    #: The files' format (``""`` for a DataFrame) and their declared columns' types: how
    #: to find a row's line, when an error needs it.
    format: str = ""
    declared: tuple[tuple[str, str], ...] = ()

    def rows(self) -> DataFrame:
        """The rows without the locating columns (what the source ingests)."""
        return self.frame.drop(FILE, POSITION)

    def file_label(self) -> str | None:
        """The file (or the files, comma separated) to name in errors, None for DataFrames."""
        return ", ".join(self.files) if self.files else None

    def files_holding(self, key_columns: Sequence[str], keys: Sequence[tuple | None]) -> list[str]:
        """The files that hold rows with one of ``keys`` (for errors found after reading)."""
        wanted = [k for k in keys if k is not None][:50]
        if not self.files or not wanted:
            return list(self.files)
        match = _key_match(key_columns, wanted)
        found = {r[0] for r in self.frame.where(match).select(FILE).distinct().collect()}
        return [f for f in self.files if f in found] or list(self.files)

    def where_holding(
        self, key_columns: Sequence[str], keys: Sequence[tuple | None], files: Sequence[str]
    ) -> str:
        """Where in ``files`` the rows with one of ``keys`` are, worded for an error found
        after reading (``""`` if not known): their rows, or lines (:meth:`where`)."""
        wanted = [k for k in keys if k is not None][:50]
        if not self.files or not wanted:
            return ""
        rows = self.frame.where(_key_match(key_columns, wanted))
        return self.where(rows, key_columns, files, "the offending keys are on ")

    def where(
        self, rows: DataFrame, on: Sequence[str], files: Sequence[str], lead: str = ""
    ) -> str:
        """Where in ``files`` the batch's rows that match a row of ``rows`` in the columns
        ``on`` are, as :func:`~dbspark.engine.file_batches.located` words it: a Parquet
        file's rows are in the batch; a text file is read again for its lines (an error's
        path only)."""
        if not self.files:
            return ""
        if self.format in TEXT_FORMATS:
            spark, fmt, declared = self.frame.sparkSession, self.format, dict(self.declared)
            found = {
                f: [n for n, _ in _lines_holding(spark, f, fmt, declared, rows, on, _MAX_SHOWN + 1)]
                for f in files
            }
            return located(found, "line", files, lead)
        match = reduce(
            lambda a, b: a & b,
            [F.col(f"__f{i}").eqNullSafe(F.col(f"__t{i}")) for i in range(len(on))],
        )
        positions = (
            self.frame.select(
                FILE, POSITION, *[F.col(c).alias(f"__f{i}") for i, c in enumerate(on)]
            )
            .join(
                F.broadcast(rows.select(*[F.col(c).alias(f"__t{i}") for i, c in enumerate(on)])),
                match,
                "left_semi",
            )
            .select(FILE, POSITION)
            .withColumn("__n", F.row_number().over(Window.partitionBy(FILE).orderBy(POSITION)))
            .where(F.col("__n") <= _MAX_SHOWN + 1)
            .collect()
        )
        found = {f: [] for f in files}
        for row in positions:
            if row[FILE] in found and row[POSITION] is not None:
                found[row[FILE]].append(int(row[POSITION]))
        return located(found, "row", files, lead)


def _key_match(key_columns: Sequence[str], keys: Sequence[tuple]) -> Column:
    """Whether a row's ``key_columns`` are one of ``keys`` (NULL matching NULL)."""
    return reduce(
        lambda a, b: a | b,
        [
            reduce(
                lambda a, b: a & b,
                [F.col(c).eqNullSafe(F.lit(v)) for c, v in zip(key_columns, key, strict=True)],
            )
            for key in keys
        ],
    )


# ==================================================================================== types
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def spark_type_fits(dtype: T.DataType, type_name: str) -> bool:
    """Can a column of Spark type ``dtype`` be read as ``type_name`` without losing data?"""
    if isinstance(dtype, T.NullType):
        return True
    if type_name == BIGINT:
        return isinstance(dtype, _INTEGRAL)
    if type_name == DOUBLE:
        return isinstance(
            dtype, (T.FloatType, T.DoubleType, T.ByteType, T.ShortType, T.IntegerType)
        )
    if type_name == STRING:
        return isinstance(dtype, (T.StringType, T.VarcharType, T.CharType))
    if type_name == BOOLEAN:
        return isinstance(dtype, T.BooleanType)
    if type_name == DATE:
        return isinstance(dtype, T.DateType)
    if type_name == TIMESTAMP:  # an instant: a Parquet timestamp adjusted to UTC
        return isinstance(dtype, T.TimestampType)
    if is_decimal(type_name):
        return decimal_widens(_exact_digits(dtype), type_name)
    if is_array(type_name):
        return isinstance(dtype, T.ArrayType) and spark_type_fits(
            dtype.elementType, element_type(type_name)
        )
    return False


def _exact_digits(dtype: T.DataType) -> tuple[int, int] | None:
    """``(precision, scale)`` of an exact numeric type (integers as Spark widens them)."""
    if isinstance(dtype, T.DecimalType):
        return dtype.precision, dtype.scale
    digits = {T.ByteType: 3, T.ShortType: 5, T.IntegerType: 10, T.LongType: 20}
    for kind, precision in digits.items():
        if isinstance(dtype, kind):
            return precision, 0
    return None


def _check_types(
    source: str, schema: Schema, dtypes: T.StructType, weighted: bool, file: str | None, what: str
) -> None:
    declared = declared_columns(schema, weighted)
    for f in dtypes.fields:
        if not spark_type_fits(f.dataType, declared[f.name]):
            got = f.dataType.simpleString().upper()
            raise wrong_type(source, what, f.name, declared[f.name], got, file)


def _shaped(
    frame: DataFrame, schema: Schema, weighted: bool, keep: Sequence[str] = ()
) -> DataFrame:
    """The declared columns in order, cast to their types (``__w`` = 1 when absent), then
    the ``keep`` columns unchanged."""
    columns = [F.col(n).cast(spark_type(t)).alias(n) for n, t in schema.fields]
    if weighted:
        weight = F.col(WEIGHT) if WEIGHT in frame.columns else F.lit(1)
        columns.append(weight.cast("bigint").alias(WEIGHT))
    return frame.select(*columns, *[F.col(c) for c in keep])


def check_frame(source: str, schema: Schema, frame: DataFrame, *, weighted: bool) -> DataFrame:
    """Check a DataFrame batch's column names and types; return it shaped for the source.

    Names must be the declared ones (plus optionally ``__w`` for a Z-set source), types
    must fit (:func:`spark_type_fits`). Values are not looked at here (that costs a job):
    NULL weights and upsert problems are found by :func:`check_rows` and at ingest.
    """
    check_names(source, schema, frame.columns, weighted, None, "the DataFrame")
    _check_types(source, schema, frame.schema, weighted, None, "the DataFrame")
    return _shaped(frame, schema, weighted)


# ==================================================================================== errors
_CONDITION = re.compile(r"\[([A-Z_.]+)\]\s*(.*)")


def spark_error_summary(error: BaseException) -> str:
    """One line out of a Spark error: its condition and first sentence, no stack trace."""
    text = str(error)
    for line in text.splitlines():
        match = _CONDITION.search(line)
        if match:
            message = re.sub(r"\s*SQLSTATE: \w+\.?", "", match.group(2)).strip()
            return f"[{match.group(1)}] {message}"[:400]
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)
    return first[:400]


def _is_missing_path(error: BaseException) -> bool:
    text = str(error)
    return "PATH_NOT_FOUND" in text or "Path does not exist" in text


# ==================================================================================== reading
def load_files(
    spark: SparkSession,
    source: str,
    schema: Schema,
    batch: FileBatch,
    *,
    weighted: bool,
    upsert: UpsertSpec | None = None,
) -> CheckedFrame:
    """Read ``batch`` against the source's schema, check every row, and materialise it.

    Raises :class:`InputError` (or, for upsert sources, ``BadUpsertRow`` /
    ``UpsertConflict``) naming the source and the file before anything is written.
    """
    reader = {"parquet": _read_parquet, "csv": _read_csv, "jsonl": _read_jsonl}[batch.format]
    parts = [reader(spark, source, schema, path, weighted) for path in batch.paths]
    frame = reduce(DataFrame.unionByName, parts)
    try:
        frame = frame.localCheckpoint()
    except Exception as error:  # a file that fails only when its data is read
        _blame_unreadable(source, parts, batch.paths, error)
        raise AssertionError("unreachable") from error
    declared = declared_columns(schema, weighted)
    problems = frame.where(F.col(_PROBLEM).isNotNull()).limit(_MAX_SHOWN).collect()
    if problems:
        _raise_problem(spark, source, problems[0], declared, frame, batch.format)
    typed = tuple(declared.items())
    checked = CheckedFrame(frame.drop(_PROBLEM), batch.paths, False, batch.format, typed)
    if upsert is not None:
        check_rows(source, checked, upsert)
        checked = replace(checked, rows_checked=True)
    return checked


def _blame_unreadable(
    source: str, parts: Sequence[DataFrame], paths: Sequence[str], error: Exception
) -> None:
    """Find which file fails on its own (the error of the whole read does not say)."""
    if len(parts) == 1:
        raise InputError(
            source, f"cannot be read: {spark_error_summary(error)}", paths[0]
        ) from None
    for part, path in zip(parts, paths, strict=True):
        try:
            part.write.format("noop").mode("overwrite").save()
        except Exception as own:
            raise InputError(source, f"cannot be read: {spark_error_summary(own)}", path) from None
    raise InputError(
        source, f"cannot be read: {spark_error_summary(error)}", ", ".join(paths)
    ) from None


def _reader(spark: SparkSession) -> Any:
    """``spark.read`` that takes a path literally: ``a[1].csv`` is that file, where Spark
    would glob it and read ``a1.csv`` instead (an internal option every file source
    honours, also through Spark Connect)."""
    return spark.read.option("__globPaths__", "false")


def _open(source: str, path: str, read: Any) -> DataFrame:
    try:
        return read()
    except Exception as error:
        if _is_missing_path(error):
            raise InputError(source, "the file does not exist", path) from None
        raise InputError(source, f"cannot be read: {spark_error_summary(error)}", path) from None


def _read_parquet(
    spark: SparkSession, source: str, schema: Schema, path: str, weighted: bool
) -> DataFrame:
    raw = _open(source, path, lambda: _reader(spark).parquet(path))
    check_names(source, schema, raw.columns, weighted, path, "the file")
    _check_types(source, schema, raw.schema, weighted, path, "the file")
    located = raw.select("*", F.col("_metadata.row_index").alias(POSITION))
    shaped = _shaped(located, schema, weighted, keep=[POSITION])
    return _with_problems(shaped, path, weighted, F.lit(None).cast("string"))


def _read_csv(
    spark: SparkSession, source: str, schema: Schema, path: str, weighted: bool
) -> DataFrame:
    arrays = [n for n, t in schema.fields if is_array(t)]
    if arrays:
        raise InputError(
            source, f"CSV cannot hold the ARRAY column(s) {arrays}; use parquet or jsonl", path
        )
    header = _open(source, path, lambda: _reader(spark).option("header", True).csv(path).columns)
    if not header:
        raise InputError(source, "the CSV file has no header line", path)
    if renamed_by_reader(header):  # a repeated or empty field? Ask the header line itself.
        case_sensitive = str(spark.conf.get("spark.sql.caseSensitive", "false")).lower()
        check_header_fields(
            source, _header_fields(spark, path), path, case_sensitive=case_sensitive == "true"
        )
    if not utf8_checked(path) and any(_FFFD in name for name in header):
        _refuse_not_utf8(spark, source, path)
    check_names(source, schema, header, weighted, path, "the header")
    declared = declared_columns(schema, weighted)
    # Read in the header's order: Spark applies a CSV schema by position.
    fields = [T.StructField(n, spark_type(declared[n]), True) for n in header]
    fields.append(T.StructField(_CORRUPT, T.StringType(), True))
    raw = _open(
        source,
        path,
        lambda: (
            _reader(spark)
            .schema(T.StructType(fields))
            .option("header", True)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", _CORRUPT)
            .csv(path)
        ),
    )
    lined = raw.withColumn(POSITION, F.lit(None).cast("bigint"))
    shaped = _shaped(lined, schema, weighted, keep=[POSITION, _CORRUPT])
    bad = F.when(F.col(_CORRUPT).isNotNull(), F.concat(F.lit("csv\x00"), F.col(_CORRUPT)))
    if not utf8_checked(path):  # Spark read U+FFFD for what is not UTF-8: refuse it
        texts = [_CORRUPT, *(n for n, t in schema.fields if t == STRING)]
        mangled = reduce(lambda a, b: a | b, [F.col(n).contains(_FFFD) for n in texts])
        bad = F.when(mangled, F.lit(_NOT_UTF8)).otherwise(bad)
    return _with_problems(shaped, path, weighted, bad).drop(_CORRUPT)


def _header_fields(spark: SparkSession, path: str) -> list[str | None]:
    """The fields of a CSV file's header line as Spark's parser splits them (its first
    non-blank line, read with no header), not as its reader renames them."""
    first = _reader(spark).option("header", False).csv(path).limit(1).collect()
    return list(first[0]) if first else []


def _json_type_pattern(type_name: str) -> str:
    """A regex over ``schema_of_variant`` output for the JSON values a column accepts
    (a DATE, TIMESTAMP or DECIMAL is a string, as in the conformance vectors; a DECIMAL
    may also be a JSON number)."""
    if type_name in (DATE, TIMESTAMP):
        return "STRING"
    if is_decimal(type_name):
        return r"(STRING|BIGINT|DECIMAL\(\d+,\d+\))"
    if type_name == BIGINT:
        return "BIGINT"
    if type_name == DOUBLE:
        return r"(BIGINT|DOUBLE|FLOAT|DECIMAL\(\d+,\d+\))"
    if type_name == STRING:
        return "STRING"
    if type_name == BOOLEAN:
        return "BOOLEAN"
    if is_array(type_name):
        return f"ARRAY<(VOID|{_json_type_pattern(element_type(type_name))})>"
    raise TypeError(type_name)


def _read_jsonl(
    spark: SparkSession, source: str, schema: Schema, path: str, weighted: bool
) -> DataFrame:
    text = _open(source, path, lambda: _reader(spark).text(path))
    declared = declared_columns(schema, weighted)
    lines = text.where(F.trim("value") != "").select(
        "value", F.expr("try_parse_json(value)").alias("__v")
    )
    kinds = _json_kinds(declared)
    keys = F.expr("json_object_keys(value)")
    unknown = F.array_except(keys, F.array(*[F.lit(n) for n in declared]))
    problem = (
        F.when(F.col("__v").isNull(), F.lit("not valid JSON (or a key appears twice)"))
        .when(keys.isNull(), F.lit("not a JSON object"))
        .when(
            F.size(unknown) > 0,
            F.concat(
                F.lit("unknown key(s) "),
                F.array_join(unknown, ", "),
                F.lit(f"; the source declares {schema}"),
            ),
        )
    )
    for name, type_name in declared.items():
        pattern = f"^(VOID|{_json_type_pattern(type_name)})$"
        value = F.expr(f"to_json(variant_get(__v, '$.{name}'))")
        wrong = kinds[name].isNotNull() & ~kinds[name].rlike(pattern)
        if type_name in (DATE, TIMESTAMP) or is_decimal(type_name):
            # A string that does not read as the type (or a number too wide) is bad input,
            # not a NULL.
            read = F.expr(
                f"try_variant_get(__v, '$.{name}', '{spark_type(type_name).simpleString()}')"
            )
            wrong = wrong | ((kinds[name] != "VOID") & read.isNull())
        problem = problem.when(
            wrong, F.concat(F.lit(f"column {name!r} is {type_name.upper()}, got "), value)
        )
    if weighted:
        problem = problem.when(kinds[WEIGHT] == "VOID", F.lit(f"the weight {WEIGHT!r} is null"))
    bad = F.when(problem.isNotNull(), F.concat(F.lit("json\x00"), "value", F.lit("\x00"), problem))
    if not utf8_checked(path):  # the text reader keeps the bytes: are they UTF-8?
        bad = F.when(~F.expr("is_valid_utf8(value)"), F.lit(_NOT_UTF8)).otherwise(bad)
    parsed = lines.select(
        *_json_values(declared, weighted),
        F.lit(None).cast("bigint").alias(POSITION),
        bad.alias(_CORRUPT),
    )
    shaped = _shaped(parsed, schema, weighted, keep=[POSITION, _CORRUPT])
    return _with_problems(shaped, path, weighted, F.col(_CORRUPT)).drop(_CORRUPT)


def _json_kinds(declared: dict[str, str]) -> dict[str, Column]:
    """Each declared column's JSON type in the line's ``__v`` (``schema_of_variant``)."""
    return {n: F.expr(f"schema_of_variant(variant_get(__v, '$.{n}'))") for n in declared}


def _json_values(declared: dict[str, str], weighted: bool) -> list[Column]:
    """The declared columns' values out of a JSON line's ``__v`` (``try_parse_json``)."""
    values = [
        F.expr(f"try_variant_get(__v, '$.{n}', '{spark_type(t).simpleString()}')").alias(n)
        for n, t in declared.items()
    ]
    if weighted:  # an absent weight is 1 (an explicit null is a problem, see _read_jsonl)
        absent = _json_kinds({WEIGHT: BIGINT})[WEIGHT].isNull()
        values[-1] = F.when(absent, F.lit(1)).otherwise(values[-1]).alias(WEIGHT)
    return values


def _with_problems(frame: DataFrame, path: str, weighted: bool, bad: Column) -> DataFrame:
    """Add ``__file`` and the row's problem (NULL when the row is fine), encoded as
    ``kind NUL detail`` so that the error path knows how to locate it."""
    problem = bad
    if weighted:
        problem = F.coalesce(
            problem,
            F.when(F.col(WEIGHT).isNull(), F.lit(f"row\x00the weight {WEIGHT!r} is NULL")),
        )
    return frame.withColumn(FILE, F.lit(path)).withColumn(_PROBLEM, problem)


def _raise_problem(
    spark: SparkSession,
    source: str,
    row: Any,
    declared: dict[str, str],
    frame: DataFrame,
    fmt: str,
) -> None:
    file = row[FILE]
    kind, _, rest = row[_PROBLEM].partition("\x00")
    if kind == "json":
        record, _, message = rest.partition("\x00")
        line = _line_of(spark, file, record)
        where = f"line {line}" if line else "a line"
        raise json_line_error(source, where, message, record, file)
    if kind == "csv":
        line = _line_of(spark, file, rest)
        where = f"line {line}" if line else "a line"
        header = _reader(spark).option("header", True).csv(file).columns
        detail = csv_column_detail(header, declared, rest) or "malformed CSV line"
        raise InputError(source, f"{where}: {detail}: {shown_text(rest)}", file)
    if row[_PROBLEM] == _NOT_UTF8:
        _refuse_not_utf8(spark, source, file)
    position = row[POSITION]
    where = f"row {position}" if position is not None else "a row"
    if position is None and fmt in TEXT_FORMATS:  # find its line (this error's path only)
        same = frame.where((F.col(FILE) == file) & (F.col(_PROBLEM) == row[_PROBLEM]))
        hits = _lines_holding(spark, file, fmt, declared, same, list(declared), limit=1)
        where = f"line {hits[0][0]}" if hits else "a line"
    raise InputError(source, f"{where}: {rest}", file)


def _refuse_not_utf8(spark: SparkSession, source: str, file: str) -> NoReturn:
    """Refuse a text file Spark read without a UTF-8 check, whose rows showed bytes that
    are not UTF-8 (or U+FFFD, what the CSV reader makes of them), naming its first such
    line as :func:`~dbspark.engine.file_batches.check_utf8` would: the file is read again,
    as lines of bytes, on this error's path only."""
    found = None
    try:
        lines = _text_lines(spark, file)
        bad = ~F.expr("is_valid_utf8(value)") | F.col("value").contains(_FFFD)
        hits = (
            lines.where(bad)
            .select(_BLOCK, _ID, F.col("value").cast("binary").alias("bytes"))
            .orderBy(_BLOCK, _ID)
            .limit(1)
            .collect()
        )
        if hits:
            line, _ = _line_numbers(lines, F.lit(False))
            found = int(line(hits[0][_BLOCK], hits[0][_ID])), bytes(hits[0]["bytes"])
    except Exception:  # worth raising without its line
        pass
    if found is None:
        raise InputError(
            source, "a line is not UTF-8 or holds U+FFFD; text files must be UTF-8", file
        )
    number, text = found
    error = not_utf8(source, file, number, text)
    raise error or InputError(source, f"line {number}: {_HOLDS_FFFD}", file)


# Where a row of a text file is. Spark's text readers give no line number, so on an error's
# path only the file is read again as lines, each with its block's start and an id that
# rises along the block, and parsed as the reader parsed it; the lines that make the
# offending rows are found by a join on their values.
_BLOCK = "__block"
_ID = "__id"


def _text_lines(spark: SparkSession, path: str) -> DataFrame:
    """The lines of ``path`` as Spark's readers split them (at ``\\n``, ``\\r\\n`` or
    ``\\r``), each with the start of its block and an id rising along the block."""
    return (
        _reader(spark)
        .text(path)
        .select(
            "value",
            F.col("_metadata.file_block_start").alias(_BLOCK),
            F.monotonically_increasing_id().alias(_ID),
        )
    )


def _line_numbers(lines: DataFrame, text: Column) -> Any:
    """A function of ``(block, id)`` to the 1-based line, and the line of the file's
    first line for which ``text`` holds (None if none does). Within a block's task ids
    are consecutive, so a line is the lines of the blocks before it, plus its place in
    its own block."""
    blocks = (
        lines.groupBy(_BLOCK)
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min(_ID).alias("first"),
            F.min(F.when(text, F.col(_ID))).alias("text"),
        )
        .orderBy(_BLOCK)
        .collect()
    )
    before: dict[int, tuple[int, int]] = {}
    seen = 0
    for block in blocks:
        before[block[_BLOCK]] = (seen, block["first"])
        seen += block["n"]

    def line(block: int, id_: int) -> int:
        lines_before, first = before[block]
        return lines_before + (id_ - first) + 1

    firsts = [line(b[_BLOCK], b["text"]) for b in blocks if b["text"] is not None]
    return line, (firsts[0] if firsts else None)


def _line_of(spark: SparkSession, file: str, record: str) -> int | None:
    """The 1-based line of ``file`` that holds ``record`` (read again only on this error path)."""
    lines = _text_lines(spark, file)
    hits = lines.where(F.col("value") == F.lit(record)).orderBy(_BLOCK, _ID).limit(1).collect()
    if not hits:
        return None
    line, _ = _line_numbers(lines, F.lit(False))
    return int(line(hits[0][_BLOCK], hits[0][_ID]))


def _not_blank(fmt: str) -> Column:
    """Whether a line holds a row (or the header) for the reader of ``fmt``: JSON lines
    skip lines of spaces, CSV lines of nothing but control characters and spaces."""
    if fmt == "jsonl":
        return F.trim("value") != ""
    return F.regexp_replace("value", "[\\x00-\\x20]", "") != ""


def _parsed_lines(
    lines: DataFrame, fmt: str, declared: dict[str, str], header: Sequence[str]
) -> DataFrame:
    """Each row-holding line's values as the reader of ``fmt`` makes them, with
    ``__block`` and ``__id`` (a CSV file's header line parses too: see _lines_holding)."""
    rows = lines.where(_not_blank(fmt))
    weighted = WEIGHT in declared
    if fmt == "jsonl":
        parsed = rows.select(_BLOCK, _ID, F.expr("try_parse_json(value)").alias("__v"))
        values = _json_values(declared, weighted)
    else:
        ddl = ", ".join(
            f"`{n.replace('`', '``')}` {spark_type(declared[n]).simpleString()}" for n in header
        )
        parsed = rows.select(_BLOCK, _ID, F.from_csv(F.col("value"), ddl).alias("__r"))
        values = [
            F.col("__r").getField(n).alias(n)
            if n in header
            else F.lit(1).cast("bigint").alias(n)  # a weight column left out is 1
            for n in declared
        ]
    return parsed.select(
        _BLOCK,
        _ID,
        *[v.cast(spark_type(t)) for v, t in zip(values, declared.values(), strict=True)],
    ).toDF(_BLOCK, _ID, *declared)


def _lines_holding(
    spark: SparkSession,
    file: str,
    fmt: str,
    declared: dict[str, str],
    wanted: DataFrame,
    on: Sequence[str],
    limit: int = _MAX_SHOWN,
) -> list[tuple[int, Any]]:
    """The first ``limit`` lines of the text ``file`` (1-based, as ``(line, row)`` where
    ``row`` holds the line's values) whose values in the columns ``on`` are those of a
    row of ``wanted`` (NULL matching NULL). Reads the file again: an error's path only.
    Nothing found, or a file that cannot be read again, is ``[]`` (the error is raised
    without the line)."""
    try:
        header: Sequence[str] = ()
        if fmt == "csv":
            header = _reader(spark).option("header", True).csv(file).columns
        lines = _text_lines(spark, file)
        parsed = _parsed_lines(lines, fmt, declared, header)
        left = parsed.select(
            _BLOCK, _ID, *[F.col(f"`{c}`").alias(f"__l{i}") for i, c in enumerate(declared)]
        )
        index = {c: i for i, c in enumerate(declared)}
        right = wanted.select(*[F.col(f"`{c}`").alias(f"__r{index[c]}") for c in on]).distinct()
        match = reduce(
            lambda a, b: a & b,
            [F.col(f"__l{index[c]}").eqNullSafe(F.col(f"__r{index[c]}")) for c in on],
        )
        hits = (
            left.join(F.broadcast(right), match, "left_semi")
            .orderBy(_BLOCK, _ID)
            .limit(limit + 1)
            .collect()
        )
        if not hits:
            return []
        line, header_line = _line_numbers(lines, _not_blank(fmt))
    except Exception:  # the error is worth raising without its line
        return []
    found = []
    for hit in hits:
        number = int(line(hit[_BLOCK], hit[_ID]))
        if fmt == "csv" and number == header_line:
            continue  # the header line, parsed as a row by chance
        found.append((number, {c: hit[f"__l{index[c]}"] for c in declared}))
    return found[:limit]


_TOKEN_OK = {
    BIGINT: lambda s: re.fullmatch(r"\s*[+-]?\d+\s*", s) is not None,
    DOUBLE: lambda s: _is_float(s),
    BOOLEAN: lambda s: s.strip().lower() in ("true", "false"),
    STRING: lambda s: True,
    DATE: lambda s: parse_date(s) is not None,
    TIMESTAMP: lambda s: parse_timestamp(s) is not None,
}


def _token_ok(kind: str, token: str) -> bool:
    if is_decimal(kind):
        return re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)\s*", token) is not None
    return _TOKEN_OK.get(kind, lambda s: True)(token)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_column_detail(header: Sequence[str], declared: dict[str, str], record: str) -> str | None:
    """The first field of ``record`` that cannot be its column's type, as a message."""
    try:
        tokens = next(csv.reader(io.StringIO(record)))
    except (csv.Error, StopIteration):
        return None
    if len(tokens) != len(header):
        return f"{len(tokens)} fields, the header has {len(header)}"
    for name, token in zip(header, tokens, strict=True):
        kind = declared.get(name, STRING)
        if token != "" and not _token_ok(kind, token):
            return f"column {name!r} is {kind.upper()}, got {shown(token)}"
    return None


# ==================================================================================== upserts
def check_rows(source: str, checked: CheckedFrame, spec: UpsertSpec) -> None:
    """NULL keys and ties (two different rows of one key and one watermark) in a batch,
    naming the files that hold them and where in them (a Parquet file's rows; a text
    file's lines, found again on this error's path only): the same checks Python rows get
    at ingest, here before the epoch opens."""
    frame = checked.frame
    keys, marks, cols = list(spec.key), list(spec.watermark), list(spec.columns)
    null_key = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys])
    nulls = frame.where(null_key).limit(_MAX_SHOWN).collect()
    if nulls:
        files = sorted({r[FILE] for r in nulls if r[FILE] is not None})
        first = nulls[0]
        values = [first[c] for c in cols]
        where = ""
        of = "the file" if len(files) <= 1 else first[FILE]
        if first[POSITION] is not None:
            where = f" (row {first[POSITION]} of {of})"
        elif first[FILE] is not None and checked.format in TEXT_FORMATS:
            declared = dict(checked.declared) or dict(zip(cols, spec.types, strict=True))
            same = frame.where(null_key & (F.col(FILE) == first[FILE]))
            spark = frame.sparkSession
            hits = _lines_holding(spark, first[FILE], checked.format, declared, same, cols, 1)
            if hits:  # the file's first such line, and the row it holds
                where = f" (line {hits[0][0]} of {of})"
                values = [hits[0][1][c] for c in cols]
        raise BadUpsertRow(
            source,
            ", ".join(files) or checked.file_label(),
            [tuple(r[k] for k in keys) for r in nulls],
            detail=f"NULL in a key column{where}: {shown(values)}",
            key_columns=keys,
        )
    tied = frame.dropDuplicates(cols).groupBy(*keys, *marks).count().where(F.col("count") > 1)
    ties = tied.limit(_MAX_SHOWN).collect()
    if ties:
        offending = [tuple(r[k] for k in keys) for r in ties]
        holding = checked.files_holding(keys, offending)
        on = [*keys, *(m for m in marks if m not in keys)]
        where = checked.where(tied, on, holding)
        raise UpsertConflict(
            source,
            ", ".join(holding) or checked.file_label(),
            offending,
            detail=f"two different rows with the same watermark in one batch{where}",
            key_columns=keys,
        )
