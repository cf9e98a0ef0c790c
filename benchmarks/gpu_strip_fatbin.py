"""Zero the CUDA fatbin entries an sm_90 GPU (H100, H200) never loads: other generations' machine
code and PTX for a newer one. `python3 gpu_strip_fatbin.py IN.so OUT.so`. The file keeps its size
and layout, so it packs small; a blob holding no sm_90 code is kept whole."""
import struct, subprocess, sys
path, out = sys.argv[1], sys.argv[2]
data = bytearray(open(path, 'rb').read())
sec = [l for l in subprocess.run(['readelf', '-S', '-W', path], capture_output=True, text=True).stdout.splitlines() if '.nv_fatbin' in l][0]
parts = sec.split(']')[1].split(); off, size = int(parts[3], 16), int(parts[4], 16)
pos, end, zeroed, kept_blobs = off, off + size, 0, 0
while pos < end:
    magic, ver, hsz, fsz = struct.unpack_from('<IHHQ', data, pos)
    if magic != 0xBA55ED50:
        pos += 8; continue
    entries, e, bend = [], pos + hsz, pos + hsz + fsz
    while e < bend:
        kind, _, ehs, padded = struct.unpack_from('<HHII', data, e)
        sm = struct.unpack_from('<I', data, e + 28)[0]
        entries.append((kind, sm, e, ehs, padded)); e += ehs + padded
    assert e == bend, (hex(pos), e, bend)
    if any(k == 2 and sm == 90 for k, sm, *_ in entries):
        for kind, sm, e, ehs, padded in entries:
            if not (kind == 2 and sm == 90):
                data[e + ehs:e + ehs + padded] = bytes(padded); zeroed += padded
    else:
        kept_blobs += 1
    pos = bend
print('zeroed MiB', zeroed >> 20, 'blobs without sm_90 kept whole', kept_blobs)
open(out, 'wb').write(data)
