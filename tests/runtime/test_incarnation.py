"""incarnation.py on real files: the crash-safe write (a process killed with SIGKILL after
each step of tmp write / fsync / rename / dir fsync leaves the old file or the new one,
whole), and PeerIncarnations (first sight recorded durably, a changed incarnation refused,
the memory surviving a reload)."""
import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from xraft.node.runtime.incarnation import PeerIncarnations, new_incarnation, write_durably
from xraft.node.runtime.peer_auth import HelloRefused, RefusalCode

STEPS = ("written", "synced", "renamed", "dir-synced")

CRASHER = r'''
import os, signal, sys
from xraft.node.runtime.incarnation import PeerIncarnations
path, crash_at, node, inc = sys.argv[1], sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])

def hook(step):
    if step == crash_at:
        os.kill(os.getpid(), signal.SIGKILL)
PeerIncarnations(path, crash_hook=hook).check(node, inc)
print("survived", flush=True)
'''


@pytest.mark.parametrize("crash_at", STEPS)
def test_a_kill_at_each_step_of_the_write_leaves_the_old_or_the_new_file(tmp_path, crash_at):
    path = str(tmp_path / "peer-incarnations.json")
    first, second = new_incarnation(), new_incarnation()
    PeerIncarnations(path).check(2, first)
    before = open(path, "rb").read()
    p = subprocess.run([sys.executable, "-c", CRASHER, path, crash_at, "3", second.hex()],
                       capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr  # killed mid-write, for real
    after = open(path, "rb").read()
    book = PeerIncarnations(path)  # always loads: the file is whole
    assert book.get(2) == first
    if crash_at in ("written", "synced"):
        assert after == before and book.get(3) is None  # not renamed yet: the old file, untouched
    else:
        assert book.get(3) == second  # renamed: the new file
    # A leftover .tmp never confuses the next writer or reader.
    book.check(4, second)
    assert PeerIncarnations(path).get(4) == second and PeerIncarnations(path).get(2) == first


def test_write_durably_replaces_whole_files(tmp_path):
    path = str(tmp_path / "f")
    write_durably(path, b"one")
    write_durably(path, b"two" * 1000)
    assert open(path, "rb").read() == b"two" * 1000
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_peer_incarnations_remember_refuse_and_forget(tmp_path, caplog):
    path = str(tmp_path / "peers.json")
    book = PeerIncarnations(path)
    a, b = new_incarnation(), new_incarnation()
    book.check(2, a)
    book.check(2, a)  # the same incarnation again: fine
    with caplog.at_level(logging.ERROR, logger="xraft.incarnation"):
        with pytest.raises(HelloRefused) as err:
            PeerIncarnations(path).check(2, b)  # a reload remembers it
    assert err.value.code == RefusalCode.FAILED_PRECONDITION
    assert "node 2 came back with incarnation %s" % b.hex() in caplog.text and "membership change" in caplog.text
    book.forget(2)
    PeerIncarnations(path).check(2, b)  # after a membership change it is a new member
    assert PeerIncarnations(path).get(2) == b


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"version": 2, "peers": {}}',
                                     b'{"version": 1, "peers": {"2": "abcd"}}',
                                     b'{"version": 1, "peers": {"0": "%s"}}' % (b"00" * 16),
                                     b'{"version": 1, "peers": {"x": "%s"}}' % (b"00" * 16)])
def test_a_damaged_peer_file_is_refused_not_ignored(tmp_path, content):
    path = tmp_path / "peers.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="unreadable"):
        PeerIncarnations(str(path))


def test_the_file_holds_what_it_says(tmp_path):
    path = str(tmp_path / "peers.json")
    inc = new_incarnation()
    PeerIncarnations(path).check(7, inc)
    assert json.loads(open(path).read()) == {"version": 1, "peers": {"7": inc.hex()}}
