"""XRAFT_STALL_TRACE (node/server/loop_stalls.py): a long synchronous step on the loop is
reported with the stack that ran it; a loop that only awaits reports nothing."""
import asyncio
import gc
import time

from xraft.node.server import loop_stalls


def _a_long_synchronous_step():
    time.sleep(0.2)          # stands for an apply that holds the loop


def _report_of(tmp_path, monkeypatch, node: int, held) -> str:
    """The stall report of node `node` after `held()` ran on its loop (a stall)."""
    monkeypatch.setenv(loop_stalls.ENV, str(tmp_path))

    async def main():
        w = loop_stalls.start(asyncio.get_running_loop(), node)
        try:
            await asyncio.sleep(0.05)
            held()
            for _ in range(100):                  # until the watchdog has written its report
                await asyncio.sleep(0.02)
                if w.stalls:
                    break
        finally:
            w.stop()
        return w
    w = asyncio.run(main())
    assert w._on_gc not in gc.callbacks
    return (tmp_path / ("stalls-%d.txt" % node)).read_text()


def test_a_stall_is_reported_with_the_code_that_held_the_loop(tmp_path, monkeypatch):
    report = _report_of(tmp_path, monkeypatch, 7, _a_long_synchronous_step)
    assert report.startswith("stall ")
    assert "_a_long_synchronous_step" in report


def test_off_unless_the_variable_names_a_directory(monkeypatch):
    monkeypatch.delenv(loop_stalls.ENV, raising=False)

    async def main():
        return loop_stalls.start(asyncio.get_running_loop(), 7)
    assert asyncio.run(main()) is None


def test_a_collection_during_a_stall_is_named_with_its_generation_and_thread(tmp_path, monkeypatch):
    """The collector holds the GIL on whichever thread allocated: the report says it ran."""
    def held():
        time.sleep(0.1)
        gc.collect(1)                             # inside the stall, on the loop thread
        time.sleep(0.1)
    report = _report_of(tmp_path, monkeypatch, 8, held)
    assert "gc gen1 " in report and " in loop" in report
