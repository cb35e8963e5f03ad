"""A KV receive whose peer was lost stops waiting for it as soon as its transfer is dropped, instead of
holding its pages until the transfer's deadline (a real TCPStore, the pair handshake of both ends)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from executor.run.ports import free_port
from executor.transfer.links import LinkConfig, PairLink, TransferError

CONFIG = LinkConfig("gloo", timeout_s=30.0, setup_timeout_s=5.0)


def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))  # fmt: skip


def test_a_dropped_receive_stops_waiting_for_a_peer_that_never_comes() -> None:
    receiver = PairLink(store(), 0, 1, 1, CONFIG)  # worker 1's end; worker 0 (the sender) is gone
    dropped = threading.Event()
    threading.Timer(0.3, dropped.set).start()
    started = time.monotonic()
    with pytest.raises(TransferError, match="dropped while worker 1 waited for worker 0"):
        receiver.handshake(7, started + CONFIG.timeout_s, dropped.is_set)
    assert time.monotonic() - started < 5  # not the 30 s deadline


def test_a_sender_that_comes_after_the_drop_finds_the_transfer_aborted() -> None:
    shared = store()
    receiver, sender = PairLink(shared, 0, 1, 1, CONFIG), PairLink(shared, 0, 1, 0, CONFIG)
    with pytest.raises(TransferError, match="dropped"):
        receiver.handshake(8, time.monotonic() + 30, lambda: True)
    with pytest.raises(TransferError, match="gave up"):
        sender.handshake(8, time.monotonic() + 30)  # it finds "abort": neither end posts its operation


@pytest.mark.parametrize("sender_first", [True, False])
def test_a_refused_receive_ends_its_senders_wait_at_once_with_the_reason(sender_first: bool) -> None:
    """The destination had no room for the KV: its refusal reaches the waiting sender (or one that comes
    later) through the store, instead of the sender waiting out its 30 s deadline."""
    shared = store()
    receiver, sender = PairLink(shared, 0, 1, 1, CONFIG), PairLink(shared, 0, 1, 0, CONFIG)
    why = "no room for the KV: 40 pages needed, 3 free"
    if sender_first:
        threading.Timer(0.3, receiver.refuse, (9, why)).start()
    else:
        receiver.refuse(9, why)
    started = time.monotonic()
    with pytest.raises(TransferError, match=f"worker 1 refused the transfer: {why}"):
        sender.handshake(9, started + CONFIG.timeout_s)
    assert time.monotonic() - started < 5  # not the 30 s deadline
    key = "sangam/kv/0-1/-1/t9"
    assert not any(shared.check([f"{key}/{name}"]) for name in ("go", "n", "why", "r1"))  # cleaned up
