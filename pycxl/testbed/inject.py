"""Fault injection into the testbed's emulated CXL devices, through QEMU's QMP.

QEMU 10 can add event records to a type-3 device's event logs and poison to its media
(``cxl-inject-memory-module-event``, ``-general-media-event``, ``-dram-event``,
``cxl-inject-poison``, ``-correctable-error``, ``-uncorrectable-errors``); the guest
kernel then reports them as trace events and in the poison list, as a real device's
would. The guest cannot reach QMP itself: ``pycxl testbed inject`` in the guest writes a
request into the shared work directory, the host side of the harness (runner.py) sends
it to QEMU and writes the answer back.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from ..base.errors import InvalidRequestError, NotAvailableError, OperationError

REQUEST_GLOB = "inject-request-*.json"
ANSWER_WAIT_S = 60.0

# kind -> (QMP command, defaults); every value can be overridden by the request
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "memory-module": ("cxl-inject-memory-module-event", {
        "log": "warning", "flags": 1, "type": 0, "health-status": 2, "media-status": 0,
        "additional-status": 0, "life-used": 90, "temperature": 80, "dirty-shutdown-count": 1,
        "corrected-volatile-error-count": 5, "corrected-persistent-error-count": 0,
    }),
    "general-media": ("cxl-inject-general-media-event", {
        "log": "informational", "flags": 1, "dpa": 0, "descriptor": 3, "type": 3,
        "transaction-type": 192,
    }),
    "dram": ("cxl-inject-dram-event", {
        "log": "informational", "flags": 1, "dpa": 0, "descriptor": 3, "type": 3,
        "transaction-type": 192,
    }),
    "poison": ("cxl-inject-poison", {"start": 0, "length": 64}),
    "correctable": ("cxl-inject-correctable-error", {"type": "mem-data-ecc"}),
    "uncorrectable": ("cxl-inject-uncorrectable-errors", {
        "errors": [{"type": "internal", "header": [0] * 32}],
    }),
}  # fmt: skip


def device_path(qemu_id: str) -> str:
    """QEMU's QOM path of a device given by id on the command line."""
    return f"/machine/peripheral/{qemu_id}"


class Qmp:
    """A QMP client on a unix socket: capabilities negotiated, one command at a time."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise OperationError(f"QEMU's QMP socket {path} did not open") from None
                time.sleep(0.1)
        self._buf = b""
        self._reply()  # the greeting
        self.execute("qmp_capabilities")

    def _reply(self) -> dict[str, Any]:
        while True:
            while b"\n" not in self._buf:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise OperationError("QEMU closed the QMP connection")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            msg: dict[str, Any] = json.loads(line)
            if "event" not in msg:  # asynchronous events are not answers
                return msg

    def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run ``command``; its ``return`` value, or OperationError with QEMU's reason."""
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self._sock.sendall(json.dumps(msg).encode() + b"\n")
        reply = self._reply()
        if "error" in reply:
            raise OperationError(f"QEMU refused {command}: {reply['error'].get('desc')}")
        return reply.get("return")

    def close(self) -> None:
        """Close the connection (QEMU keeps running)."""
        self._sock.close()


def qmp_arguments(kind: str, qemu_id: str, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The QMP command and arguments for an injection of ``kind`` into device ``qemu_id``."""
    if kind not in KINDS:
        raise InvalidRequestError(f"injection kind {kind!r}: use one of {', '.join(KINDS)}")
    command, defaults = KINDS[kind]
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise InvalidRequestError(
            f"{kind} takes {', '.join(sorted(defaults))}; not {', '.join(sorted(unknown))}"
        )
    return command, {"path": device_path(qemu_id), **defaults, **overrides}


def serve_requests(workdir: Path, qmp_socket: str, ids_by_serial: dict[int, str]) -> None:
    """Host side: answer every pending request in ``workdir`` through QMP."""
    for req_path in sorted(workdir.glob(REQUEST_GLOB)):
        answer_path = req_path.with_name(req_path.name.replace("request", "answer"))
        try:
            req = json.loads(req_path.read_text())
            qemu_id = ids_by_serial.get(int(req["serial"]))
            if qemu_id is None:
                raise InvalidRequestError(f"no emulated device has serial {req['serial']:#x}")
            command, arguments = qmp_arguments(req["kind"], qemu_id, req.get("arguments", {}))
            qmp = Qmp(qmp_socket)
            try:
                result = {"ok": True, "command": command, "arguments": arguments,
                          "return": qmp.execute(command, arguments)}  # fmt: skip
            finally:
                qmp.close()
        except Exception as e:  # the guest gets the reason, the harness goes on
            result = {"ok": False, "error": str(e)}
        tmp = answer_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.rename(answer_path)
        req_path.unlink(missing_ok=True)


def check_request(kind: str, arguments: dict[str, Any]) -> None:
    """Refuse an unknown kind or field (InvalidRequestError), then a run outside the
    testbed (NotAvailableError): before anything is read or asked."""
    qmp_arguments(kind, "check", arguments)
    if not os.environ.get("PYCXL_TESTBED_WORKDIR") or os.environ.get("PYCXL_IN_TESTBED") != "1":
        raise NotAvailableError(
            "fault injection runs inside the testbed (pycxl testbed -- pycxl testbed "
            "--inject ...), where the harness forwards it to QEMU"
        )


def request(kind: str, serial: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """Guest side: ask the host to inject; what QEMU was sent (raises what it refused)."""
    check_request(kind, arguments)
    workdir = os.environ["PYCXL_TESTBED_WORKDIR"]
    name = uuid.uuid4().hex
    req = Path(workdir) / f"inject-request-{name}.json"
    tmp = req.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "serial": serial, "arguments": arguments}))
    tmp.rename(req)
    answer = Path(workdir) / f"inject-answer-{name}.json"
    deadline = time.monotonic() + ANSWER_WAIT_S
    while not answer.exists():
        if time.monotonic() > deadline:
            raise OperationError("the testbed host did not answer the injection request")
        time.sleep(0.1)
    result: dict[str, Any] = json.loads(answer.read_text())
    answer.unlink(missing_ok=True)
    if not result.get("ok"):
        raise OperationError(f"injection failed: {result.get('error')}")
    return result
