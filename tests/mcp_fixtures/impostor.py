"""A listener that takes a port as uid 65534 and records what it is sent, for the test
that MCPServer(url=...) sends nothing to whoever listens on its port.

Usage (as root): impostor.py PORT RECORD_FILE [ADDRESS]. Drops to uid/gid 65534, listens on
ADDRESS:PORT (127.0.0.1 by default), appends every byte a connection sends to RECORD_FILE and answers 404.
"""

import os
import socket
import sys

port, record = int(sys.argv[1]), sys.argv[2]
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
address = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((address, port))
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
