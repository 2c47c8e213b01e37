"""The transports' acceptance rule (types.link_violation), shared by GrpcTransport and the
simulator's network: which messages may arrive over the authenticated link of a node."""
from __future__ import annotations

import pytest

from xraft.node.raft.types import FORWARDED_MESSAGES, LOCAL_MESSAGES, Message, MessageType as MT, \
    link_violation

NETWORK_TYPES = [t for t in MT if t not in LOCAL_MESSAGES and t != MT.STORAGE_APPEND_RESP]


@pytest.mark.parametrize("t", NETWORK_TYPES, ids=lambda t: t.name)
def test_every_network_message_is_accepted_from_the_link_sender(t):
    assert link_violation(Message(t, to=3, frm=2), 2, 3) is None
    assert "on a link to 3" in link_violation(Message(t, to=1, frm=2), 2, 3)


@pytest.mark.parametrize("t", NETWORK_TYPES, ids=lambda t: t.name)
def test_only_forwarded_requests_may_name_another_sender(t):
    """Node 1 forwarded a request to 2 (a stale leader hint), 2 passes it on to 3: frm stays 1."""
    why = link_violation(Message(t, to=3, frm=1), 2, 3)
    if t in FORWARDED_MESSAGES:
        assert why is None
        assert link_violation(Message(t, to=3, frm=3), 2, 3) is None  # back at its originator
        assert "from 0" in link_violation(Message(t, to=3, frm=0), 2, 3)  # but never anonymous
    else:
        assert why == f"{t.name} message from 1 on the link of node 2"


def test_forwarded_kinds_are_requests_without_authority():
    # Votes, appends, heartbeats, snapshots and responses carry their sender's authority or
    # state: impersonating another node with them is what the transport must refuse.
    assert FORWARDED_MESSAGES == {MT.PROP, MT.READ_INDEX, MT.TRANSFER_LEADER}


@pytest.mark.parametrize("t", sorted(LOCAL_MESSAGES), ids=lambda t: t.name)
def test_local_messages_never_cross_a_link(t):
    assert "local-only" in link_violation(Message(t, to=3, frm=2), 2, 3)


def test_replica_ids_are_judged_by_their_node():
    """A data group's members have replica ids (cluster/slot_map.py): the link of node 2 -> 3 may
    carry messages from any replica on node 2 to any replica on node 3, and nothing else."""
    from xraft.node.cluster.slot_map import node_of_replica, replica_id
    r2, r3 = replica_id(2, 1), replica_id(3, 4)
    assert link_violation(Message(MT.APP, to=r3, frm=r2), 2, 3, node_of_replica) is None
    assert link_violation(Message(MT.APP, to=3, frm=2), 2, 3, node_of_replica) is None      # generation 0
    assert "on a link to 3" in link_violation(Message(MT.APP, to=replica_id(1, 4), frm=r2), 2, 3, node_of_replica)
    assert "on the link of node 2" in link_violation(Message(MT.APP, to=r3, frm=replica_id(1, 1)), 2, 3,
                                                     node_of_replica)
    assert "on a link to 3" in link_violation(Message(MT.APP, to=r3, frm=r2), 2, 3)          # ids compared as is
