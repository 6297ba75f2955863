"""Shared fixtures: the server comes from PERMITD_PORT (and PERMITD_HOST, default 127.0.0.1).
Every test works in its own fresh namespace, deleted afterwards, so the suite can run again and
again against the same server."""

import os
import uuid

import pytest
import redis

HOST = os.environ.get("PERMITD_HOST", "127.0.0.1")
PORT = int(os.environ.get("PERMITD_PORT", "6379"))
PASSWORD = os.environ.get("PERMITD_PASSWORD") or None


def make_client(protocol=2, decode_responses=True, **kw):
    kw.setdefault("socket_timeout", 30)
    return redis.Redis(host=HOST, port=PORT, password=PASSWORD, protocol=protocol,
                       decode_responses=decode_responses, **kw)


def make_async_client(protocol=2, decode_responses=True, **kw):
    import redis.asyncio as aioredis

    kw.setdefault("socket_timeout", 30)
    return aioredis.Redis(host=HOST, port=PORT, password=PASSWORD, protocol=protocol,
                          decode_responses=decode_responses, **kw)


def new_name(prefix="py"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def as_map(reply):
    """RESP2 flat array or RESP3 dict -> dict (keys as given)."""
    if isinstance(reply, dict):
        return dict(reply)
    assert isinstance(reply, list) and len(reply) % 2 == 0, reply
    return {reply[i]: reply[i + 1] for i in range(0, len(reply), 2)}


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request):
    return request.param


@pytest.fixture
def r(protocol):
    c = make_client(protocol)
    yield c
    c.close()


@pytest.fixture
def admin():
    c = make_client(2)
    yield c
    c.close()


@pytest.fixture
def ns(admin):
    name = new_name()
    admin.execute_command("NS.CREATE", name, "DESC", "redis-compat python")
    yield name
    admin.execute_command("NS.DELETE", name)


def info_field(client, section, field):
    info = client.info(section)
    return info[field]
