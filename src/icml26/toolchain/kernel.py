"""The kernel that executes chapters: ipykernel reached over Unix sockets only.

The pipeline starts kernels with the IPC transport, so the five message channels are Unix
sockets in a private directory. ipykernel still opens one TCP socket of its own, on 127.0.0.1,
through which forked subprocesses would send their output; the chapters fork none, so this
launcher turns that pipe off and the kernel listens on no TCP port at all.
"""

from __future__ import annotations

import ipykernel.kernelapp as kernelapp
from ipykernel.iostream import IOPubThread


class _IOPubWithoutTCPPipe(IOPubThread):
    """ipykernel's IOPub thread without the loopback TCP pipe for forked subprocesses."""

    def _setup_pipe_in(self) -> None:
        self._pipe_flag = False


def main() -> None:
    kernelapp.IOPubThread = _IOPubWithoutTCPPipe  # the app builds its IOPub thread from this name
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
