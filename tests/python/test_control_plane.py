"""The control plane (Py4J) against a real sidecar: nothing talks to the sidecar from the garbage collector, and a
forked process (a DataLoader worker) never sends on its parent's Py4J connections.

Both once hung a DataLoader: a Java exception (a refused registration) left for the garbage collector was freed
by the collection that torch's queue feeder thread happened to run, a Py4J command sent from that thread; a
worker forked meanwhile freed its own copy on the same inherited connection and read both answers, so the
feeder thread waited for an answer that never came, and the workers for indices that were never sent.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest
from py4j.java_gateway import GatewayConnection
from py4j import protocol
from py4j.protocol import Py4JJavaError

import unstall
from waits import wait_until


FREE = protocol.MEMORY_COMMAND_NAME + protocol.MEMORY_DEL_SUBCOMMAND_NAME  # py4j's command that frees a Java object


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every Py4J command this process sends from now on."""
    commands: list[str] = []
    send = GatewayConnection.send_command

    def spy(self: GatewayConnection, command: str) -> Any:
        commands.append(command)
        return send(self, command)

    monkeypatch.setattr(GatewayConnection, "send_command", spy)
    return commands


def test_a_refused_call_leaves_nothing_for_the_garbage_collector_to_send(
    sidecar: unstall.Sidecar, sent: list[str]
) -> None:
    with pytest.raises(unstall.DatasetNotFoundError) as e:
        sidecar.describe("no-such-dataset")
    assert "no-such-dataset" in str(e.value)
    gc.collect()
    sent.clear()
    del e  # the shim's error, with py4j's (and its Java exception) as its context
    gc.collect()
    frees = [c for c in sent if c.startswith(FREE)]  # not the supervisor's health checks, from its own thread
    assert frees == [], "the Java exception is freed by the call that raised it, not by a later garbage collection"


def _exit_code(pid: int) -> list[int]:
    """``[code]`` once the child ``pid`` exited (reaped), else ``[]``."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return [os.waitstatus_to_exitcode(status)] if done else []


def test_a_forked_process_never_sends_on_its_parents_connections(sidecar: unstall.Sidecar) -> None:
    gateway = sidecar._cp.gateway(sidecar.deadlines.call)  # the gateway of the shim's calls, one connection pooled
    held: Any = None
    try:
        gateway.entry_point.describeDataset("no-such-dataset")
    except Py4JJavaError as e:  # a reference to a Java object that this process holds
        held = e
    assert held is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, as a forked DataLoader worker: drops its copy of the reference, then calls
        code = 1
        try:
            os.close(r)
            held = None
            gc.collect()
            os.write(w, str(sidecar.protocol_version()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        assert wait_until(lambda: _exit_code(pid), "the forked child to exit") == [0]
        answer = os.read(r, 64)
    finally:
        os.close(r)
    assert answer == str(sidecar.protocol_version()).encode(), "the child calls over a connection of its own"
    # The parent's Java object is still there: the child freed nothing of the parent's.
    assert "no-such-dataset" in str(held)
    held.java_exception._detach()
