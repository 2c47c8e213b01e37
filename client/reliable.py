"""A reliable consumer: new entries from consume(), plus the idle pending
entries of dead consumers claimed on a schedule, processed with bounded
concurrency, acked in batches, stopped cleanly.

    async def handle(key, entry): ...          # raise to leave the entry unacked
    worker = client.reliable_consumer(["{o}a", "{p}b"], "g", "worker-1", handle, concurrency=32)
    task = asyncio.ensure_future(worker.run())
    ...
    await worker.stop()                        # no new work; in-flight work finishes, its acks are sent

Delivery guarantee: at least once. An entry is acked only after its handler
returned; a handler that raises leaves it pending, so it is claimed again
after `claim_idle_ms` (by this or another worker) and, with the group's
dead-letter policy (XRAFT.GROUPCFG), dead-lettered after max deliveries.
Claiming (XAUTOCLAIM) runs every `claim_interval_s`, per stream, from 0-0 to
the end of the PEL in pages of `claim_count`; the streams may be in any slots
(each XAUTOCLAIM routes by its key). Acks of consumed entries go through
their Consume session (its flow-control window opens with them); acks of
claimed ones are XACKs, one per stream per flush.
"""
import asyncio
import logging

from .types import to_bytes

log = logging.getLogger("xraft.client.reliable")


class ReliableConsumer:
    def __init__(self, client, keys, group, consumer, handler, *, concurrency: int = 16,
                 claim_idle_ms: int = 30_000, claim_interval_s: float = 5.0, claim_count: int = 100,
                 ack_batch: int = 100, ack_interval_s: float = 0.05, max_unacked: int = 0):
        if concurrency < 1 or ack_batch < 1 or claim_count < 1:
            raise ValueError("concurrency, ack_batch and claim_count must be >= 1")
        self._client = client
        self.keys = [to_bytes(k) for k in keys]
        self.group, self.consumer = to_bytes(group), to_bytes(consumer)
        self._handler = handler
        self._concurrency = concurrency
        self._claim_idle_ms, self._claim_interval_s, self._claim_count = claim_idle_ms, claim_interval_s, claim_count
        self._ack_batch, self._ack_interval_s = ack_batch, ack_interval_s
        self._max_unacked = max_unacked
        # Work: (key, entry, session or None for a claimed entry). Bounded so a
        # slow handler slows intake (and the server's window) instead of memory.
        self._work: asyncio.Queue = asyncio.Queue(maxsize=2 * concurrency)
        self._done: dict = {}              # (session or None, key) -> [ids] handled, not yet acked
        self._done_count = 0
        self._flushed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._session = None
        self.processed = self.failed = self.claimed = self.acked = 0

    async def run(self) -> None:
        """Consume, claim and process until stop() (or a non-retriable error, raised here)."""
        self._session = self._client.consume(self.keys, self.group, self.consumer, max_unacked=self._max_unacked)
        intake = [asyncio.ensure_future(self._consume()), asyncio.ensure_future(self._claim_loop())]
        workers = [asyncio.ensure_future(self._worker()) for _ in range(self._concurrency)]
        acker = asyncio.ensure_future(self._ack_loop())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([*intake, stop], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop and task.exception() is not None:
                    raise task.exception()
        finally:
            for task in (*intake, stop):
                task.cancel()
            await asyncio.gather(*intake, stop, return_exceptions=True)
            await self._work.join()                # in-flight and queued work finishes
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            acker.cancel()
            await asyncio.gather(acker, return_exceptions=True)
            try:
                await self._flush()
            finally:
                await self._session.close()

    async def stop(self) -> None:
        """Take no new work; let run() finish what it holds and send its acks."""
        self._stopping.set()

    async def _consume(self) -> None:
        async for d in self._session:
            await self._work.put((d.key, d.entry, d.session))

    async def _claim_loop(self) -> None:
        while True:
            await asyncio.sleep(self._claim_interval_s)
            for key in self.keys:
                await self.claim_once(key)

    async def claim_once(self, key) -> int:
        """One XAUTOCLAIM pass over `key`'s PEL: entries idle for claim_idle_ms
        become this consumer's and are queued; returns how many."""
        key, start, claimed = to_bytes(key), "0-0", 0
        while True:
            result = await self._client.xautoclaim(key, self.group, self.consumer, self._claim_idle_ms, start,
                                                   self._claim_count)
            for entry in result.entries:
                await self._work.put((key, entry, None))
            claimed += len(result.entries)
            start = result.next_start
            if start.ms == 0 and start.seq == 0:
                break
        self.claimed += claimed
        return claimed

    async def _worker(self) -> None:
        while True:
            key, entry, session = await self._work.get()
            try:
                await self._handler(key, entry)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - left pending: claimed again later, or dead-lettered
                self.failed += 1
                log.exception("handler failed for %r %s", key, entry.id)
            else:
                self.processed += 1
                self._done.setdefault((session, key), []).append(entry.id)
                self._done_count += 1
                if self._done_count >= self._ack_batch:
                    await self._flush()
            finally:
                self._work.task_done()

    async def _ack_loop(self) -> None:
        while True:
            await asyncio.sleep(self._ack_interval_s)
            await self._flush()

    async def _flush(self) -> None:
        """Send every handled, unacked ID: one ack per (session, stream)."""
        batches, self._done, self._done_count = self._done, {}, 0
        for (session, key), ids in batches.items():
            try:
                if session is not None:
                    self.acked += await session.ack(key, ids)
                else:
                    self.acked += await self._client.xack(key, self.group, *ids)
            except asyncio.CancelledError:
                self._done.setdefault((session, key), []).extend(ids)
                raise
            except Exception:  # noqa: BLE001 - kept for the next flush; pending until then
                log.exception("ack of %d entries of %r failed; retried at the next flush", len(ids), key)
                self._done.setdefault((session, key), []).extend(ids)
                self._done_count += len(ids)
