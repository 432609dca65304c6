"""What ingest and publish tasks tell OpenLineage: sources read and views published.

With the OpenLineage provider installed and a transport configured (``[openlineage]``),
each task's events carry its real inputs and outputs, never the warehouse's internal
batches:

- ``ingest.<source>`` reads the source where it lives (a landing directory, a table of
  a database: the connector's ``dataset``) and writes the circuit's source,
  ``dbspark://<circuit>`` / ``sources.<source>``;
- ``publish`` reads the circuit's sources and writes each view's Delta table where it
  is published (``file`` and its path, or ``s3://<bucket>`` and its key), each with its
  columns as a schema facet.

The tasks report through Airflow's hook lineage collector, which the OpenLineage
provider reads when a task ends; without the provider (or with it disabled) the
collector does nothing. Each reported Airflow asset has the ``dbspark`` scheme and
carries its OpenLineage identity in its ``extra``; :func:`to_openlineage`, registered in
the provider info (``asset-uris``), turns it into the OpenLineage dataset.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from dbspark.core.types import Schema
from dbspark.orchestration.airflow.assets import ASSET_SCHEME

#: The OpenLineage namespace of a circuit's own datasets (its sources, as ingested).
NAMESPACE_PREFIX = f"{ASSET_SCHEME}://"


def source_uri(circuit: str, source: str) -> str:
    """The Airflow asset URI of ``source`` of ``circuit`` as dbspark holds it (three path
    parts, so no view's ``dbspark://<circuit>/<view>`` is ever the same)."""
    return f"{ASSET_SCHEME}://{circuit}/sources/{source}"


def report_ingest(
    task: object, circuit: str, source: str, read_from: tuple[str, str] | None, schema: Schema
) -> None:
    """Lineage of ``ingest.<source>``: ``read_from`` (the connector's dataset, if it can
    name one) in, the circuit's source out."""
    collector = _collector()
    if read_from is not None:
        collector.add_input_asset(
            context=task,
            uri=source_uri(circuit, source) + "/origin",
            asset_extra=_identity(*read_from, schema),
        )
    collector.add_output_asset(
        context=task, uri=source_uri(circuit, source), asset_extra=_source(circuit, source, schema)
    )


def report_publish(
    task: object,
    circuit: str,
    sources: Mapping[str, Schema],
    views: Mapping[str, tuple[str | None, Schema]],
) -> None:
    """Lineage of ``publish``: the circuit's sources in, each view's table out (``views``:
    the table's location, None when it has none, and the view's schema)."""
    collector = _collector()
    for source, schema in sources.items():
        collector.add_input_asset(
            context=task,
            uri=source_uri(circuit, source),
            asset_extra=_source(circuit, source, schema),
        )
    for view, (location, schema) in views.items():
        if location is None:
            continue
        namespace, name = location_dataset(location)
        collector.add_output_asset(
            context=task,
            uri=f"{ASSET_SCHEME}://{circuit}/{view}",
            asset_extra=_identity(namespace, name, schema),
        )


def location_dataset(location: str) -> tuple[str, str]:
    """(namespace, name) of a table's location by OpenLineage's naming spec: a local path
    is ``file`` and the path; ``s3://bucket/key`` is ``s3://bucket`` and ``key``."""
    parsed = urllib.parse.urlsplit(location)
    if parsed.scheme in ("", "file"):
        return "file", parsed.path if parsed.scheme else location
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def _source(circuit: str, source: str, schema: Schema) -> dict[str, Any]:
    """The identity of ``source`` as the circuit holds it: what ingest writes and publish
    reads."""
    return _identity(NAMESPACE_PREFIX + circuit, f"sources.{source}", schema)


def _identity(namespace: str, name: str, schema: Schema) -> dict[str, Any]:
    return {
        "openlineage_namespace": namespace,
        "openlineage_name": name,
        "columns": [[column, type_name] for column, type_name in schema.fields],
    }


def _collector() -> Any:
    from airflow.sdk.lineage import get_hook_lineage_collector

    return get_hook_lineage_collector()


# --- called by Airflow's providers manager ------------------------------------------------
def sanitize_uri(uri: urllib.parse.SplitResult) -> urllib.parse.SplitResult:
    """Airflow's normalizer of ``dbspark://`` asset URIs: kept as written (a circuit and a
    view, or a source), refused without a circuit."""
    if not uri.netloc:
        raise ValueError("a dbspark:// asset URI names a circuit: dbspark://<circuit>/<view>")
    return uri


def to_openlineage(asset: Any, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a ``dbspark://`` asset this module reported: its
    namespace and name, and its columns as a schema facet. An asset without that identity
    (a view's asset as ``publish`` emits it, say) is the circuit's own dataset."""
    from airflow.providers.common.compat.openlineage.facet import (
        Dataset,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )

    extra = asset.extra or {}
    if "openlineage_name" not in extra:
        parsed = urllib.parse.urlsplit(asset.uri)
        return Dataset(namespace=NAMESPACE_PREFIX + parsed.netloc, name=parsed.path.strip("/"))
    fields = [SchemaDatasetFacetFields(name=n, type=t) for n, t in _columns(extra)]
    return Dataset(
        namespace=str(extra["openlineage_namespace"]),
        name=str(extra["openlineage_name"]),
        facets={"schema": SchemaDatasetFacet(fields=fields)},
    )


def _columns(extra: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    for column in extra.get("columns") or []:
        yield str(column[0]), str(column[1])
