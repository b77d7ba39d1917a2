"""A READY repository model stays loaded (kserve/models.py's resident session), in-process: the
model's first request after a quiet spell finds it loaded, and nothing of an old version outlives it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rknn_server.config.limits import CacheLimits
from rknn_server.errors import ResourceExhausted
from rknn_server.protocols.kserve.models import REPOSITORY_OWNER
from rknn_server.runtime.base import ModelFormatError
from rknn_server.runtime.host import HostBackend
from tests.models import identity_of
from tests.unit.server.fakes import FakeBackend
from tests.unit.server.protocols.kserve.serving import models_of

CALLER = "uid:1000"


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


class SharingFake(FakeBackend):
    """The fake runtime, as a backend whose sessions of a model share its loaded copy."""

    shares_models = True


def open_runtimes(backend: FakeBackend) -> int:
    return sum(not runtime.closed for runtime in backend.opened)


def test_a_ready_model_keeps_one_session_open_that_the_reaper_and_the_limits_leave_alone(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """The probe that checked the model used to be closed at once, so the first caller loaded the
    model again; it is kept, outside the clients' session limit and the idle lease."""
    backend = SharingFake()
    models = models_of(tmp_path, executor, backend, max_sessions=1)

    async def main() -> None:
        await models.load_all()
        (model,) = models._loaded["m"].values()
        assert open_runtimes(backend) == 1 and model.resident
        assert len(models.plane.registry) == 0  # the clients' count, as GetInfo and the limits see it
        session, opened = await models.sessions.get(model.digest, CALLER, shared=True)
        assert opened and open_runtimes(backend) == 2  # the one slot of max_sessions=1 was free
        with pytest.raises(ResourceExhausted, match="max_sessions=1"):
            await models.sessions.get(model.digest, "uid:1001", shared=True)
        for held in models.plane.registry._sessions.values():
            held.last_used -= 10 * held.idle_timeout_s  # every lease ran out long ago
        await models.plane.reap()
        assert session.closed and open_runtimes(backend) == 1
        assert (
            models.plane.session(model.resident, REPOSITORY_OWNER, usable=False).runtime is backend.opened[0]
        )

    asyncio.run(main())


@pytest.mark.parametrize("end", ["reload", "failed reload", "unload"])
def test_every_session_of_a_version_closes_when_it_goes(
    tmp_path: Path, executor: ThreadPoolExecutor, end: str
) -> None:
    """A reload's new version has a resident of its own; a failed reload closes the old version's
    sessions (they were dropped after the model was forgotten, so none was); an unload closes all."""
    backend = SharingFake()
    models = models_of(tmp_path, executor, backend)

    async def main() -> None:
        await models.load_all()
        await models.sessions.get(models._loaded["m"]["1"].digest, CALLER, shared=True)
        assert open_runtimes(backend) == 2
        if end == "unload":
            await models.unload("m", REPOSITORY_OWNER)
        elif end == "failed reload":
            backend.refuse = ModelFormatError("the new file is not a model")
            with pytest.raises(ModelFormatError):
                await models.load("m", REPOSITORY_OWNER)
            assert "not a model" in models._unavailable["m"]
        else:  # the same folder again: the old resident closed, the caller's session kept
            await models.load("m", REPOSITORY_OWNER)
            assert backend.opened[0].closed and not backend.opened[1].closed
            assert open_runtimes(backend) == 2 and models._loaded["m"]["1"].resident
            return
        assert open_runtimes(backend) == 0 and len(models.plane.registry._sessions) == 0

    asyncio.run(main())


def test_a_backend_whose_sessions_share_nothing_keeps_no_session(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """With a worker process per session (--isolation process), a kept session would only hold a
    process and a copy of the model for nobody."""
    backend = FakeBackend()
    models = models_of(tmp_path, executor, backend)

    async def main() -> None:
        await models.load_all()
        assert len(backend.opened) == 1 and open_runtimes(backend) == 0
        assert not models._loaded["m"]["1"].resident

    asyncio.run(main())


def test_the_host_runtime_gives_the_first_caller_the_model_the_repository_loaded(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """ONNX Runtime loads the file once, when the model is loaded; a caller's session after a quiet
    spell shares that InferenceSession instead of loading the file again."""
    models = models_of(tmp_path, executor, HostBackend(threads=1))

    async def main() -> None:
        await models.load_all()
        (model,) = models._loaded["m"].values()
        resident = models.plane.session(model.resident, REPOSITORY_OWNER, usable=False)
        session, _ = await models.sessions.get(model.digest, CALLER, shared=True)
        assert session.runtime._model is resident.runtime._model  # type: ignore[attr-defined]
        models.plane.close_all("the test ends")

    asyncio.run(main())


def test_a_repository_over_the_cache_quota_serves_what_fits_and_says_why_not_the_rest(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """READY models are pinned in the cache, so a second one that does not fit beside the first is
    UNAVAILABLE with the quota named (rather than evicting the first, to be loaded again on its next
    request)."""
    backend = SharingFake()
    models = models_of(tmp_path, executor, backend)
    second = tmp_path / "repository" / "n"
    second.mkdir()
    identity_of(second / "model.onnx", "float32", (1, 8))
    size = max(p.stat().st_size for p in (tmp_path / "repository").glob("*/model.onnx"))
    models.plane.cache.quota._limits = CacheLimits(quota_bytes=size + size // 2)

    async def main() -> None:
        await models.load_all()
        ready = set(models._loaded)
        (refused,) = {"m", "n"} - ready
        assert len(ready) == 1 and "model cache is full" in models._unavailable[refused]
        assert "--cache-quota" in models._unavailable[refused]

    asyncio.run(main())
