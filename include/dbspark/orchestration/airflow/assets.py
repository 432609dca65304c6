"""Each published view of a dbspark DAG is an Airflow Asset, an outlet of ``publish``.

The asset of view ``v`` of circuit ``c`` has the URI (and name) ``dbspark://c/v``. The
circuit name, not the DAG id, is the namespace because it is what the data is keyed by
everywhere else: the catalog's epochs, the warehouse and the exported outputs
(``<outputs>/<circuit>/<view>/``); two DAGs running one circuit on one warehouse share
its epochs, hence its views. Airflow accepts a scheme it has no normalizer for as is
(``airflow.sdk.definitions.asset._sanitize_uri``: only ``airflow`` is reserved), so
the URI is stable text a downstream DAG can also name by hand.

A downstream DAG writes ``schedule=view_asset(orders, "region_totals")`` instead of
retyping the URI. Each event that ``publish`` emits carries :func:`event_extra`.

A rebuild that changed a view's outputs (its correction, ``sinks/export.py``) emits an
event of that view's asset too, from the ``rebuild`` task, with
:func:`correction_extra` (``"rebuild": true``). A task's declared outlets all get an
event when it succeeds, so the rebuild task's outlet is the circuit's asset alias
(:func:`rebuild_alias`), through which it emits events of only the views it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.orchestration.intervals import Interval

#: The URI scheme of dbspark's view assets.
ASSET_SCHEME = "dbspark"
#: The asset group shown in the Airflow UI.
ASSET_GROUP = "dbspark"


def view_uri(circuit: str, view: str) -> str:
    """``dbspark://<circuit>/<view>``: the one spelling of a view's asset."""
    return f"{ASSET_SCHEME}://{circuit}/{view}"


def view_asset(circuit: Circuit | Callable[[], Circuit] | str, view: str) -> Any:
    """The Airflow ``Asset`` of ``view`` of ``circuit`` (a ``Circuit``, a function
    returning one, as ``build_dag`` takes, or a circuit's name).

    Given a circuit, an unknown view is a ``ValueError`` naming the circuit's views, so a
    typo in a downstream DAG file is that file's import error rather than a schedule
    that never fires. A bare name is not checked: the consumer need not import the
    producer's circuit."""
    from airflow.sdk import Asset

    if isinstance(circuit, str):
        name = circuit
    else:
        built = circuit() if callable(circuit) and not isinstance(circuit, Circuit) else circuit
        if view not in built.views:
            raise ValueError(
                f"circuit {built.name!r} has no view {view!r} (views: {sorted(built.views)})"
            )
        name = built.name
    uri = view_uri(name, view)
    return Asset(name=uri, uri=uri, group=ASSET_GROUP)


def circuit_assets(circuit: Circuit) -> dict[str, Any]:
    """Every view's asset, by view name (the publish task's outlets)."""
    return {view: view_asset(circuit.name, view) for view in circuit.views}


def event_extra(
    circuit: str, view: str, epoch: int, interval: Interval, export: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``extra`` of the asset event of ``view`` for ``epoch``: flat JSON values, so
    the UI's event list shows them and a consumer reads them without parsing.

    ``export`` is what the publish unit reports per view (``PublishUnit.run``): the
    change's rows and sums of its positive and negative weights, read from the change
    feed's marker; where the view's Delta table is and the version that holds the epoch
    (``DeltaTable(table, version=table_version)``, or ``open_table(table, epoch)``);
    and where the epoch's change directory is."""
    return {
        "circuit": circuit,
        "view": view,
        "epoch": epoch,
        "data_interval_start": interval.start.isoformat(),
        "data_interval_end": interval.end.isoformat(),
        "rows_changed": export["rows"],
        "rows_inserted": export["inserted"],
        "rows_deleted": export["deleted"],
        "table": export["table"],
        "table_version": export["table_version"],
        "changes": export["changes"],
    }


def rebuild_alias(circuit: str) -> Any:
    """The ``AssetAlias`` through which the rebuild task of ``circuit``'s DAG emits the
    events of the views it corrected."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"{ASSET_SCHEME}-rebuild:{circuit}", group=ASSET_GROUP)


def correction_extra(
    circuit: str, view: str, epoch: int, correction: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``extra`` of the event of ``view`` after a rebuild at ``epoch`` corrected its
    outputs. ``correction`` is what the rebuild unit reports per view
    (``ViewCorrection.summary``): the change feed's correction directory (None when the
    feed was right) and the sums of its positive and negative weights, and the table's
    version that applied its correction (None when the table was right) with the
    distinct rows it inserted, updated and deleted."""
    return {"circuit": circuit, "view": view, "epoch": epoch, "rebuild": True, **correction}
