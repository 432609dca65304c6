"""The catalog on SQLite and on a real PostgreSQL: epochs, the commit protocol, queries."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from dbspark.storage import BatchRecord, Catalog, CatalogError, LoopIteration
from dbspark.storage.catalog import UncommittedUnits


def batch(collection: str, time: tuple[int, ...], name: str, rows: int = 10) -> BatchRecord:
    return BatchRecord(
        circuit="c",
        collection=collection,
        kind="trace",
        time=time,
        path=f"c/{collection}/trace/t={'_'.join(map(str, time))}/{name}",
        rows=rows,
        bytes=rows * 100,
        buckets=16,
    )


def snapshot(cat: Catalog) -> tuple:
    """Everything a commit can change, to compare before and after."""
    with cat.engine.connect() as conn:
        return tuple(
            sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM {t}"))), key=repr)
            for t in ("batches", "stage_runs", "frontiers", "loop_iterations")
        )


@pytest.fixture
def cat(catalog: Catalog) -> Catalog:
    catalog.register_circuit("c", "fp1")
    return catalog


def test_tables_and_lookup_indexes_are_created(catalog: Catalog) -> None:
    insp = sa.inspect(catalog.engine)
    tables = set(insp.get_table_names())
    assert {"circuits", "epochs", "batches", "stage_runs", "frontiers", "loop_iterations"} <= tables
    index_cols = {tuple(ix["column_names"]) for ix in insp.get_indexes("batches")}
    assert ("circuit", "collection", "epoch") in index_cols
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("stage_runs")}
    assert ("circuit", "stage", "time") in uniques
    # Opening the same database again finds the tables and keeps the data.
    catalog.register_circuit("x", "f")
    again = Catalog(catalog.url)
    assert again.circuits() == ["x"]
    again.close()


def test_register_circuit_rejects_a_changed_definition(catalog: Catalog) -> None:
    catalog.register_circuit("c", "fp1")
    catalog.register_circuit("c", "fp1")  # same definition: fine
    with pytest.raises(CatalogError, match="definition of circuit 'c' changed") as err:
        catalog.register_circuit("c", "fp2")
    assert "holds state of the old definition" in str(err.value)
    assert catalog.circuit_fingerprint("c") == "fp1"


def test_epochs_open_commit_and_last_committed(cat: Catalog) -> None:
    assert cat.last_committed_epoch("c") == -1
    assert cat.epoch_state("c", 0) is None
    assert cat.open_epoch("c", 0) == "open"
    assert cat.open_epoch("c", 0) == "open"  # idempotent
    assert cat.last_committed_epoch("c") == -1
    assert cat.commit_epoch("c", 0) is True
    assert cat.commit_epoch("c", 0) is False  # twice: no-op
    assert cat.epoch_state("c", 0) == "committed"
    assert cat.open_epoch("c", 0) == "committed"  # re-running a committed epoch
    cat.open_epoch("c", 1)
    assert cat.last_committed_epoch("c") == 0
    cat.commit_epoch("c", 1)
    assert cat.last_committed_epoch("c") == 1
    with pytest.raises(CatalogError, match="never opened"):
        cat.commit_epoch("c", 7)
    with pytest.raises(CatalogError, match="not registered"):
        cat.open_epoch("nope", 0)


def test_an_epoch_commits_only_when_every_planned_unit_committed(cat: Catalog) -> None:
    """Issue 18, finding 6: the close checks the epoch's planned units in its own
    transaction, and names what is missing."""
    planned = {"stages": ["ingest_a", "join_3", "publish"], "loops": ["reach"]}
    cat.open_epoch("c", 0)
    cat.commit("c", "ingest_a", (0,), [batch("n1.input", (0,), "a")])
    cat.commit("c", "loop:reach", (0, 0), loop_iteration=LoopIteration("reach", (0,), 0, 4, False))
    cat.commit("c", "join_3", (1,))  # another epoch's run does not count
    before = snapshot(cat)
    with pytest.raises(UncommittedUnits, match="epoch 0 of circuit 'c' cannot commit") as err:
        cat.commit_epoch("c", 0, **planned)
    assert err.value.missing == ["join_3", "publish", "loop:reach"]
    assert "join_3, publish, loop:reach (not converged)" in str(err.value)
    assert cat.epoch_state("c", 0) == "open" and snapshot(cat) == before
    assert cat.missing_units("c", 0, **planned) == ["join_3", "publish", "loop:reach"]
    with pytest.raises(UncommittedUnits, match="stage join_3 of circuit 'c' cannot run"):
        cat.require_units("c", 0, "stage join_3", stages=["ingest_a"], loops=["reach"])

    cat.commit("c", "loop:reach", (0, 1), loop_iteration=LoopIteration("reach", (0,), 1, 0, True))
    cat.require_units("c", 0, "stage join_3", stages=["ingest_a"], loops=["reach"])
    cat.commit("c", "join_3", (0,))
    with pytest.raises(UncommittedUnits) as err:
        cat.commit_epoch("c", 0, **planned)
    assert err.value.missing == ["publish"]
    cat.commit("c", "publish", (0,))
    assert cat.commit_epoch("c", 0, **planned) is True
    assert cat.commit_epoch("c", 0, **planned) is False  # already committed: a no-op


def test_commit_registers_batches_once(cat: Catalog) -> None:
    assert not cat.stage_done("c", "s1", (0,))
    assert cat.commit("c", "s1", (0,), [batch("n1.trace", (0,), "a"), batch("n1.trace", (0,), "b")])
    assert cat.stage_done("c", "s1", (0,))
    assert not cat.stage_done("c", "s1", (1,))
    assert not cat.stage_done("c", "s1", (0, 0))  # a different time
    got = cat.batches("c", "n1.trace")
    assert [b.path.rsplit("/", 1)[1] for b in got] == ["a", "b"]
    assert all(b.id is not None and b.live and b.buckets == 16 for b in got)
    assert got[0].time == (0,) and got[0].epoch == 0 and got[0].rows == 10

    # The retried task: its work is committed, so the second commit does nothing at all.
    before = snapshot(cat)
    assert (
        cat.commit("c", "s1", (0,), [batch("n1.trace", (0,), "retry")], supersede=[got[0].id])
        is False
    )
    assert snapshot(cat) == before
    assert cat.stage_runs("c") == [("s1", (0,))]


def test_a_failing_commit_rolls_back_everything(cat: Catalog) -> None:
    cat.commit("c", "s0", (0,), [batch("n1.trace", (0,), "a")])
    before = snapshot(cat)
    with pytest.raises(CatalogError, match="supersedes batches"):
        cat.commit(
            "c",
            "compact",
            (1,),
            [batch("n1.trace", (1,), "merged")],
            supersede=[999_999],
            loop_iteration=LoopIteration("loop", (1,), 0, delta_rows=3, converged=False),
            frontiers={"n1.trace": [(1,)]},
        )
    assert snapshot(cat) == before
    assert not cat.stage_done("c", "compact", (1,))
    # A path can be registered only once: the unique constraint also rolls back.
    with pytest.raises(CatalogError):
        cat.commit("c", "s2", (1,), [batch("n2.trace", (1,), "x"), batch("n2.trace", (1,), "x")])
    assert snapshot(cat) == before
    # A batch of an unregistered circuit violates a foreign key (both backends enforce it).
    with pytest.raises(CatalogError):
        cat.commit("nope", "s", (0,), [])
    assert snapshot(cat) == before


def test_supersede_replaces_batches_in_the_same_transaction(cat: Catalog) -> None:
    cat.commit("c", "a0", (0,), [batch("t", (0,), "a")])
    cat.commit("c", "a1", (1,), [batch("t", (1,), "b")])
    ids = [b.id for b in cat.batches("c", "t")]
    assert cat.commit(
        "c",
        "compact:t",
        (1,),
        [batch("t", (1,), "m", rows=5)],
        supersede=ids,
        frontiers={"t": [(1,)]},
    )
    live = cat.batches("c", "t")
    assert [b.path.rsplit("/", 1)[1] for b in live] == ["m"]
    everything = cat.batches("c", "t", live_only=False)
    assert len(everything) == 3
    run_ids = {b.superseded_by for b in everything if not b.live}
    assert len(run_ids) == 1 and None not in run_ids
    assert cat.frontier("c", "t") == [(1,)]
    # Superseding an already superseded batch is refused (and changes nothing).
    with pytest.raises(CatalogError, match="only 0 of them"):
        cat.commit("c", "compact:t", (2,), [], supersede=ids[:1])
    assert [b.path.rsplit("/", 1)[1] for b in cat.batches("c", "t")] == ["m"]


def test_batch_queries_by_epoch_and_time(cat: Catalog) -> None:
    for e in range(4):
        cat.commit(
            "c", f"s{e}", (e,), [batch("t", (e, 0), f"e{e}i0"), batch("t", (e, 1), f"e{e}i1")]
        )
    cat.commit("c", "other", (0,), [batch("u", (0, 0), "u")])

    def names(bs: list[BatchRecord]) -> list[str]:
        return [b.path.rsplit("/", 1)[1] for b in bs]

    assert names(cat.batches("c", "t", epoch=2)) == ["e2i0", "e2i1"]
    assert names(cat.batches("c", "t", max_epoch=1)) == ["e0i0", "e0i1", "e1i0", "e1i1"]
    assert names(cat.batches("c", "t", time=(3, 1))) == ["e3i1"]
    assert names(cat.batches("c", "u")) == ["u"]
    assert cat.batches("c", "t", time=(3,)) == []
    assert cat.collections("c") == ["t", "u"]


def test_operator_batches_are_the_live_deltas_and_traces_in_one_list(cat: Catalog) -> None:
    cat.commit("c", "e0", (0,), [batch("n1.in0", (0,), "a"), batch("n3.input", (0,), "i")])
    cat.commit("c", "e1", (1,), [batch("n1.in0", (1,), "b"), batch("view.v", (1,), "v")])
    old = [b.id for b in cat.batches("c", "n1.in0")]
    cat.commit("c", "compact", (1,), [batch("n1.in0", (1,), "m")], supersede=old[:1])
    cat.register_circuit("d", "fp")
    cat.commit("d", "e0", (0,), [BatchRecord("d", "n1.in0", "trace", (0,), "d/x", 1, 1, 0)])

    listed = cat.operator_batches("c")
    # Not the input logs nor the views (read by name, growing with every epoch), not a
    # superseded batch, not another circuit's; oldest first, like ``batches``.
    assert [b.path.rsplit("/", 1)[1] for b in listed] == ["b", "m"]
    assert listed == cat.batches("c", "n1.in0")


def test_live_batches_of_several_collections_in_one_list(cat: Catalog) -> None:
    cat.commit("c", "e0", (0,), [batch("n1.in0", (0,), "a"), batch("n3.input", (0,), "i")])
    cat.commit("c", "e1", (1,), [batch("n1.in0", (1,), "b"), batch("view.v", (1,), "v")])
    old = [b.id for b in cat.batches("c", "n1.in0")]
    cat.commit("c", "compact", (1,), [batch("n1.in0", (1,), "m")], supersede=old[:1])

    def names(records: list[BatchRecord]) -> list[str]:
        return [b.path.rsplit("/", 1)[1] for b in records]

    # Live only, oldest first, the collections asked for and no other.
    assert names(cat.live_batches("c", ["n1.in0", "view.v"])) == ["b", "v", "m"]
    assert names(cat.live_batches("c", ["n1.in0", "n3.input"], epoch=0)) == ["i"]
    assert cat.live_batches("c", []) == [] and cat.live_batches("d", ["n1.in0"]) == []


def test_frontiers_and_loop_iterations(cat: Catalog) -> None:
    assert cat.frontier("c", "t") is None
    cat.set_frontier("c", "t", [(2, 0), (1, 3)])
    assert cat.frontier("c", "t") == [(1, 3), (2, 0)]
    cat.set_frontier("c", "t", [(3, 0)])
    assert cat.frontier("c", "t") == [(3, 0)]

    for i, rows in enumerate([5, 2, 0]):
        done = rows == 0
        it = LoopIteration(
            "reach",
            (4,),
            i,
            delta_rows=rows,
            converged=done,
            pending_depth=None if done else 3,
            reason="no pending deltas" if done else "",
        )
        assert cat.commit("c", "reach.iterate", (4, i), [], loop_iteration=it)
        assert cat.loop_converged("c", "reach", (4,)) is done
    its = cat.loop_iterations("c", "reach", (4,))
    assert [(x.iteration, x.delta_rows, x.converged) for x in its] == [
        (0, 5, False),
        (1, 2, False),
        (2, 0, True),
    ]
    assert its[2].reason == "no pending deltas" and its[0].pending_depth == 3
    assert cat.loop_iterations("c", "reach", (5,)) == []


def test_concurrent_attempts_of_one_stage_commit_exactly_once(cat: Catalog) -> None:
    n = 4
    barrier = threading.Barrier(n)
    results: list[bool] = []
    errors: list[BaseException] = []

    def attempt(k: int) -> None:
        own = Catalog(cat.url)
        try:
            barrier.wait()
            results.append(own.commit("c", "stage", (5,), [batch("t", (5,), f"try{k}")]))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)
        finally:
            own.close()

    threads = [threading.Thread(target=attempt, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [False] * (n - 1) + [True]
    assert len(cat.batches("c", "t")) == 1


def test_for_warehouse_is_sqlite_with_wal_foreign_keys_and_busy_timeout(tmp_path) -> None:
    cat = Catalog.for_warehouse(tmp_path / "wh")
    assert (tmp_path / "wh" / "catalog.db").exists()
    with cat.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    cat.close()


# --- what the Airflow UI page reads --------------------------------------------------------


def test_epochs_carry_their_label_and_when_they_opened_and_committed(cat: Catalog) -> None:
    cat.open_epoch("c", 0, "day 0")
    cat.commit_epoch("c", 0)
    cat.open_epoch("c", 1)  # no label: run by the engine alone
    first, second = cat.epochs("c")
    assert (first.epoch, first.state, first.label) == (0, "committed", "day 0")
    assert first.committed_at is not None and first.committed_at >= first.opened_at
    assert (second.epoch, second.state, second.label, second.committed_at) == (
        1,
        "open",
        None,
        None,
    )
    assert cat.epochs("other") == []


def test_the_dag_runs_of_an_epoch_are_recorded_once_each(cat: Catalog) -> None:
    cat.open_epoch("c", 0, "day 0")
    cat.record_epoch_run("c", 0, "dbspark_c", "scheduled__1")
    cat.record_epoch_run("c", 0, "dbspark_c", "scheduled__1")  # a retried open task
    cat.record_epoch_run("c", 0, "dbspark_c", "manual__2")  # a second run finished it
    runs = cat.epoch_runs("c")
    assert [(r.epoch, r.dag_id, r.run_id) for r in runs] == [
        (0, "dbspark_c", "scheduled__1"),
        (0, "dbspark_c", "manual__2"),
    ]


def test_each_batch_names_the_commit_that_registered_it(cat: Catalog) -> None:
    cat.commit("c", "ingest_x", (0,), [batch("n0.input", (0,), "i", 7), batch("n0", (0,), "d", 3)])
    cat.commit("c", "publish", (0,), [batch("view.v", (0,), "v", 2)])
    cat.commit("c", "ingest_x", (1,), [batch("n0.input", (1,), "j", 4)])
    old = [b.id for b in cat.batches("c", "view.v")]
    cat.commit("c", "compact:view.v", (1,), [batch("view.v", (1,), "m", 2)], supersede=old)
    made_by = {b.path.rsplit("/", 1)[1]: b.created_by for b in cat.all_batches("c")}
    assert None not in made_by.values() and made_by["i"] == made_by["d"] != made_by["v"]

    outputs = [(o.stage, o.time, o.collection, o.batches, o.rows) for o in cat.stage_outputs("c")]
    assert outputs == [
        ("ingest_x", (0,), "n0", 1, 3),
        ("ingest_x", (0,), "n0.input", 1, 7),
        ("publish", (0,), "view.v", 1, 2),
        ("ingest_x", (1,), "n0.input", 1, 4),
        ("compact:view.v", (1,), "view.v", 1, 2),
    ]


def test_collection_sizes_split_live_and_superseded_batches(cat: Catalog) -> None:
    cat.commit("c", "a", (0,), [batch("t", (0,), "a", 10), batch("u", (0,), "u", 1)])
    cat.commit("c", "b", (1,), [batch("t", (1,), "b", 20)])
    old = [b.id for b in cat.batches("c", "t")]
    cat.commit("c", "compact:t", (1,), [batch("t", (1,), "m", 25)], supersede=old)
    sizes = {s.collection: s for s in cat.collection_sizes("c")}
    assert set(sizes) == {"t", "u"}
    t = sizes["t"]
    assert (t.live_batches, t.live_rows, t.live_bytes) == (1, 25, 2500)
    assert (t.superseded_batches, t.superseded_rows, t.superseded_bytes) == (2, 30, 3000)
    assert (sizes["u"].live_rows, sizes["u"].superseded_batches) == (1, 0)


def test_all_frontiers_and_loop_iterations_of_a_circuit(cat: Catalog) -> None:
    cat.set_frontier("c", "t", [(1, 0)])
    cat.set_frontier("c", "u", [(2,)])
    assert cat.frontiers("c") == {"t": [(1, 0)], "u": [(2,)]}
    for prefix, sizes in (((0,), [3, 0]), ((1,), [1, 1, 0])):
        for i, rows in enumerate(sizes):
            it = LoopIteration("reach", prefix, i, delta_rows=rows, converged=rows == 0)
            cat.commit("c", "loop:reach", (*prefix, i), [], loop_iteration=it)
    history = [(i.prefix, i.iteration, i.delta_rows) for i in cat.all_loop_iterations("c")]
    assert history == [((0,), 0, 3), ((0,), 1, 0), ((1,), 0, 1), ((1,), 1, 1), ((1,), 2, 0)]


def test_a_catalog_from_before_created_by_gains_the_column(catalog_url: str) -> None:
    """Catalogs written before batches named their commit are upgraded when opened: old
    batches keep no commit, new ones get theirs."""
    old = sa.MetaData()
    sa.Table(
        "batches",
        old,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *(sa.Column(name, sa.String(500), nullable=False) for name in ("circuit", "collection")),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("time", sa.String(200), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("path", sa.String(1000), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("buckets", sa.Integer, nullable=False),
        sa.Column("superseded_by", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    row = {"circuit": "c", "collection": "t", "kind": "trace", "time": "[0]", "epoch": 0}
    row |= {"path": "c/t/a", "rows": 1, "bytes": 1, "buckets": 0, "superseded_by": None}
    engine = sa.create_engine(catalog_url)
    with engine.begin() as conn:
        old.create_all(conn)
        batches = old.tables["batches"]
        conn.execute(batches.insert().values(**row, created_at=sa.func.current_timestamp()))
    engine.dispose()

    catalog = Catalog(catalog_url)
    try:
        catalog.register_circuit("c", "fp")
        catalog.commit("c", "s", (1,), [batch("t", (1,), "b", rows=4)])
        assert [b.created_by is None for b in catalog.all_batches("c")] == [True, False]
        assert [(o.stage, o.rows) for o in catalog.stage_outputs("c")] == [("s", 4)]
        indexes = sa.inspect(catalog.engine).get_indexes("batches")
        assert ("created_by",) in {tuple(ix["column_names"]) for ix in indexes}
    finally:
        catalog.close()
    Catalog(catalog_url).close()  # opening an upgraded catalog again changes nothing


# ------------------------------------------------------------ timeouts (issue 18, finding 17)
def test_a_statement_waits_for_a_lock_at_most_the_lock_timeout(catalog_url: str) -> None:
    """A stuck lock fails the catalog's statement after ``lock_timeout`` (then the task's
    retry takes over) instead of holding the task for as long as the lock is held."""
    import sqlite3
    import time

    cat = Catalog(catalog_url, lock_timeout=0.5)
    cat.register_circuit("c", "fp1")
    holder = sa.create_engine(catalog_url)
    try:
        with holder.connect() as conn:
            if conn.dialect.name == "sqlite":
                raw = sqlite3.connect(sa.make_url(catalog_url).database)
                raw.isolation_level = None
                raw.execute("BEGIN IMMEDIATE")
            else:
                raw = None
                conn.exec_driver_sql("BEGIN")
                conn.exec_driver_sql("LOCK TABLE epochs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(sa.exc.OperationalError, match=r"locked|lock timeout"):
                cat.open_epoch("c", 0)
            assert time.monotonic() - started < 10
            if raw is not None:
                raw.execute("ROLLBACK")
                raw.close()
            else:
                conn.exec_driver_sql("ROLLBACK")
        assert cat.open_epoch("c", 0) == "open"  # the lock released, it works again
    finally:
        holder.dispose()
        cat.close()


def test_a_sqlite_statement_runs_at_most_the_statement_timeout(tmp_path: Path) -> None:
    """SQLite has no statement timeout: the catalog's progress handler stops a statement
    past it, with an error that names the timeout, and the catalog goes on working."""
    import time

    cat = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}", statement_timeout=0.3)
    # About ten seconds of work for SQLite: far past the timeout.
    slow = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 30000000) "
        "SELECT count(*) FROM n"
    )
    try:
        with cat.engine.connect() as conn:
            started = time.monotonic()
            with pytest.raises(CatalogError, match=r"longer than 0.3 s .* WITH RECURSIVE"):
                conn.exec_driver_sql(slow).scalar()
            assert time.monotonic() - started < 3
            conn.rollback()
            assert conn.exec_driver_sql("SELECT count(*) FROM circuits").scalar() == 0
        cat.register_circuit("c", "fp1")  # a quick statement after it is not stopped
        time.sleep(0.4)
        cat.register_circuit("c", "fp1")  # nor one sent after a pause on a pooled connection
    finally:
        cat.close()


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)
def test_postgresql_sessions_have_statement_and_lock_timeouts(catalog_url: str) -> None:
    cat = Catalog(catalog_url, lock_timeout=1.5, statement_timeout=2)
    try:
        with cat.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "1500ms"
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "2s"
            with pytest.raises(sa.exc.OperationalError, match="statement timeout"):
                conn.exec_driver_sql("SELECT pg_sleep(5)")
    finally:
        cat.close()


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)
def test_a_connection_the_server_closed_is_replaced_not_failed(catalog_url: str) -> None:
    """``pool_pre_ping``: after a database restart (here: every session of the catalog's
    database terminated), the next statement gets a new connection instead of an error."""
    cat = Catalog(catalog_url)
    admin = sa.create_engine(catalog_url, isolation_level="AUTOCOMMIT")
    try:
        cat.register_circuit("c", "fp1")
        assert cat.epoch_state("c", 0) is None  # a pooled connection now exists
        with admin.connect() as conn:
            terminated = conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).scalar()
        assert terminated >= 1
        assert cat.epoch_state("c", 0) is None
        assert cat.open_epoch("c", 0) == "open"
    finally:
        admin.dispose()
        cat.close()
