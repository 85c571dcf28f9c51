from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.standin import ApiServer
from vgpud.kube.client import KubeClient


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.1) as server:
        yield server


@pytest.fixture
async def kube(api: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.for_url(api.url) as client:
        yield client
