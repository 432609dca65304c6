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

``DataFrame`` batches get the same check of names and types (:func:`check_frame`), not
of values. Rows read from files then pass the same checks as Python rows: for upsert
sources NULL keys and two different rows of one key with one watermark are found here
(naming the files that hold them), conflicts with the stored state at ingest.

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
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
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
    FileBatch,
    check_names,
    declared_columns,
    json_line_error,
    wrong_type,
)
from dbspark.engine.spark.compile import spark_type

_CORRUPT = "__corrupt"
_PROBLEM = "__problem"
_MAX_SHOWN = 5


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
        match = reduce(
            lambda a, b: a | b,
            [
                reduce(
                    lambda a, b: a & b,
                    [F.col(c).eqNullSafe(F.lit(v)) for c, v in zip(key_columns, key, strict=True)],
                )
                for key in wanted
            ],
        )
        found = {r[0] for r in self.frame.where(match).select(FILE).distinct().collect()}
        return [f for f in self.files if f in found] or list(self.files)


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
    problems = frame.where(F.col(_PROBLEM).isNotNull()).limit(_MAX_SHOWN).collect()
    if problems:
        _raise_problem(spark, source, problems[0], declared_columns(schema, weighted))
    checked = CheckedFrame(frame.drop(_PROBLEM), batch.paths)
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
    located = raw.withColumn(POSITION, F.lit(None).cast("bigint"))
    shaped = _shaped(located, schema, weighted, keep=[POSITION, _CORRUPT])
    bad = F.when(F.col(_CORRUPT).isNotNull(), F.concat(F.lit("csv\x00"), F.col(_CORRUPT)))
    return _with_problems(shaped, path, weighted, bad).drop(_CORRUPT)


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
    kinds = {name: F.expr(f"schema_of_variant(variant_get(__v, '$.{name}'))") for name in declared}
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
    values = [
        F.expr(f"try_variant_get(__v, '$.{n}', '{spark_type(t).simpleString()}')").alias(n)
        for n, t in declared.items()
    ]
    if weighted:  # an absent weight is 1 (an explicit null is a problem above)
        values[-1] = F.when(kinds[WEIGHT].isNull(), F.lit(1)).otherwise(values[-1]).alias(WEIGHT)
    parsed = lines.select(
        *values,
        F.lit(None).cast("bigint").alias(POSITION),
        F.when(
            problem.isNotNull(), F.concat(F.lit("json\x00"), "value", F.lit("\x00"), problem)
        ).alias(_CORRUPT),
    )
    shaped = _shaped(parsed, schema, weighted, keep=[POSITION, _CORRUPT])
    return _with_problems(shaped, path, weighted, F.col(_CORRUPT)).drop(_CORRUPT)


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


def _raise_problem(spark: SparkSession, source: str, row: Any, declared: dict[str, str]) -> None:
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
    position = row[POSITION]
    where = f"row {position}" if position is not None else "a row"
    raise InputError(source, f"{where}: {rest}", file)


def _line_of(spark: SparkSession, file: str, record: str) -> int | None:
    """The 1-based line of ``file`` that holds ``record`` (read again only on this error path)."""
    whole = _reader(spark).text(file, wholetext=True)
    found = (
        whole.select(F.posexplode(F.split("value", "\n")).alias("pos", "line"))
        .where(F.regexp_replace("line", "\r$", "") == F.lit(record))
        .agg(F.min("pos"))
        .collect()
    )
    value = found[0][0] if found else None
    return None if value is None else int(value) + 1


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
    naming the files that hold them: the same checks Python rows get at ingest, here
    before the epoch opens."""
    frame = checked.frame
    keys, marks, cols = list(spec.key), list(spec.watermark), list(spec.columns)
    null_key = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys])
    nulls = frame.where(null_key).limit(_MAX_SHOWN).collect()
    if nulls:
        files = sorted({r[FILE] for r in nulls if r[FILE] is not None})
        first = nulls[0]
        where = "" if first[POSITION] is None else f" (row {first[POSITION]} of the file)"
        raise BadUpsertRow(
            source,
            ", ".join(files) or checked.file_label(),
            [tuple(r[k] for k in keys) for r in nulls],
            detail=f"NULL in a key column{where}: {shown([first[c] for c in cols])}",
            key_columns=keys,
        )
    ties = (
        frame.dropDuplicates(cols)
        .groupBy(*keys, *marks)
        .count()
        .where(F.col("count") > 1)
        .limit(_MAX_SHOWN)
        .collect()
    )
    if ties:
        offending = [tuple(r[k] for k in keys) for r in ties]
        raise UpsertConflict(
            source,
            ", ".join(checked.files_holding(keys, offending)) or checked.file_label(),
            offending,
            detail="two different rows with the same watermark in one batch",
            key_columns=keys,
        )
