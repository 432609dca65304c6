"""Recording which paths a test's code fsyncs (durability tests in storage/ and
orchestration/ share it)."""

from __future__ import annotations

import os

import pytest

from dbspark.storage.durability import SYNC_METHOD_SETTING


def recorded_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced from now on, in order: one fsync per file (no syncfs)."""
    monkeypatch.setenv(SYNC_METHOD_SETTING, "fsync")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
