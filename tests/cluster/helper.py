#!/usr/bin/env python3
"""Small tools for tests/cluster/run.sh (standard library only).

  ports N                 print N free loopback TCP ports, one per line
  relay-of HAPROXY ID     which relay the front routes environment ID to (its X-Execrelay-Relay)
  metric ADDR NAME        one series' value from http://ADDR/metrics (0 if absent)
  tee LISTEN TARGET FILE  a TCP proxy on LISTEN to TARGET recording every byte both ways in FILE
"""
import asyncio
import socket
import sys
import urllib.error
import urllib.request


def ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    for s in socks:
        print(s.getsockname()[1])
    for s in socks:
        s.close()


def relay_of(front, env):
    req = urllib.request.Request(f"http://{front}/v1/connect/{env}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            headers = r.headers
    except urllib.error.HTTPError as e:
        headers = e.headers
    except Exception:  # the front itself is not up yet
        print("none")
        return
    print(headers.get("X-Execrelay-Relay", "none"))


def metric(addr, name):
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:
        print(-1)
        return
    for line in text.splitlines():
        if line.startswith(name + " "):
            print(int(float(line.split()[-1])))
            return
    print(0)


async def tee(listen, target, path):
    out = open(path, "ab", buffering=0)

    async def pipe(reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                out.write(data)
                writer.write(data)
                await writer.drain()
        except Exception:
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def handle(cr, cw):
        host, port = target.rsplit(":", 1)
        try:
            ur, uw = await asyncio.open_connection(host, int(port))
        except Exception:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "ports":
        ports(int(sys.argv[2]))
    elif cmd == "relay-of":
        relay_of(sys.argv[2], sys.argv[3])
    elif cmd == "metric":
        metric(sys.argv[2], sys.argv[3])
    elif cmd == "tee":
        asyncio.run(tee(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")
