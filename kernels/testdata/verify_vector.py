#!/usr/bin/env python3
# An independent check of the endorsement test vector (ENDORSEMENT.md),
# written without the Go code: canonical bytes by RFC 8785 for this record
# (ASCII strings, sorted keys; Python's float repr equals ECMAScript's for
# the vector's numbers), the domain-separated message, and the Ed25519
# signature by the key whose seed is 32 bytes of 0x01.
# Needs the `cryptography` package. Run from kernels/testdata.
import base64, json
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

def canon(v):
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + canon(v[k]) for k in sorted(v)) + "}"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)

rec = open("endorsement-vector.json", "rb").read().rstrip(b"\n")
obj = json.loads(rec)
assert canon(obj).encode() == rec, "the record is not in canonical form"
msg = b"rdrr-endorsement-v1\x00" + canon(obj["endorsement"]).encode()
assert msg.hex() == open("endorsement-vector-message.hex").read().strip(), "message differs"
key = Ed25519PrivateKey.from_private_bytes(bytes([1]) * 32)
key.public_key().verify(base64.b64decode(obj["sig"]), msg)
assert base64.b64encode(key.sign(msg)).decode() == obj["sig"], "signature differs"
print("vector OK")
