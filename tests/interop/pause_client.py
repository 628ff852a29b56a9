"""A client that pauses its reader under load, written from secure-transport.md §5 and §7 (its
own flow control on top of noise_client.py's frame codec and Noise session).

It opens one stream (direct `noise+ws://` or `relay+ws://`), asks for `head -c BYTES
/dev/zero`, and reads: every DATA is consumed as it arrives and a bare ACK goes out each time
half a window (8 records of a window of 16) was consumed since the last report, as §7 says a
receiver does. Once PAUSE_AT bytes arrived it stops reading its WebSocket (the websockets
library then stops reading the socket after 16 frames, so TCP fills up behind it) while a
second command (`--second`, a client on another link) runs to its end, and for at least
PAUSE_S seconds; then it reads again; and so on every PAUSE_AT bytes, PAUSES times.

Prints one line:
  OK bytes=N records=R exit=CODE               every byte and the exit notice arrived (exit 0)
  STALL consumed=C acked=A bytes=N              nothing for STALL_S seconds on a live link (exit 3)
  SHORT bytes=N ...                             the exit notice came with bytes missing (exit 4)
  ERROR ...                                     anything else (exit 2)
"""
import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import noise_client as nc  # noqa: E402

try:
    import websockets.sync.client
except ImportError as e:  # pragma: no cover - the test's venv has it
    print(f"ERROR missing package: {e}", flush=True)
    sys.exit(2)

WINDOW = 16  # records past our ack we accept: the spec's default (§7)


class PauseClient:
    def __init__(self, url, server_pub, client_key):
        env_id = ""
        if url.startswith("relay+ws://"):
            host, env_id = url[len("relay+ws://"):].split("/", 1)
            ws_url = f"ws://{host}/v1/connect/{env_id}"
        elif url.startswith("noise+ws://"):
            ws_url = "ws://" + url[len("noise+ws://"):].rstrip("/") + nc.LINK_PATH
        else:
            raise nc.Failure(f"unsupported URL {url!r}")
        # max_queue=16: the library stops reading the socket once 16 frames wait unread, so a
        # pause of ours is a pause of the TCP reader too.
        self.ws = websockets.sync.client.connect(
            ws_url, origin=None, proxy=None, compression=None,
            max_size=nc.MAX_FRAME_BYTES, max_queue=16, open_timeout=20, close_timeout=2)
        link = nc.Link.__new__(nc.Link)
        link.ws = self.ws
        link.deadline = time.monotonic() + 3600
        link.queued = {}
        self.stream = nc.Stream(link, nc.load_private_key(client_key),
                                nc.load_public_key(server_pub), env_id)
        msg1 = bytes(self.stream.noise.write_message(nc.handshake_payload(None)))
        self.ws.send(nc.encode_frame(nc.OPEN, self.stream.stream_id, msg1, window=WINDOW))
        self.stream.accept()
        self.consumed = 0
        self.acked = 0
        self.bytes = 0
        self.exited = None

    def send_message(self, obj):
        st = self.stream
        body = json.dumps(obj, separators=(",", ":")).encode()
        data = struct.pack("!I", len(body)) + body
        for off in range(0, len(data), nc.MAX_RECORD_PLAINTEXT):
            n = st.next_send
            st.next_send += 1
            piece = bytes([nc.KIND_STREAM]) + data[off:off + nc.MAX_RECORD_PLAINTEXT]
            frame = nc.encode_frame(nc.DATA, st.stream_id, st.send_cipher.encrypt(n, piece),
                                    seq=n, ack=self.consumed, window=WINDOW)
            self.ws.send(frame)

    def read_one(self, timeout):
        """Handle one frame; False if none came within `timeout`."""
        try:
            data = self.ws.recv(timeout=timeout)
        except TimeoutError:
            return False
        st = self.stream
        f = nc.Frame(data)
        if f.stream_id != st.stream_id:
            return True
        if f.ftype == nc.RESET:
            raise nc.Failure(f"stream reset: {f.reset_reason()!r}")
        if f.ftype != nc.DATA:
            return True
        if f.seq != self.consumed + 1:
            raise nc.Failure(f"record {f.seq} after {self.consumed}")
        if f.seq > self.acked + WINDOW:
            raise nc.Failure(f"record {f.seq} past our window (acked {self.acked})")
        record = st.recv_cipher.decrypt(f.seq, f.payload)
        self.consumed = f.seq
        if record[0] != nc.KIND_STREAM:
            raise nc.Failure(f"close record: {record[1:]!r}")
        st.stream_bytes += record[1:]
        st._split_messages()
        if self.consumed - self.acked >= WINDOW // 2:
            self.acked = self.consumed
            self.ws.send(nc.encode_frame(nc.ACK, st.stream_id, ack=self.acked, window=WINDOW))
        while st.messages:
            m = st.messages.pop(0)
            if m.get("binary"):
                self.bytes += len(m["params"]["data"])
            elif m.get("method") == "process/outputDelta":
                self.bytes += len(base64.b64decode(m["params"]["chunk"]))
            elif m.get("method") == "process/exited":
                self.exited = m["params"]
            elif "error" in m:
                raise nc.Failure(f"error response: {m}")
        return True


def main():
    ap = argparse.ArgumentParser(description="a client that pauses its reader under load")
    ap.add_argument("url")
    ap.add_argument("server_pub")
    ap.add_argument("client_key")
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--pause-at", type=int, required=True,
                    help="pause once this many bytes arrived, then again every as many")
    ap.add_argument("--pause-s", type=float, default=1.5)
    ap.add_argument("--pauses", type=int, default=1, help="how many pauses (--second runs in the first)")
    ap.add_argument("--stall-s", type=float, default=20.0)
    ap.add_argument("--second", default="", help="a shell command run during the pause")
    ap.add_argument("--json-output", action="store_true")
    a = ap.parse_args()
    try:
        c = PauseClient(a.url, a.server_pub, a.client_key)
        c.send_message({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "clientName": "pause-client",
            "capabilities": {"binaryOutput": not a.json_output}}})
        c.send_message({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        c.send_message({"jsonrpc": "2.0", "id": 2, "method": "process/start", "params": {
            "processId": "p", "argv": ["head", "-c", str(a.bytes), "/dev/zero"]}})
        pauses = 0
        last = time.monotonic()
        while c.exited is None:
            if pauses < a.pauses and c.bytes >= a.pause_at * (pauses + 1):
                pauses += 1
                t0 = time.monotonic()
                if a.second and pauses == 1:
                    subprocess.run(a.second, shell=True, check=False,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                left = a.pause_s - (time.monotonic() - t0)
                if left > 0:
                    time.sleep(left)  # the pause itself is the scenario, not a wait for anything
                last = time.monotonic()
            if c.read_one(1.0):
                last = time.monotonic()
            elif time.monotonic() - last > a.stall_s:
                print(f"STALL consumed={c.consumed} acked={c.acked} bytes={c.bytes}", flush=True)
                return 3
        code = c.exited.get("exitCode")
        if c.bytes != a.bytes:
            print(f"SHORT bytes={c.bytes} records={c.consumed} exit={code}", flush=True)
            return 4
        print(f"OK bytes={c.bytes} records={c.consumed} exit={code}", flush=True)
        c.ws.close()
        return 0
    except nc.Failure as e:
        print(f"ERROR {e}", flush=True)
        return 2
    except Exception as e:  # noqa: BLE001 - anything unexpected is a failure too
        print(f"ERROR unexpected {e!r}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
