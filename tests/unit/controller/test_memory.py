"""The operator process limits glibc's malloc arenas (controller/memory.py)."""

from __future__ import annotations

import platform

import pytest

from tfdata_operator.controller import memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_glibc_takes_the_arena_limit() -> None:
    assert memory.limit_malloc_arenas(memory.ARENAS) is True
