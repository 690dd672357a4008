#!/usr/bin/env python3
"""Independent re-check of the known-answer vector files in this folder.

Usage (from the repository root):

    python3 crypto-offload/vectors/verify.py [FILE ...]

With no argument every ``*.txt`` file next to this script is checked (the five
expected files must all be present).  For each file the number of records
checked is printed; the exit status is non-zero on any parse error or mismatch.

What is checked, record by record:

* cipher records (aes-*-cbc / aes-*-ctr / aes-*-xts): encryption of ``pt``
  gives ``ct`` and decryption of ``ct`` gives ``pt`` with pyca/cryptography
  (OpenSSL).  XTS records are additionally checked against a small reference
  XTS implementation written here on top of raw AES-ECB (IEEE Std 1619-2007
  section 5, including ciphertext stealing), so the XTS data does not rely on
  OpenSSL's XTS code alone.  OpenSSL refuses XTS keys whose two halves are
  equal ("duplicated keys are not allowed"); such records (IEEE 1619 vector 1)
  are checked with the reference implementation only, and reported.
* aead records (aes-*-gcm): ``result = valid`` -> AESGCM encryption gives
  ``ct || tag`` and decryption succeeds; ``result = invalid`` -> decryption
  must raise InvalidTag.
* crc records: a bit-by-bit CRC built only from the RevEng catalogue
  parameters (width/poly/init/refin/refout/xorout) must equal ``crc``; the
  implementation first checks itself against every catalogue "check" value.

Requires: cryptography (pip install cryptography).
"""

import os
import re
import sys

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FILES = [
    "sp800-38a.txt",
    "ieee1619-xts.txt",
    "gcm-spec.txt",
    "crc-catalogue.txt",
    "edge-cases.txt",
]

CIPHER_ALGS = {
    # alg: (mode, AES key length in bytes; XTS keys are twice this)
    "aes-128-cbc": ("cbc", 16),
    "aes-192-cbc": ("cbc", 24),
    "aes-256-cbc": ("cbc", 32),
    "aes-128-ctr": ("ctr", 16),
    "aes-192-ctr": ("ctr", 24),
    "aes-256-ctr": ("ctr", 32),
    "aes-128-xts": ("xts", 16),
    "aes-256-xts": ("xts", 32),
}
AEAD_ALGS = {"aes-128-gcm": 16, "aes-192-gcm": 24, "aes-256-gcm": 32}

# Greg Cook, "Catalogue of parametrised CRC algorithms",
# https://reveng.sourceforge.io/crc-catalogue/
CRC_ALGS = {
    "crc-32/iso-hdlc": dict(width=32, poly=0x04C11DB7, init=0xFFFFFFFF, refin=True,
                            refout=True, xorout=0xFFFFFFFF, check=0xCBF43926),
    "crc-32/iscsi": dict(width=32, poly=0x1EDC6F41, init=0xFFFFFFFF, refin=True,
                         refout=True, xorout=0xFFFFFFFF, check=0xE3069283),
    "crc-64/nvme": dict(width=64, poly=0xAD93D23594C93659, init=0xFFFFFFFFFFFFFFFF,
                        refin=True, refout=True, xorout=0xFFFFFFFFFFFFFFFF,
                        check=0xAE8B14860A799888),
    "crc-64/xz": dict(width=64, poly=0x42F0E1EBA9EA3693, init=0xFFFFFFFFFFFFFFFF,
                      refin=True, refout=True, xorout=0xFFFFFFFFFFFFFFFF,
                      check=0x995DC9BBDF1939FA),
    "crc-64/go-iso": dict(width=64, poly=0x000000000000001B, init=0xFFFFFFFFFFFFFFFF,
                          refin=True, refout=True, xorout=0xFFFFFFFFFFFFFFFF,
                          check=0xB90956C775A41001),
}

HEX_RE = re.compile(r"^(?:[0-9a-f]{2})*$")
LINE_RE = re.compile(r"^([a-z][a-z0-9_]*) = (.*)$")
HEX_FIELDS = {"key", "iv", "pt", "ct", "aad", "tag", "input", "crc"}


class VectorError(Exception):
    pass


# --------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------

def parse(path):
    """Return a list of (line_number, {field: value}) records."""
    with open(path, "r", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if not lines or not lines[0].startswith("#"):
        raise VectorError("%s: file must start with a '#' comment header" % path)
    records = []
    cur, start = None, None
    for n, raw in enumerate(lines, 1):
        if raw.endswith("\r"):
            raise VectorError("%s:%d: CR line ending" % (path, n))
        if raw.startswith("#"):
            continue
        if raw.strip() == "":
            if cur is not None:
                records.append((start, cur))
                cur = None
            continue
        m = LINE_RE.match(raw)
        if not m:
            raise VectorError("%s:%d: not 'field = value': %r" % (path, n, raw))
        field, value = m.group(1), m.group(2)
        if value != value.strip():
            raise VectorError("%s:%d: stray whitespace in value" % (path, n))
        if cur is None:
            cur, start = {}, n
        if field in cur:
            raise VectorError("%s:%d: duplicate field %r" % (path, n, field))
        if field in HEX_FIELDS and not HEX_RE.match(value):
            raise VectorError("%s:%d: %s is not lowercase even-length hex" % (path, n, field))
        cur[field] = value
    if cur is not None:
        records.append((start, cur))
    return records


def need(rec, fields, allowed):
    missing = [f for f in fields if f not in rec]
    if missing:
        raise VectorError("missing field(s) %s" % ", ".join(missing))
    extra = [f for f in rec if f not in allowed]
    if extra:
        raise VectorError("unexpected field(s) %s" % ", ".join(extra))


def h(rec, field):
    return bytes.fromhex(rec[field])


# --------------------------------------------------------------------------
# AES helpers (pyca/cryptography)
# --------------------------------------------------------------------------

def _run(cipher_obj, encrypt, data):
    ctx = cipher_obj.encryptor() if encrypt else cipher_obj.decryptor()
    return ctx.update(data) + ctx.finalize()


def aes_ecb_block(key, block, encrypt=True):
    return _run(Cipher(algorithms.AES(key), modes.ECB()), encrypt, block)


def _xor(a, b):
    return bytes(x ^ y for x, y in zip(a, b))


def _mul_alpha(t):
    """Multiply the 16-byte tweak by alpha (x) in GF(2^128), IEEE 1619 5.2
    (little-endian byte order, reduction polynomial x^128+x^7+x^2+x+1)."""
    out = bytearray(16)
    carry = 0
    for i in range(16):
        out[i] = ((t[i] << 1) & 0xFF) | carry
        carry = t[i] >> 7
    if carry:
        out[0] ^= 0x87
    return bytes(out)


def ref_xts(key, tweak, data, encrypt):
    """Reference XTS-AES (IEEE Std 1619-2007, 5.3 / 5.4) on raw AES-ECB."""
    if len(data) < 16:
        raise VectorError("XTS needs at least 16 bytes")
    k1, k2 = key[: len(key) // 2], key[len(key) // 2:]
    t = aes_ecb_block(k2, tweak, True)
    m, r = divmod(len(data), 16)
    blocks = [data[i * 16:(i + 1) * 16] for i in range(m)]
    tweaks = []
    for _ in range(m + 1):
        tweaks.append(t)
        t = _mul_alpha(t)

    def blk(b, tw):
        return _xor(aes_ecb_block(k1, _xor(b, tw), encrypt), tw)

    out = []
    full = m if r == 0 else m - 1
    for j in range(full):
        out.append(blk(blocks[j], tweaks[j]))
    if r:
        tail = data[m * 16:]
        if encrypt:
            cc = blk(blocks[m - 1], tweaks[m - 1])
            out.append(blk(tail + cc[r:], tweaks[m]))
            out.append(cc[:r])
        else:
            pp = blk(blocks[m - 1], tweaks[m])
            out.append(blk(tail + pp[r:], tweaks[m - 1]))
            out.append(pp[:r])
    return b"".join(out)


# --------------------------------------------------------------------------
# record checks
# --------------------------------------------------------------------------

class Notes:
    def __init__(self):
        self.items = []


def check_cipher(rec, notes):
    need(rec, ["alg", "source", "key", "iv", "pt", "ct"],
         {"alg", "source", "key", "iv", "pt", "ct"})
    mode, klen = CIPHER_ALGS[rec["alg"]]
    key, iv, pt, ct = h(rec, "key"), h(rec, "iv"), h(rec, "pt"), h(rec, "ct")
    if len(iv) != 16:
        raise VectorError("iv must be 16 bytes, got %d" % len(iv))
    if len(pt) != len(ct):
        raise VectorError("pt/ct length differ")
    if mode == "xts":
        if len(key) != 2 * klen:
            raise VectorError("XTS key must be %d bytes" % (2 * klen))
        if len(pt) < 16:
            raise VectorError("XTS data unit shorter than 16 bytes")
        got_e, got_d = ref_xts(key, iv, pt, True), ref_xts(key, iv, ct, False)
        if got_e != ct:
            raise VectorError("reference XTS encrypt mismatch: got %s" % got_e.hex())
        if got_d != pt:
            raise VectorError("reference XTS decrypt mismatch: got %s" % got_d.hex())
        if key[:klen] == key[klen:]:
            notes.items.append("%s: Key1 == Key2, OpenSSL refuses such XTS keys; "
                               "checked with the reference XTS only" % rec["source"])
            return
        c = Cipher(algorithms.AES(key), modes.XTS(iv))
    else:
        if len(key) != klen:
            raise VectorError("key must be %d bytes" % klen)
        if mode == "cbc":
            if len(pt) % 16:
                raise VectorError("CBC data not a multiple of 16 bytes")
            c = Cipher(algorithms.AES(key), modes.CBC(iv))
        else:
            c = Cipher(algorithms.AES(key), modes.CTR(iv))
    got_e = _run(c, True, pt)
    if got_e != ct:
        raise VectorError("encrypt mismatch: got %s" % got_e.hex())
    got_d = _run(c, False, ct)
    if got_d != pt:
        raise VectorError("decrypt mismatch: got %s" % got_d.hex())


def check_aead(rec, notes):
    fields = ["alg", "source", "key", "iv", "aad", "pt", "ct", "tag", "result"]
    need(rec, fields, set(fields))
    key, iv, aad = h(rec, "key"), h(rec, "iv"), h(rec, "aad")
    pt, ct, tag = h(rec, "pt"), h(rec, "ct"), h(rec, "tag")
    if len(key) != AEAD_ALGS[rec["alg"]]:
        raise VectorError("key length does not match alg")
    if len(iv) != 12:
        raise VectorError("GCM iv must be 12 bytes")
    if len(tag) != 16:
        raise VectorError("tag must be 16 bytes")
    if len(pt) != len(ct):
        raise VectorError("pt/ct length differ")
    g = AESGCM(key)
    if rec["result"] == "valid":
        got = g.encrypt(iv, pt, aad)
        if got != ct + tag:
            raise VectorError("encrypt mismatch: got ct=%s tag=%s"
                              % (got[:-16].hex(), got[-16:].hex()))
        if g.decrypt(iv, ct + tag, aad) != pt:
            raise VectorError("decrypt mismatch")
    elif rec["result"] == "invalid":
        try:
            g.decrypt(iv, ct + tag, aad)
        except InvalidTag:
            return
        raise VectorError("invalid record was accepted by AES-GCM decryption")
    else:
        raise VectorError("result must be 'valid' or 'invalid'")


def crc_compute(params, data):
    """Bit-by-bit CRC from the catalogue (Rocksoft/Williams) parameters."""
    w = params["width"]
    top, mask = 1 << (w - 1), (1 << w) - 1
    reg = params["init"]
    for byte in data:
        if params["refin"]:
            byte = int("{:08b}".format(byte)[::-1], 2)
        reg ^= byte << (w - 8)
        for _ in range(8):
            reg = ((reg << 1) ^ params["poly"]) if reg & top else (reg << 1)
            reg &= mask
    if params["refout"]:
        reg = int("{:0{w}b}".format(reg, w=w)[::-1], 2)
    return reg ^ params["xorout"]


def crc_self_test():
    for name, p in CRC_ALGS.items():
        got = crc_compute(p, b"123456789")
        if got != p["check"]:
            raise VectorError("CRC implementation self-test failed for %s: %x" % (name, got))


def check_crc(rec, notes):
    need(rec, ["alg", "source", "input", "crc"], {"alg", "source", "input", "crc"})
    p = CRC_ALGS[rec["alg"]]
    digits = p["width"] // 4
    if len(rec["crc"]) != digits:
        raise VectorError("crc must be %d hex digits" % digits)
    got = crc_compute(p, h(rec, "input"))
    if got != int(rec["crc"], 16):
        raise VectorError("crc mismatch: got %0*x" % (digits, got))


def check_record(rec, notes):
    if "alg" not in rec or "source" not in rec or not rec["source"]:
        raise VectorError("record without alg/source")
    alg = rec["alg"]
    if alg in CIPHER_ALGS:
        check_cipher(rec, notes)
    elif alg in AEAD_ALGS:
        check_aead(rec, notes)
    elif alg in CRC_ALGS:
        check_crc(rec, notes)
    else:
        raise VectorError("unknown alg %r" % alg)


# --------------------------------------------------------------------------

def main(argv):
    crc_self_test()
    if argv:
        paths = argv
    else:
        missing = [f for f in EXPECTED_FILES if not os.path.exists(os.path.join(HERE, f))]
        if missing:
            print("MISSING: %s" % ", ".join(missing))
            return 1
        paths = sorted(os.path.join(HERE, f) for f in os.listdir(HERE) if f.endswith(".txt"))
    failures, total = 0, 0
    for path in paths:
        notes = Notes()
        name = os.path.basename(path)
        try:
            records = parse(path)
        except (VectorError, OSError, UnicodeDecodeError) as e:
            print("%s: PARSE ERROR: %s" % (name, e))
            failures += 1
            continue
        bad = 0
        per_alg = {}
        for line, rec in records:
            try:
                check_record(rec, notes)
                per_alg[rec["alg"]] = per_alg.get(rec["alg"], 0) + 1
            except Exception as e:  # report every failing record, keep going
                bad += 1
                print("%s:%d: FAIL [%s | %s]: %s"
                      % (name, line, rec.get("alg"), rec.get("source"), e))
        if not records:
            print("%s: no records" % name)
            bad += 1
        failures += bad
        total += len(records) - bad
        detail = ", ".join("%s %d" % kv for kv in sorted(per_alg.items()))
        print("%-18s %4d records checked, %d failed  (%s)" % (name, len(records), bad, detail))
        for n in notes.items:
            print("    note: %s" % n)
    print("vectors: %d passed, %d failed" % (total, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
