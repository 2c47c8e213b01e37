"""The SDK and server sessions (node/fsm/sessions.py): the SDK registers its client id
before its first id-carrying write; when the server says SESSION_EXPIRED it resends
under a new id only if no earlier attempt may have been applied, and otherwise raises
SessionExpiredError (an unknown outcome). Never a second apply."""
import asyncio

import pytest

from tests.client import run, serving
from xraft.client import errors
from xraft.client.aio import Client
from xraft.node.fsm.sessions import DEFAULT_SESSION_TIMEOUT_MS
from xraft.node.server.backend import LocalBackend, UnknownOutcome

T0 = 1_700_000_000_000
GUARD = 15


class _Clocked(LocalBackend):
    """A LocalBackend whose wall clock the test moves."""

    def __init__(self, **kw):
        self.now = T0
        super().__init__(clock=lambda: self.now, **kw)


def test_an_idle_clients_next_write_opens_a_new_session():
    async def body():
        backend = _Clocked()
        async with serving(backend) as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                assert await c.rpush("l", "a") == 1
                first_id = c.client_id
                assert list(backend.sm.sessions.clients) == [first_id]
                backend.now += DEFAULT_SESSION_TIMEOUT_MS + 1          # idle past the timeout
                assert await asyncio.wait_for(c.rpush("l", "b"), GUARD) == 2    # refused, then resent
                assert c.client_id != first_id
                assert list(backend.sm.sessions.clients) == [c.client_id]
                assert await c.lrange("l", 0, -1) == [b"a", b"b"]
    run(body)


class _LosesAnswerThenIdles(_Clocked):
    """Applies the first RPUSH with a request id, loses its answer
    (UNKNOWN_OUTCOME), and lets the session time out before the resend."""
    lost = False

    async def submit(self, requests):
        results = await super().submit(requests)
        if not self.lost and any(r.seq and r.commands[0][0] == b"RPUSH" for r in requests):
            self.lost = True
            self.now += DEFAULT_SESSION_TIMEOUT_MS + 1
            raise UnknownOutcome()
        return results


def test_a_resend_after_the_session_expired_is_an_unknown_outcome_not_a_second_apply():
    async def body():
        backend = _LosesAnswerThenIdles()
        async with serving(backend) as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                with pytest.raises(errors.SessionExpiredError) as e:
                    await asyncio.wait_for(c.rpush("l", "once"), GUARD)
                assert isinstance(e.value, errors.UnknownOutcomeError) and not e.value.retriable
                assert await c.llen("l") == 1                        # applied once, never twice
                assert await c.rpush("l", "next") == 2               # and the client goes on
    run(body)
