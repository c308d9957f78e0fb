"""A listener that takes a port as uid 65534 and records what it is sent, for the test
that MCPServer(url=...) sends nothing to whoever listens on its port.

Usage (as root): impostor.py PORT RECORD_FILE. Drops to uid/gid 65534, listens on
127.0.0.1:PORT, appends every byte a connection sends to RECORD_FILE and answers 404.
"""

import os
import socket
import sys

port, record = int(sys.argv[1]), sys.argv[2]
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(16)
while True:
    conn, _ = listener.accept()
    conn.settimeout(2)
    try:
        data = conn.recv(65536)
        with open(record, "ab") as out:
            out.write(data)
        conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    except OSError:
        pass
    finally:
        conn.close()
