"""Refuse network connections from a chapter's kernel (put on ``PYTHONPATH`` by the pipeline).

Only loopback and Unix-socket connections pass, so a chapter that tries to download anything
fails at once with a clear message instead of depending on the network.
"""

import ipaddress
import socket

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _is_local(address) -> bool:
    if not isinstance(address, tuple):
        return True  # Unix domain sockets
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse(address) -> None:
    raise ConnectionRefusedError(
        f"icml26: network access is disabled while a chapter executes (tried {address!r}); "
        "generate data in code or ship it in data/"
    )


def _guarded_connect(self, address):
    if not _is_local(address):
        _refuse(address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    if not _is_local(address):
        _refuse(address)
    return _connect_ex(self, address)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
