"""A real scheduler with --auth token (optionally TLS), and tokens made the way
`gandiva token create` makes them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from scheduler import auth, transport
from scheduler.state import migrate
from scheduler.state.db import make_engine, make_sessionmaker


def make_token(db_url: str, name: str, role: str = "user") -> str:
    async def go() -> str:
        engine = make_engine(db_url)
        try:
            await migrate.upgrade(engine)
            async with make_sessionmaker(engine)() as s, s.begin():
                return await auth.create_token(s, name, role)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def revoke(db_url: str, name: str) -> None:
    async def go() -> None:
        engine = make_engine(db_url)
        try:
            async with make_sessionmaker(engine)() as s, s.begin():
                await auth.revoke_token(s, name)
        finally:
            await engine.dispose()

    asyncio.run(go())


@pytest.fixture
def secured(make_scheduler, sqlite_url: str):  # type: ignore[no-untyped-def]
    """A scheduler with --auth token on a fresh SQLite database."""
    return make_scheduler(sqlite_url, tick_s=0.2, auth="token")


@pytest.fixture
def connect() -> Iterator[Callable[..., grpc.Channel]]:
    """Channels with a token (and TLS) as every Gandiva client makes them."""
    opened: list[grpc.Channel] = []

    def open_(address: str, token: str = "", ca: str = "", cert: str = "", key: str = "") -> grpc.Channel:
        ch = transport.channel(address, transport.ClientSecurity(token, ca, cert, key))
        opened.append(ch)
        return ch

    yield open_
    for ch in opened:
        ch.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scheduler.cli.tls import make_certificates

    out = tmp_path_factory.mktemp("tls")
    make_certificates(out, ["localhost", "127.0.0.1"], ["alice"])
    return out
