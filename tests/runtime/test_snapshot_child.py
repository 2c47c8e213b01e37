"""Snapshots imaged by a forked child (node/runtime/snapshot_child.py) while the group goes on.

The property that matters: the event loop does not stop for a state-sized serialization, so
a leader keeps committing (and heartbeating) while its image is made. The child here is held
waiting (XRAFT_TEST_SNAPSHOT_CHILD=wait:PATH) so "while" is a fact, not a race; proposals
commit meanwhile, and the image is the state as of the fork: a follower restarted from it
converges with the others (KV's hash chain travels in the snapshot).
"""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from xraft.node.runtime import snapshot_child

from .test_driver import Cluster, run  # noqa: F401  (run: the uvloop fixture)

pytestmark = pytest.mark.skipif(not snapshot_child.available(), reason="needs fork and prctl (Linux)")


def _children() -> set:
    """Live child processes of this process (any thread's)."""
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except FileNotFoundError:
            pass
    return out


def test_the_leader_commits_while_its_child_images_and_the_image_is_the_state_at_the_fork(tmp_path, run,
                                                                                            monkeypatch):
    go = tmp_path / "go"
    monkeypatch.setenv(snapshot_child.TEST_ENV, "wait:%s" % go)

    async def main():
        c = await Cluster(tmp_path, snapshot_entries=20).start()
        try:
            leader = await c.wait_leader()
            before = _children()
            for i in range(25):                       # past snapshot_entries: a child starts
                await leader.propose(b"a%d=%d" % (i, i), 10)
            await c.wait_for(lambda: _children() - before, what="a snapshot child")
            imaging = _children() - before
            # The children wait for `go`: every commit below happens while they are alive.
            for i in range(30):
                await leader.propose(b"b%d=%d" % (i, i), 10)
            assert imaging <= _children()
            assert all(c.g(n).stats.snapshots_created == 0 for n in c.ids)
            go.touch()
            await c.wait_for(lambda: all(c.g(n).stats.snapshots_created >= 1 for n in c.ids), 30,
                             "the children's images adopted")
            await c.wait_converged()
            for n in c.ids:
                st = c.g(n).stats
                assert st.snapshots_in_child >= 1 and st.snapshot_child_failures == 0, (n, st)
            # A follower restarted from its child-made image converges with the rest.
            follower = next(n for n in c.ids if n != leader.node_id)
            await c.crash(follower)
            await c.start_node(follower)
            assert c.sms[(follower, 1)].restores == 1
            await c.wait_converged()
        finally:
            await c.close()
    run(main())


@contextlib.asynccontextmanager
async def _imaging(tmp_path):
    """A 3-node cluster (snapshot every 10 entries) whose proposals passed a snapshot point, with
    a child held imaging (the caller sets TEST_ENV): yields (cluster, the children before it);
    the cluster is closed on the way out."""
    c = await Cluster(tmp_path, snapshot_entries=10).start()
    before = _children()
    try:
        leader = await c.wait_leader()
        for i in range(15):
            await leader.propose(b"k%d=v" % i, 10)
        await c.wait_for(lambda: _children() - before, what="a snapshot child")
        yield c, before
    finally:
        await c.close()


def test_a_group_closed_while_its_child_images_kills_the_child(tmp_path, run, monkeypatch):
    monkeypatch.setenv(snapshot_child.TEST_ENV, "sleep:60")

    async def main():
        async with _imaging(tmp_path) as (c, before):
            pass
        await c.wait_for(lambda: not (_children() - before), 10, "the children killed")
        for n in c.ids:
            snap_dir = tmp_path / f"n{n}" / "g1" / "snap"
            assert not [p for p in os.listdir(snap_dir) if p.endswith(".tmp")], os.listdir(snap_dir)
    run(main())


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])       # field 19: nice


def test_the_child_runs_niced_below_its_node(tmp_path, run, monkeypatch):
    """Every replica images at about the same index: the children must not take the cores
    from the nodes' loops (CHILD_NICE)."""
    monkeypatch.setenv(snapshot_child.TEST_ENV, "sleep:60")

    async def main():
        async with _imaging(tmp_path) as (c, before):
            want = min(19, _nice(os.getpid()) + snapshot_child.CHILD_NICE)
            # Waited for, not read once: a child just forked has not reached os.nice() yet.
            await c.wait_for(lambda: (kids := _children() - before) and all(_nice(p) == want for p in kids),
                             what="snapshot children, every one niced")
    run(main())


def test_failing_children_fall_back_to_images_made_in_process(tmp_path, run, monkeypatch):
    monkeypatch.setenv(snapshot_child.TEST_ENV, "fail")

    async def main():
        c = await Cluster(tmp_path, snapshot_entries=5).start()
        try:
            leader = await c.wait_leader()
            for i in range(60):
                await leader.propose(b"k%d=v" % i, 10)
            await c.wait_for(lambda: all(c.g(n).stats.snapshots_created >= 1 for n in c.ids), 20,
                             "images made in process")
            for n in c.ids:
                st = c.g(n).stats
                assert st.snapshot_child_failures == 3 and st.snapshots_in_child == 0, (n, st)
            await c.wait_converged()
        finally:
            await c.close()
    run(main())


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by whoever adopted it, maybe later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_dies_with_its_parent(tmp_path):
    """kill -9 of a node mid-image must not leave a child writing into its data dir (or
    holding its files) after the node is restarted."""
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        os.environ[{snapshot_child.TEST_ENV!r}] = "sleep:60"
        from xraft.node.runtime import snapshot_child
        tmp = {str(tmp_path / "x.snap.tmp")!r}
        def write(data):
            with open(tmp, "wb") as f:
                f.write(data)
            return tmp
        async def main():
            task = asyncio.ensure_future(snapshot_child.image_in_child(lambda: b"state", write, tmp))
            await asyncio.sleep(0.5)
            with open("/proc/self/task/%d/children" % os.getpid()) as f:
                print(f.read().split()[0], flush=True)
            await task
        asyncio.run(main())
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        assert _running(child)                         # alive, asleep
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _running(child):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"snapshot child {child} outlived its parent")
        assert not os.path.exists(tmp_path / "x.snap.tmp")
    finally:
        p.kill()
