"""What crossed a network interface, for e2e.multinode_netns (run as root, in the namespace).

  wire_capture.py capture IFACE OUT SECONDS   every frame on IFACE (both directions) into OUT until
                                              SIGTERM or SECONDS pass
  wire_capture.py payload OUT PORTS...        the TCP payload of the IPv4 packets to or from one of
                                              PORTS (the troupe ranks' listening ports): prints the
                                              byte count and whether MARKER occurs in it (MARKER and
                                              the verdict wanted come from the environment: MARKER,
                                              WANT=present|absent)
"""
import os
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003


def capture(iface, out, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.settimeout(0.2)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    end = time.time() + seconds
    with open(out, "wb") as f:
        print("capturing", iface, flush=True)
        while not stop and time.time() < end:
            try:
                frame = s.recv(65535)
            except socket.timeout:
                continue
            f.write(struct.pack("<I", len(frame)) + frame)
            f.flush()


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, i)
        yield data[i + 4:i + 4 + n]
        i += 4 + n


def payload(path, ports):
    flows = {}  # (src port, dst port) -> payload bytes, in capture order
    for fr in frames(path):
        if len(fr) < 14 + 20 or fr[12:14] != b"\x08\x00":  # IPv4 only
            continue
        ip = fr[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6:  # TCP
            continue
        total = struct.unpack_from(">H", ip, 2)[0]
        tcp = ip[ihl:total]
        sport, dport = struct.unpack_from(">HH", tcp, 0)
        if sport not in ports and dport not in ports:
            continue
        off = (tcp[12] >> 4) * 4
        flows.setdefault((sport, dport), bytearray()).extend(tcp[off:])
    return flows


def main():
    if sys.argv[1] == "capture":
        capture(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    flows = payload(sys.argv[2], {int(p) for p in sys.argv[3:]})
    marker = os.environ["MARKER"].encode()
    n = sum(len(b) for b in flows.values())
    hits = sum(b.count(marker) for b in flows.values())
    print("troupe tcp between the hosts: %d flows, %d payload bytes, %r seen %d times" % (len(flows), n, marker, hits))
    if n < 10000:
        sys.exit("FAIL: too little troupe traffic captured")
    if (hits > 0) != (os.environ["WANT"] == "present"):
        sys.exit("FAIL: %r expected %s" % (marker, os.environ["WANT"]))


if __name__ == "__main__":
    main()
