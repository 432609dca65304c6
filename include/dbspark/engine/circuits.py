"""Registering a circuit with its warehouse, and saying what changed when it is refused.

The catalog keeps one fingerprint per circuit and refuses a definition whose
fingerprint differs (``Catalog.register_circuit``): the warehouse's state was kept for
the old one. Beside it, the warehouse keeps the definition's signature
(``circuit/evolution.py``: each view's and source's fingerprint, each source's key,
watermark and tombstone) in ``<warehouse>/_circuits/<circuit>.json``, written when a
definition registers. A refusal then says which views were added, removed or changed,
which sources changed and how, and what to do; a change to a source's key, watermark or
tombstone is told apart, since it changes what the stored state means.

The signature only explains: the catalog's fingerprint decides. A warehouse without a
signature (older than this file), or whose signature is of another definition than the
catalog's, gets the catalog's own refusal.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from dbspark.circuit.builder import Circuit
from dbspark.circuit.evolution import Evolution, compare, signature
from dbspark.circuit.fingerprint import circuit_fingerprint
from dbspark.storage import collection_names as coll
from dbspark.storage.catalog import Catalog, CircuitDefinitionChanged

log = logging.getLogger("dbspark.engine")

CIRCUITS = "_circuits"
#: The signature file's note of the last evolution in place (``mark_evolving``).
EVOLUTION_NOTE = "evolution"


class CircuitChangedError(CircuitDefinitionChanged):
    """A circuit's definition differs from the one its warehouse's state was kept for;
    ``evolution`` says how."""

    def __init__(
        self,
        message: str,
        evolution: Evolution,
        *,
        kept: dict[str, Any] | None = None,
        stored: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.evolution = evolution
        #: The kept definition's signature, its fingerprint (the catalog's) and the new
        #: definition's: what an evolution in place needs (``engine/spark/evolve.py``).
        self.kept = kept
        self.stored = stored
        self.fingerprint = fingerprint


def signature_path(warehouse: str | os.PathLike[str], circuit: str) -> Path:
    return Path(warehouse) / CIRCUITS / f"{circuit}.json"


def register(catalog: Catalog, warehouse: str | os.PathLike[str], circuit: Circuit) -> None:
    """Register ``circuit`` with ``catalog`` (see the module docstring), keeping its
    signature in ``warehouse``; a changed definition raises :class:`CircuitChangedError`
    when the kept signature can say what changed, else the catalog's
    ``CircuitDefinitionChanged``."""
    fingerprint = circuit_fingerprint(circuit)
    path = signature_path(warehouse, circuit.name)
    try:
        catalog.register_circuit(circuit.name, fingerprint)
    except CircuitDefinitionChanged:
        kept = _read(path)
        stored = catalog.circuit_fingerprint(circuit.name)
        if kept is None or kept.get("fingerprint") != stored:
            raise
        evolution = compare(kept["signature"], circuit)
        raise CircuitChangedError(
            f"{evolution.refusal()}\n(circuit {circuit.name!r}: fingerprint {fingerprint}, "
            f"the warehouse's {stored})",
            evolution,
            kept=kept["signature"],
            stored=stored,
            fingerprint=fingerprint,
        ) from None
    kept = _read(path)
    if kept is None or kept.get("fingerprint") != fingerprint:
        content: dict[str, Any] = {"fingerprint": fingerprint, "signature": signature(circuit)}
        note = (kept or {}).get(EVOLUTION_NOTE) or {}
        if note.get("fingerprint") == fingerprint:
            # The evolution to this definition (``mark_evolving``), which its outputs'
            # correction reads (``pending_evolution``), stays with the new signature.
            content[EVOLUTION_NOTE] = note
        _write(path, content)


def mark_evolving(
    warehouse: str | os.PathLike[str],
    circuit: Circuit,
    fingerprint: str,
    previous: dict[str, Any],
    epoch: int,
) -> None:
    """Before an evolution's catalog commit: the kept signature (still the old
    definition's) also notes the evolution to ``fingerprint``, from the definition whose
    signature is ``previous``, at ``epoch``. Whichever process next registers the new
    definition keeps the note with the new signature (``register``), so that a task that
    died after the commit leaves what the outputs' correction needs."""
    path = signature_path(warehouse, circuit.name)
    kept = _read(path) or {}
    note = {"fingerprint": fingerprint, "from": previous, "epoch": int(epoch)}
    _write(path, {**kept, EVOLUTION_NOTE: note})


def unmark_evolving(warehouse: str | os.PathLike[str], circuit: Circuit, fingerprint: str) -> None:
    """After an evolution's catalog commit was refused (nothing changed): the kept
    signature no longer names it."""
    path = signature_path(warehouse, circuit.name)
    kept = _read(path)
    if kept is not None and (kept.get(EVOLUTION_NOTE) or {}).get("fingerprint") == fingerprint:
        _write(path, {k: v for k, v in kept.items() if k != EVOLUTION_NOTE})


def pending_evolution(
    catalog: Catalog, warehouse: str | os.PathLike[str], circuit: Circuit
) -> tuple[Evolution, int] | None:
    """The evolution to ``circuit``'s definition whose outputs are not all brought along
    yet (no commit ``evolve-outputs:<fingerprint>``): how the definition differs from the
    one it evolved from, and the epoch it evolved at; None when there is none."""
    kept = _read(signature_path(warehouse, circuit.name))
    note = (kept or {}).get(EVOLUTION_NOTE) or {}
    fingerprint = circuit_fingerprint(circuit)
    if note.get("fingerprint") != fingerprint:
        return None
    epoch = int(note["epoch"])
    if catalog.stage_done(circuit.name, coll.evolve_outputs_stage(fingerprint), (epoch,)):
        return None
    return compare(note["from"], circuit), epoch


def _read(path: Path) -> dict[str, Any] | None:
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("ignoring the unreadable circuit signature %s: %s", path, err)
        return None
    return kept if isinstance(kept, dict) and "signature" in kept else None


def _write(path: Path, content: dict[str, Any]) -> None:
    """Whole or not at all: a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
