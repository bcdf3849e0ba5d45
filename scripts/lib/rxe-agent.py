#!/usr/bin/env python3
"""Host end of the rdma_rxe guest's command channel (guest end: scripts/guest/rnic-agent).

Listens on ADDR:PORT for exactly one connection from the guest's agent, sends it one
command (base64, one line), copies the command's output to stdout as it arrives and exits
with the command's exit code, which the agent sends as a last line "__RNIC_RC__=<n>".
Runs inside the link's network namespace (ip netns exec), since ADDR lives only there.

Exit codes besides the command's own: 124 on timeout (no connection, or the command ran
too long; the command keeps running in the guest), 125 when the connection ended without
an exit code, 2 on bad usage.
"""

import argparse
import base64
import os
import socket
import sys
import time

MARKER = b"\n__RNIC_RC__="


def guest_gone(pid) -> bool:
    """True (and says so) when the watched QEMU process no longer exists."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        print(f"rxe-agent: the guest (QEMU pid {pid}) is gone", file=sys.stderr)
        return True
    except PermissionError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="host address on the link")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connect-timeout", type=float, default=60.0,
                    help="seconds to wait for the guest's agent to connect")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds the command may run")
    ap.add_argument("--watch-pid", type=int,
                    help="QEMU's pid: give up at once (125) when it is gone")
    ap.add_argument("command", help="bash command line run in the guest")
    args = ap.parse_args()

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # The previous command's connection may still be in TIME_WAIT on this port.
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Another command of this run may hold the port: wait for it, so that commands issued
    # from several host jobs at once run one after the other.
    wait_until = time.monotonic() + args.connect_timeout
    while True:
        try:
            srv.bind((args.listen, args.port))
            break
        except OSError as e:
            if time.monotonic() >= wait_until:
                print(f"rxe-agent: cannot listen on {args.listen}:{args.port}: {e}",
                      file=sys.stderr)
                return 124
            time.sleep(0.05)
    srv.listen(1)
    # Accept in 1 s slices so that a guest that died is noticed.
    srv.settimeout(1.0)
    try:
        while True:
            try:
                conn, _ = srv.accept()
                break
            except socket.timeout:
                if guest_gone(args.watch_pid):
                    return 125
                if time.monotonic() >= wait_until:
                    print(f"rxe-agent: no guest agent connected within "
                          f"{args.connect_timeout:.0f}s", file=sys.stderr)
                    return 124
    finally:
        srv.close()

    deadline = time.monotonic() + args.timeout
    # The agent prints a newline before the marker; a newline sentinel in front of the
    # stream (never printed) lets an output-less answer match the marker as well.
    buf = b"\n"
    skip = 1
    out = sys.stdout.buffer
    with conn:
        conn.sendall(base64.b64encode(args.command.encode()) + b"\n")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                out.write(buf[skip:])
                out.flush()
                print(f"rxe-agent: command still running after {args.timeout:.0f}s",
                      file=sys.stderr)
                return 124
            conn.settimeout(min(left, 1.0))
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                if guest_gone(args.watch_pid):
                    out.write(buf[skip:])
                    out.flush()
                    return 125
                continue
            if not chunk:
                out.write(buf[skip:])
                out.flush()
                print("rxe-agent: connection closed without an exit code", file=sys.stderr)
                return 125
            buf += chunk
            at = buf.find(MARKER)
            if at >= 0:
                tail = buf[at + len(MARKER):]
                if b"\n" not in tail:
                    continue
                out.write(buf[skip:at])
                out.flush()
                try:
                    return int(tail.split(b"\n", 1)[0])
                except ValueError:
                    print("rxe-agent: malformed exit code", file=sys.stderr)
                    return 125
            # Print all but what could be the start of the marker.
            cut = len(buf) - (len(MARKER) - 1)
            if cut > skip:
                out.write(buf[skip:cut])
                out.flush()
                buf = buf[cut:]
                skip = 0

if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `| grep -q`): exit as a shell would.
        sys.exit(141)
