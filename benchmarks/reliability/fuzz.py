"""Seeded fuzz inputs for the reliability suite: broken SDP offers and invalid data-channel messages.

- `sdp_offers`: mutations (1-3 stacked) of real offers (offers/: Chromium's and aiortc's). Starting from
  real offers keeps most of every input on the parser's ordinary path, so the damage lands where the
  edge cases are (a missing fingerprint, a bogus candidate, a 300-section bundle) instead of being
  refused on the first line.
- `control_messages`: data-channel payloads that `server.wire.protocol.parse_client_message` must refuse
  with a ProtocolError, by construction. A server fed these may answer with `error` messages and
  count them as invalid, and nothing else: no crash, no state change, no other exception.
- `regressions`: payloads the parser once accepted or crashed on; sent first by the suite.

Everything is a pure function of (seed, index): each item has its own `random.Random`, so the item a
run failed on can be rebuilt alone (`sdp_offer`, `control_message`) without replaying the ones before.
"""

from __future__ import annotations

import functools
import json
import random
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.wire.protocol import KNOWN_TYPES, MAX_CONTROL_MESSAGE_BYTES, MAX_PROMPT_CHARS
from workers.controls import MAX_KEY_NAME, MAX_KEYS, MAX_LOOK_PX

OFFERS_DIR = Path(__file__).parent / "offers"


@dataclass(frozen=True)
class FuzzOffer:
    mutation: str  # the mutations applied, in order, joined by "+" (e.g. "drop_line+non_utf8")
    body: bytes  # the offer bytes as sent
    # The body decodes as UTF-8, so it can go in a JSON body {"sdp": ...}; otherwise only the raw WHEP
    # route (application/sdp) can carry it.
    utf8: bool

    @property
    def mutations(self) -> tuple[str, ...]:
        return tuple(self.mutation.split("+"))


@dataclass(frozen=True)
class FuzzMessage:
    category: str  # one of CONTROL_CATEGORIES (parser_gaps: a name for the gap)
    payload: str | bytes  # sent as-is on the data channel (bytes -> a binary message)


# ---- seed offers ----


@functools.cache
def _seed_items() -> tuple[tuple[str, str], ...]:
    # Sorted, so that rng.choice picks the same offer for a seed whatever order the directory lists in.
    # read_bytes, not read_text: universal newlines would turn the offers' CRLF into LF.
    return tuple(sorted((p.stem, p.read_bytes().decode("utf-8")) for p in OFFERS_DIR.glob("*.sdp")))


def seed_offers() -> dict[str, str]:
    """name -> SDP text of the real offers the mutations start from (CRLF, as captured)."""
    return dict(_seed_items())


# ---- SDP helpers ----


def _lines(body: bytes) -> list[bytes]:
    return body.splitlines(keepends=True)


def _eol(body: bytes) -> bytes:
    return b"\r\n" if b"\r\n" in body or b"\n" not in body else b"\n"


def _split_eol(line: bytes) -> tuple[bytes, bytes]:
    content = line.rstrip(b"\r\n")
    return content, line[len(content) :]


def _sections(lines: list[bytes]) -> list[tuple[int, int]]:
    """(first, end) line indices of each m-section."""
    starts = [i for i, line in enumerate(lines) if line.startswith(b"m=")]
    return list(zip(starts, [*starts[1:], len(lines)]))


def _section(lines: list[bytes], kind: bytes) -> tuple[int, int] | None:
    for first, end in _sections(lines):
        if lines[first].startswith(b"m=" + kind):
            return first, end
    return None


def _insert_in_section(rng: random.Random, lines: list[bytes], new: list[bytes], kind: bytes | None = None) -> None:
    """Insert `new` at a random point of an m-section (of `kind` if there is one), else at the end."""
    span = _section(lines, kind) if kind is not None else None
    sections = _sections(lines)
    if span is None and sections:
        span = rng.choice(sections)
    at = rng.randint(span[0] + 1, span[1]) if span is not None else len(lines)
    lines[at:at] = new


def _drop_prefixed(lines: list[bytes], prefixes: tuple[bytes, ...]) -> list[bytes]:
    return [line for line in lines if not line.startswith(prefixes)]


def _random_ascii(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits + string.punctuation, k=n))


def _random_unicode(rng: random.Random, n: int) -> str:
    chars: list[str] = []
    while len(chars) < n:
        cp = rng.randint(0xA0, 0x10FFFF)
        if not 0xD800 <= cp <= 0xDFFF:  # surrogates cannot be encoded: they would make the body non-UTF-8
            chars.append(chr(cp))
    return "".join(chars)


def _long_word(rng: random.Random, n: int = 10_000) -> str:
    # A repeated random chunk: as good as n random characters to a parser, and ~100x cheaper to make.
    chunk = "".join(rng.choices(string.ascii_letters, k=16))
    return (chunk * (n // 16 + 1))[:n]


# ---- SDP mutations: (rng, body, max_bytes) -> body ----

Mutation = Callable[[random.Random, bytes, int], bytes]


def _drop_line(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lines = _lines(body)
    if lines:
        del lines[rng.randrange(len(lines))]
    return b"".join(lines)


def _duplicate_line(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lines = _lines(body)
    if lines:
        line = lines[rng.randrange(len(lines))]
        lines.insert(rng.randint(0, len(lines)), line)
    return b"".join(lines)


def _swap_lines(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lines = _lines(body)
    if len(lines) >= 2:
        i, j = rng.sample(range(len(lines)), 2)
        lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def _truncate(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    return body[: rng.randrange(len(body))] if body else body


_TOKEN = re.compile(rb"\d+|[A-Za-z][A-Za-z0-9_-]*")
_NUMBERS = (b"99999999999999999999999999999999", b"18446744073709551616", b"-1", b"-2147483649", b"0", b"1.5", b"")


def _replace_token(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lines = _lines(body)
    if not lines:
        return body
    for _ in range(8):  # a few tries: some lines (blank, binary) have no token
        i = rng.randrange(len(lines))
        matches = list(_TOKEN.finditer(lines[i]))
        if matches:
            break
    else:
        return body
    match = rng.choice(matches)
    if match.group().isdigit():
        new = rng.choice((*_NUMBERS, str(rng.randint(2**32, 10**30)).encode()))
    else:
        kind = rng.randrange(3)
        if kind == 0:
            new = _random_ascii(rng, rng.randint(1, 40)).encode()
        elif kind == 1:
            new = _random_unicode(rng, rng.randint(1, 20)).encode()
        else:
            new = _long_word(rng).encode()
    line = lines[i]
    lines[i] = line[: match.start()] + new + line[match.end() :]
    return b"".join(lines)


def _no_fingerprint(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    return b"".join(_drop_prefixed(_lines(body), (b"a=fingerprint:",)))


def _no_ice_credentials(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    which = rng.choice(((b"a=ice-ufrag:", b"a=ice-pwd:"), (b"a=ice-ufrag:",), (b"a=ice-pwd:",)))
    lines = _lines(body)
    if rng.random() < 0.25:  # present but blank: a different code path from absent
        out = []
        for line in lines:
            if line.startswith(which):
                content, eol = _split_eol(line)
                line = content.split(b":", 1)[0] + b":" + eol
            out.append(line)
        return b"".join(out)
    return b"".join(_drop_prefixed(lines, which))


def _bad_hash(rng: random.Random, digest: bytes) -> tuple[bytes, bytes]:
    pairs = digest.split(b":") if digest else [b"AB"] * 32
    kind = rng.randrange(7)
    if kind == 0:  # too short
        return b"", b":".join(pairs[: rng.randint(1, max(1, len(pairs) - 1))])
    if kind == 1:  # too long
        return b"", b":".join(pairs + [b"%02X" % rng.randrange(256) for _ in range(rng.randint(1, 32))])
    if kind == 2:  # not hex
        bad = list(pairs)
        for i in rng.sample(range(len(bad)), rng.randint(1, len(bad))):
            bad[i] = rng.choice((b"ZZ", b"G1", b"--", b"\xc3\xa9", b" "))
        return b"", b":".join(bad)
    if kind == 3:  # no separators
        return b"", b"".join(pairs)
    if kind == 4:  # well formed but not the certificate's: fails at the DTLS handshake, not the parser
        return b"", b":".join(b"%02X" % rng.randrange(256) for _ in pairs)
    if kind == 5:
        return rng.choice((b"sha-999", b"md5", b"", b"SHA-256x")), b":".join(pairs)
    return b"", b""


def _bad_fingerprint(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lines = _lines(body)
    targets = [i for i, line in enumerate(lines) if line.startswith(b"a=fingerprint:")]
    if not targets:  # an earlier mutation took them: put a broken one back
        _insert_in_section(rng, lines, [b"a=fingerprint:sha-256 ZZ:00" + _eol(body)])
        return b"".join(lines)
    if rng.random() < 0.5:
        targets = [rng.choice(targets)]
    for i in targets:
        content, eol = _split_eol(lines[i])
        algorithm, _, digest = content[len(b"a=fingerprint:") :].partition(b" ")
        new_algorithm, new_digest = _bad_hash(rng, digest)
        lines[i] = b"a=fingerprint:" + (new_algorithm or algorithm) + b" " + new_digest + eol
    return b"".join(lines)


def _oversize(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    need = max(1, max_bytes + 1 - len(body)) + rng.randint(0, max_bytes)  # always past max_bytes
    if rng.random() < 0.75:
        line = b"a=x-junk:" + _long_word(rng, rng.randint(16, 1000)).encode() + eol
        junk = line * (need // len(line) + 1)
    else:  # one giant line: line-length limits and line counts are different guards
        junk = b"a=x-junk:" + b"y" * need + eol
    lines = _lines(body)
    at = rng.choice((len(lines), rng.randint(0, len(lines))))
    return b"".join(lines[:at]) + junk + b"".join(lines[at:])


_INVALID_UTF8 = (
    b"\xff\xfe\xc3\x28",
    b"\xff",
    b"\xc3\x28",
    b"\xc0\xaf",  # overlong '/'
    b"\xed\xa0\x80",  # an encoded surrogate
    b"\xf8\x88\x80\x80\x80",  # a 5-byte form
    b"\x80",  # a lone continuation byte
    b"\xe2\x82",  # a sequence cut short
)


def _non_utf8(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    if rng.random() < 0.2:  # a Latin-1 session name, the way a naive client would write one
        lines = _lines(body)
        for i, line in enumerate(lines):
            if line.startswith(b"s="):
                lines[i] = b"s=caf\xe9" + _split_eol(line)[1]
                return b"".join(lines)
    at = rng.randint(0, len(body))
    return body[:at] + rng.choice(_INVALID_UTF8) + body[at:]


def _nul_bytes(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return body + b"\x00"  # C-string habits
    if kind == 1:
        return b"\x00" + body
    if kind == 2 and body:
        lines = _lines(body)
        i = rng.randrange(len(lines))
        content, eol = _split_eol(lines[i])
        cut = content.find(b"=") + 1
        lines[i] = content[:cut] + b"\x00" * rng.randint(1, 64) + eol
        return b"".join(lines)
    out = bytearray(body)
    for _ in range(rng.randint(1, 8)):
        out.insert(rng.randint(0, len(out)), 0)
    return bytes(out)


def _binary_junk(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    return rng.randbytes(rng.randint(0, 4096))


def _empty(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    return rng.choice((b"", b"", b"", b" ", b"\r\n", b"\n\n\n", b"\t"))


def _line_endings(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    lf = body.replace(b"\r\n", b"\n")
    kind = rng.randrange(6)
    if kind == 0:  # LF only: what a hand-written or curl'd offer usually has
        return lf
    if kind == 1:  # mixed
        return b"".join(
            line[:-1] + rng.choice((b"\n", b"\r\n")) if line.endswith(b"\n") else line for line in _lines(lf)
        )
    if kind == 2:  # CR only
        return lf.replace(b"\n", b"\r")
    if kind == 3:  # no final line ending
        return body.rstrip(b"\r\n")
    if kind == 4:
        return lf.replace(b"\n", b"\r\r\n")
    eol = _eol(body)
    return body.replace(eol, eol + eol)  # blank lines between all of them


def _many_m_sections(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    bundle = rng.random() < 0.5
    budget = max_bytes - len(body)  # stay under max_bytes: past it, the size limit would refuse it first
    sections: list[bytes] = []
    mids: list[bytes] = []
    for k in range(rng.randint(50, 300)):
        mid = b"0" if rng.random() < 0.02 else b"x%d" % k  # now and then a mid that is already taken
        section = eol.join(
            (
                b"m=video 9 UDP/TLS/RTP/SAVPF 96",
                b"c=IN IP4 0.0.0.0",
                b"a=mid:" + mid,
                b"a=recvonly",
                b"a=rtpmap:96 VP8/90000",
            )
        )
        section += eol
        cost = len(section) + (len(mid) + 1 if bundle else 0)
        if cost > budget:
            break
        budget -= cost
        sections.append(section)
        mids.append(mid)
    lines = _lines(body)
    if bundle:
        for i, line in enumerate(lines):
            if line.startswith(b"a=group:BUNDLE"):
                content, line_eol = _split_eol(line)
                lines[i] = b" ".join([content, *mids]) + line_eol
                break
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += eol
    return b"".join(lines) + b"".join(sections)


_BAD_ADDRESSES = (
    b"999.1.1.1",
    b"256.256.256.256",
    b"1.2.3",
    b"0.0.0.0",
    b"255.255.255.255",
    b"::::1",
    b"fe80::zz",
    b"[::1]",
    b"2001:db8::g",
    b"-",
    b"abc.local",
    b"0f3c4e2a-1234-5678-9abc-def012345678.local",
    b".local",
    b"x" * 300 + b".local",
)
_BAD_PORTS = (b"0", b"70000", b"-1", b"65536", b"99999999999", b"port")
_TRANSPORTS = (b"udp", b"tcp", b"UDP", b"sctp", b"quic", b"xyz")
_PRIORITIES = (b"2130706431", b"0", b"-1", b"99999999999999999999", b"high")
_TYPES = (b"host", b"srflx", b"relay", b"prflx", b"magic")


def _bogus_candidate(rng: random.Random) -> bytes:
    fields = [
        b"%d" % rng.randrange(2**32),
        rng.choice((b"1", b"2", b"0", b"256")),  # component
        rng.choice(_TRANSPORTS),
        rng.choice(_PRIORITIES),
        rng.choice(_BAD_ADDRESSES),
        rng.choice(_BAD_PORTS),
        b"typ",
        rng.choice(_TYPES),
    ]
    kind = rng.randrange(4)
    if kind == 1:  # missing fields
        fields = fields[: rng.randint(0, len(fields) - 1)]
    elif kind == 2:  # a reflexive candidate whose related address is missing or broken
        fields[7] = b"srflx"
        fields += rng.choice(([], [b"raddr"], [b"raddr", rng.choice(_BAD_ADDRESSES), b"rport"]))
    elif kind == 3:  # tcp without a tcptype, or with a wrong one
        fields[2] = b"tcp"
        fields += rng.choice(([], [b"tcptype"], [b"tcptype", b"sideways"]))
    return b"a=candidate:" + b" ".join(fields)


def _bogus_candidates(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    lines = _lines(body)
    if rng.random() < 0.5:  # only bogus candidates left: nothing real for ICE to fall back on
        lines = _drop_prefixed(lines, (b"a=candidate:",))
    _insert_in_section(rng, lines, [_bogus_candidate(rng) + eol for _ in range(rng.randint(1, 6))])
    return b"".join(lines)


def _bad_sctp(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    lines = _lines(body)
    span = _section(lines, b"application")
    if span is None:  # an earlier mutation took it (or never there): add one to break
        if lines and not lines[-1].endswith(b"\n"):
            lines[-1] += eol
        lines += [b"m=application 9 UDP/DTLS/SCTP webrtc-datachannel" + eol, b"a=mid:9" + eol]
        span = (len(lines) - 2, len(lines))
    first, end = span
    section = lines[first:end]
    kind = rng.randrange(6)
    if kind == 0:
        section = _drop_prefixed(section, (b"a=sctp-port:",))
    elif kind in (1, 2, 3):
        attr = b"a=sctp-port:" if kind in (1, 2) else b"a=max-message-size:"
        value = {
            1: (b"0",),
            2: (b"70000", b"-1", b"abc", b""),
            3: (b"18446744073709551616", b"99999999999999999999999", b"0", b"-1", b"abc"),
        }[kind]
        section = _drop_prefixed(section, (attr,))
        section.insert(1, attr + rng.choice(value) + eol)
    elif kind == 4:
        section = _drop_prefixed(section, (b"a=max-message-size:",))
    else:  # the legacy (pre-RFC 8841) form, with a format that is or is not a port number
        section[0] = (
            rng.choice(
                (
                    b"m=application 9 DTLS/SCTP 5000",
                    b"m=application 9 DTLS/SCTP webrtc-datachannel",
                    b"m=application 9 UDP/DTLS/SCTP",
                )
            )
            + eol
        )
    lines[first:end] = section
    return b"".join(lines)


def _codec_soup(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    lines = _lines(body)
    span = _section(lines, b"video") or _section(lines, b"audio")
    if span is None:
        return body + b"a=rtpmap:300 VP8/90000" + eol
    first, end = span
    section = lines[first:end]
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0:  # payload types outside 0-127
            pt = rng.choice((b"300", b"-1", b"128", b"abc"))
            section.append(b"a=rtpmap:" + pt + b" VP8/90000" + eol)
            content, m_eol = _split_eol(section[0])
            section[0] = content + b" " + pt + m_eol
        elif kind == 1:  # clock rates that are not
            section.append(b"a=rtpmap:96 VP8/" + rng.choice((b"0", b"-1", b"abc", b"", b"99999999999999")) + eol)
        elif kind == 2:  # codecs nobody has
            name = rng.choice((b"FOO", b"VP8X", b"", b"H265", b"\xc3\xa9", _random_ascii(rng, 8).encode()))
            section.append(b"a=rtpmap:%d " % rng.randint(96, 127) + name + b"/90000" + eol)
        elif kind == 3:  # fmtp and rtx that point at nothing
            section.append(
                rng.choice((b"a=fmtp:%d apt=999", b"a=fmtp:%d profile-level-id=zzzzzz", b"a=fmtp:%d ;;;="))
                % rng.randint(96, 127)
                + eol
            )
        elif kind == 4:  # the m-line's format list
            content, m_eol = _split_eol(section[0])
            head = b" ".join(content.split(b" ")[:3])
            section[0] = head + rng.choice((b"", b" 300 abc -1", b" 96 96 96", b" " + b" ".join([b"96"] * 500))) + m_eol
        else:  # no rtpmap at all: dynamic payload types with no codec
            section = _drop_prefixed(section, (b"a=rtpmap:",))
    lines[first:end] = section
    return b"".join(lines)


def _as_audio(section: list[bytes], eol: bytes) -> list[bytes]:
    kept = _drop_prefixed(section[1:], (b"a=rtpmap:", b"a=rtcp-fb:", b"a=fmtp:", b"a=ssrc", b"a=extmap:"))
    return [b"m=audio 9 UDP/TLS/RTP/SAVPF 111" + eol, *kept, b"a=rtpmap:111 opus/48000/2" + eol]


_DIRECTIONS = (b"a=sendrecv", b"a=sendonly", b"a=recvonly", b"a=inactive")


def _direction(rng: random.Random, body: bytes, max_bytes: int) -> bytes:
    eol = _eol(body)
    lines = _lines(body)
    span = _section(lines, b"video")
    if span is None:
        return body
    first, end = span
    section = lines[first:end]
    kind = rng.randrange(6)
    if kind in (0, 1):  # the server only sends: a viewer that only sends, or neither
        section = [
            (b"a=sendonly" if kind == 0 else b"a=inactive") + eol if s.rstrip() in _DIRECTIONS else s for s in section
        ]
    elif kind == 2:  # two directions that disagree
        section.insert(1, b"a=sendonly" + eol)
    elif kind == 3:  # no video m-line at all
        section = []
    elif kind == 4:  # audio instead of video, with or without the data channel
        section = _as_audio(section, eol)
        if rng.random() < 0.5:
            lines[first:end] = section
            app = _section(lines, b"application")
            if app is not None:
                del lines[app[0] : app[1]]
            return b"".join(lines)
    else:  # port 0: a rejected m-section
        section[0] = re.sub(rb"^m=video \d+", b"m=video 0", section[0])
    lines[first:end] = section
    return b"".join(lines)


_MUTATIONS: dict[str, Mutation] = {
    "drop_line": _drop_line,
    "duplicate_line": _duplicate_line,
    "swap_lines": _swap_lines,
    "truncate": _truncate,
    "replace_token": _replace_token,
    "no_fingerprint": _no_fingerprint,
    "no_ice_credentials": _no_ice_credentials,
    "bad_fingerprint": _bad_fingerprint,
    "oversize": _oversize,
    "non_utf8": _non_utf8,
    "nul_bytes": _nul_bytes,
    "binary_junk": _binary_junk,
    "empty": _empty,
    "line_endings": _line_endings,
    "many_m_sections": _many_m_sections,
    "bogus_candidates": _bogus_candidates,
    "bad_sctp": _bad_sctp,
    "codec_soup": _codec_soup,
    "direction": _direction,
}
OFFER_MUTATIONS: tuple[str, ...] = tuple(_MUTATIONS)
# These replace the whole body, so stacking others on them would only blur what was sent.
_ALONE = frozenset({"binary_junk", "empty"})


def sdp_offer(seed: int, index: int, max_bytes: int = 32 * 1024) -> FuzzOffer:
    """The `index`-th offer of `sdp_offers(seed, ...)`, built on its own."""
    rng = random.Random(f"sdp:{seed}:{index}")
    _, text = rng.choice(_seed_items())
    # Mostly one mutation, so a failure points at its cause; stacks find the interactions.
    names = rng.sample(OFFER_MUTATIONS, rng.choice((1, 1, 2, 3)))
    alone = [name for name in names if name in _ALONE]
    if alone:
        names = alone[:1]
    names.sort(key=lambda name: name == "oversize")  # last, so nothing after it can bring it back under
    body = text.encode()
    for name in names:
        body = _MUTATIONS[name](rng, body, max_bytes)
    try:
        body.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    return FuzzOffer(mutation="+".join(names), body=body, utf8=utf8)


def sdp_offers(seed: int, n: int, max_bytes: int = 32 * 1024) -> Iterator[FuzzOffer]:
    """n mutated offers; `oversize` ones are longer than max_bytes, `many_m_sections` ones are not."""
    for index in range(n):
        yield sdp_offer(seed, index, max_bytes)


# ---- control messages ----

_KEYS = ("w", "a", "s", "d", "j", "l", "i", "k", "KeyW", "ArrowUp", "W", "Space")
_PROMPTS = ("a quiet forest at dawn", "a city street in the rain", "")
_RAW = "@@raw@@"  # stands for a JSON token json.dumps cannot write (NaN as a bare word, 10**400, nesting)


def _valid(rng: random.Random, kind: str | None = None) -> dict[str, Any]:
    """A message the parser accepts: the starting point each category breaks in one place."""
    kind = kind or rng.choice(KNOWN_TYPES)
    msg: dict[str, Any] = {"type": kind}
    if kind == "control":
        msg["key"] = rng.choice(_KEYS)
        msg["action"] = rng.choice(("press", "release"))
    elif kind == "control_state":
        msg["controls"] = rng.sample(_KEYS, rng.randint(0, 3))
    elif kind == "look":
        msg["dx"] = round(rng.uniform(-50, 50), 2)
        msg["dy"] = round(rng.uniform(-50, 50), 2)
    elif kind == "prompt":
        msg["text"] = rng.choice(_PROMPTS)
    if rng.random() < 0.7:
        msg["seq"] = rng.randint(0, 10**6)
    if rng.random() < 0.5:
        msg["t"] = round(rng.uniform(0, 2e12), 3)
    return msg


def _dumps(rng: random.Random, obj: Any) -> str:
    return json.dumps(obj, separators=rng.choice(((",", ":"), (", ", ": "))), ensure_ascii=rng.random() < 0.5)


def _with_raw(rng: random.Random, msg: dict[str, Any], field: str, raw: str) -> str:
    """msg as JSON with `field` set to the raw JSON text `raw`."""
    return _dumps(rng, {**msg, field: _RAW}).replace(json.dumps(_RAW), raw, 1)


# Fields each type validates (seq and t: every type), and values of the wrong type for each. None only
# where the field is required: seq and t are optional, so null is valid there.
_FIELDS: dict[str, tuple[str, ...]] = {
    "control": ("key", "action"),
    "control_state": ("controls",),
    "look": ("dx", "dy"),
    "prompt": ("text",),
}
_WRONG: dict[str, tuple[Any, ...]] = {
    "seq": ("1", [1], {"n": 1}, True, False, 1.5, 2.0, ""),  # strict: 2.0 is not a seq
    "t": ("1700000000000", True, False, [], {}, "now"),
    "key": (1, None, [], ["w"], {"key": "w"}, True, 1.5),
    "action": ("hold", "PRESS", "down", "", "keydown", 1, None, True, ["press"]),
    "controls": ("w", "w,a", {"w": True}, 1, None, True, [1], ["w", None], [["w"]], [True]),
    "dx": ("1", [1], True, None, {}, "NaN", "left"),
    "dy": ("1", [1], True, None, {}, "NaN", "left"),
    "text": (1, None, [], ["a"], {"text": "a"}, True),
}


def _fields(kind: str) -> tuple[str, ...]:
    return (*_FIELDS.get(kind, ()), "seq", "t")


def _msg_bad_json(rng: random.Random, oversize_bytes: int) -> str:
    msg = _valid(rng)
    text = _dumps(rng, msg)
    kind = rng.randrange(9)
    if kind == 0:  # cut short: no strict prefix of an object's text is JSON
        return text[: rng.randrange(len(text))]
    if kind == 1:  # trailing garbage (trailing whitespace would be valid)
        return text + rng.choice(("x", "}", ",", "{}", "]", "\x00", "//", "garbage", '{"type":"ping"}'))
    if kind == 2:
        return text.replace('"', "'")
    if kind == 3:  # random text; "@" starts no JSON value, so no luck can make it one
        return "@" + "".join(rng.choices(string.printable, k=rng.randint(0, 200)))
    if kind == 4:  # JavaScript and Python habits
        return rng.choice((text.replace('"type"', "type", 1), text[:-1] + ",}", text[:-1] + "/* c */}", repr(msg)))
    if kind == 5:
        return rng.choice(("", " ", "\n", "\t\r\n"))
    if kind == 6:  # a raw control character inside a string
        return text.replace('"type"', '"ty' + chr(rng.randrange(0x20)) + 'pe"', 1)
    if kind == 7:  # a byte-order mark in a text message
        return "\ufeff" + text
    return text.replace('"type"', rng.choice(('"\\xtype"', '"\\qtype"', '"type\\"')), 1)  # bad escapes


def _msg_wrong_type(rng: random.Random, oversize_bytes: int) -> str:
    kind = rng.choice(KNOWN_TYPES)
    msg = _valid(rng, kind)
    field = rng.choice(_fields(kind))
    value = rng.choice(_WRONG[field])
    if kind == "control" and field in ("key", "action") and rng.random() < 0.3:
        # The TeleFuser names (control/event), which the parser maps onto key/action.
        alias = {"key": "control", "action": "event"}
        msg = {k: v for k, v in msg.items() if k not in ("key", "action")}
        msg[alias[field]] = value
        other = "action" if field == "key" else "key"
        msg[alias[other]] = "press" if other == "action" else "w"
        return _dumps(rng, msg)
    if rng.random() < 0.2:  # a duplicate key: the last one wins, and it is the wrong one
        return _dumps(rng, msg)[:-1] + f',"{field}":{json.dumps(value)}}}'
    return _dumps(rng, {**msg, field: value})


_NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999", "-1e999")


def _msg_non_finite(rng: random.Random, oversize_bytes: int) -> str:
    token = rng.choice(_NON_FINITE)
    if rng.random() < 0.5:
        return _with_raw(rng, _valid(rng, "look"), rng.choice(("dx", "dy")), token)
    kind = rng.choice(KNOWN_TYPES)
    msg = _valid(rng, kind)
    field = rng.choice((*_FIELDS.get(kind, ()), "seq"))  # not t: see parser_gaps
    return _with_raw(rng, msg, field, f"[{token}]" if field == "controls" else token)


_UNKNOWN_TYPES: tuple[Any, ...] = (
    "Ping",
    "PING",
    " ping",
    "ping ",
    "pong",
    "ready",
    "chunk",
    "stats",
    "error",
    "done",
    "keydown",
    "mouse",
    "controls",
    "reset",
    "",
    "look\u0000",
    "l\u043eok",  # a Cyrillic o
    0,
    1,
    -1,
    1.5,
    None,
    True,
    False,
    [],
    ["ping"],
    {},
    {"type": "ping"},
)


def _msg_unknown_type(rng: random.Random, oversize_bytes: int) -> str:
    msg = _valid(rng)
    if rng.random() < 0.2:
        msg["type"] = "x" + "".join(rng.choices(string.ascii_lowercase + "_", k=rng.randint(0, 20)))
    else:
        msg["type"] = rng.choice(_UNKNOWN_TYPES)
    return _dumps(rng, msg)


def _msg_missing_field(rng: random.Random, oversize_bytes: int) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        msg = _valid(rng)
        del msg["type"]
        return _dumps(rng, msg)
    if kind == 1:
        msg = _valid(rng, "control")
        for field in rng.choice((("key",), ("action",), ("key", "action"))):
            del msg[field]
        return _dumps(rng, msg)
    if kind == 2:  # half of the TeleFuser form
        msg = {k: v for k, v in _valid(rng, "control").items() if k not in ("key", "action")}
        msg.update(rng.choice(({"control": "w"}, {"event": "press"})))
        return _dumps(rng, msg)
    msg = _valid(rng, rng.choice(("control_state", "prompt")))
    msg.pop("controls", None)
    msg.pop("text", None)
    return _dumps(rng, msg)


def _msg_out_of_range(rng: random.Random, oversize_bytes: int) -> str:
    if rng.random() < 0.6:
        msg = _valid(rng, "look")
        beyond = rng.choice((MAX_LOOK_PX + 0.5, MAX_LOOK_PX * 10, 1e300, int(MAX_LOOK_PX) + 1))
        msg[rng.choice(("dx", "dy"))] = beyond if rng.random() < 0.5 else -beyond
        return _dumps(rng, msg)
    msg = _valid(rng, "control_state")
    msg["controls"] = rng.choices(_KEYS, k=rng.randint(MAX_KEYS + 1, MAX_KEYS + 20))
    return _dumps(rng, msg)


def _pad_to(prefix: str, suffix: str, size: int, multibyte: bool) -> str:
    """prefix + padding + suffix, at least `size` UTF-8 bytes."""
    room = max(0, size - len(prefix.encode()) - len(suffix.encode()))
    # "é" is 2 bytes: the message is over the byte limit with fewer characters than the limit, which
    # catches a size check that counts characters.
    pad = "é" * (room // 2) + "x" * (room % 2) if multibyte else "x" * room
    return prefix + pad + suffix


def _msg_oversize(rng: random.Random, oversize_bytes: int) -> str | bytes:
    size = oversize_bytes if rng.random() < 0.5 else MAX_CONTROL_MESSAGE_BYTES + rng.randint(1, 64)
    size = max(size, MAX_CONTROL_MESSAGE_BYTES + 1)
    msg = _valid(rng)
    text = json.dumps(msg, ensure_ascii=False)
    kind = rng.randrange(4)
    if kind == 0:  # an extra field: extra fields are ignored, so only the size is wrong
        out = _pad_to(text[:-1] + ',"pad":"', '"}', size, multibyte=False)
    elif kind == 1:  # whitespace, which JSON allows after the value
        out = text + " " * max(0, size - len(text.encode()))
    elif kind == 2:
        out = _pad_to('{"type":"prompt","text":"', '"}', size, multibyte=rng.random() < 0.5)
    else:
        out = _pad_to(text[:-1] + ',"pad":"', '"}', size, multibyte=True)
    return out.encode() if rng.random() < 0.25 else out


def _msg_binary(rng: random.Random, oversize_bytes: int) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        # Not UTF-8, and no BOM or NUL pattern that would make json.loads guess UTF-16/32.
        return b"\x80\x81" + rng.randbytes(rng.randint(0, 2048))
    if kind == 1:
        return b""
    if kind == 2:  # what a msgpack or CBOR client would send
        return rng.choice((b"\x82\xa4type\xa4ping\xa3seq\x01", b"\xa1dtypedping"))
    if kind == 3:  # a message cut short
        text = json.dumps(_valid(rng)).encode()
        return text[: rng.randrange(len(text))]
    if kind == 4:  # a message with one invalid UTF-8 byte in a string
        return b'{"type":"ping","note":"\xff"}'
    # An invalid message in one of the encodings json.loads detects for bytes.
    make = rng.choice((_msg_wrong_type, _msg_unknown_type, _msg_missing_field, _msg_non_finite, _msg_out_of_range))
    return make(rng, oversize_bytes).encode(rng.choice(("utf-8", "utf-16", "utf-32", "utf-16-le")))


# Python's C JSON decoder recurses once per level and, near sys.getrecursionlimit(), raises
# RecursionError; 2,000 levels fit in the 4 KiB limit and reach it.
_SAFE_DEPTH = 300


def _msg_deep_nesting(rng: random.Random, oversize_bytes: int) -> str:
    if rng.random() < 0.2:  # past the recursion limit, within the size limit
        depth = rng.randint(1_200, MAX_CONTROL_MESSAGE_BYTES // 2)
        return "[" * depth + "]" * depth
    if rng.random() < 0.3:  # deep, and over the size limit (at most `oversize_bytes`: 6 bytes a level)
        depth = rng.randint(5_000, max(5_001, oversize_bytes // 6))
        kind = rng.randrange(3)
        if kind == 0:
            return "[" * depth + "]" * depth
        if kind == 1:
            return '{"a":' * depth + "1" + "}" * depth
        return '{"type":"ping","x":' + "[" * depth
    depth = rng.randint(2, _SAFE_DEPTH)
    nested = "[" * depth + "]" * depth
    kind = rng.randrange(4)
    if kind == 0:
        return nested
    if kind == 1:
        return _with_raw(rng, _valid(rng, "look"), rng.choice(("dx", "dy")), nested)
    if kind == 2:  # depth >= 2: controls [[]] has a non-string item ([] alone would be valid)
        return _with_raw(rng, _valid(rng, "control_state"), "controls", nested)
    return _with_raw(rng, _valid(rng, "control"), "key", '{"a":' * depth + "1" + "}" * depth)


def _msg_huge_number(rng: random.Random, oversize_bytes: int) -> str:
    number = str(10 ** rng.randint(309, 1000) + rng.randrange(10**6))  # past float range, so no field takes it
    if rng.random() < 0.5:
        number = "-" + number
    kind = rng.choice(KNOWN_TYPES)
    field = rng.choice((*_FIELDS.get(kind, ()), "t", "type"))  # not seq: see parser_gaps
    raw = f"[{number}]" if field == "controls" else number
    return _with_raw(rng, _valid(rng, kind), field, raw)


def _msg_long_string(rng: random.Random, oversize_bytes: int) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        msg = _valid(rng, "control")
        msg["key"] = _long_word(rng, rng.randint(MAX_KEY_NAME + 1, 3000))
    elif kind == 1:
        msg = _valid(rng, "control")
        msg["action"] = "press" + _long_word(rng, rng.randint(1, 3000))
    elif kind == 2:
        msg = _valid(rng, "control_state")
        msg["controls"] = ["w", _long_word(rng, rng.randint(MAX_KEY_NAME + 1, 3000))]
    elif kind == 3:
        msg = _valid(rng, "prompt")
        msg["text"] = _long_word(rng, rng.randint(MAX_PROMPT_CHARS + 1, MAX_PROMPT_CHARS + 1500))
    else:
        msg = _valid(rng)
        msg["type"] = _long_word(rng, rng.randint(100, 10_000))
    return _dumps(rng, msg)


def _msg_not_object(rng: random.Random, oversize_bytes: int) -> str:
    text = _dumps(rng, _valid(rng))
    return rng.choice(
        (
            "[]",
            f"[{text}]",  # a batch
            json.dumps(text),  # encoded twice
            "1",
            "-0",
            "3.14",
            "1e5",
            '"ping"',
            "null",
            "true",
            "false",
            " [ ] ",
            "NaN",
            "Infinity",
            json.dumps("x" * rng.randint(0, 1000)),
        )
    )


_CATEGORIES: dict[str, Callable[[random.Random, int], str | bytes]] = {
    "bad_json": _msg_bad_json,
    "wrong_type": _msg_wrong_type,
    "non_finite": _msg_non_finite,
    "unknown_type": _msg_unknown_type,
    "missing_field": _msg_missing_field,
    "out_of_range": _msg_out_of_range,
    "oversize": _msg_oversize,
    "binary": _msg_binary,
    "deep_nesting": _msg_deep_nesting,
    "huge_number": _msg_huge_number,
    "long_string": _msg_long_string,
    "not_object": _msg_not_object,
}
# No "extra_field": the protocol ignores unknown fields (a newer client can talk to an older server),
# so a message with extras is valid.
CONTROL_CATEGORIES: tuple[str, ...] = tuple(_CATEGORIES)


def control_message(seed: int, index: int, oversize_bytes: int = 1024 * 1024) -> FuzzMessage:
    """The `index`-th message of `control_messages(seed, ...)`, built on its own."""
    rng = random.Random(f"control:{seed}:{index}")
    category = rng.choice(CONTROL_CATEGORIES)
    return FuzzMessage(category=category, payload=_CATEGORIES[category](rng, oversize_bytes))


def control_messages(seed: int, n: int, oversize_bytes: int = 1024 * 1024) -> Iterator[FuzzMessage]:
    """n data-channel payloads, each one parse_client_message refuses with a ProtocolError."""
    for index in range(n):
        yield control_message(seed, index, oversize_bytes)


def regressions() -> tuple[FuzzMessage, ...]:
    """Payloads parse_client_message once accepted or crashed on, each now refused.

    Accepted: non-finite `t` (every type; a pong echoed it back as null), integers of any size in
    `seq`, and valid messages sent as binary (bytes in any encoding json.loads detects, where the
    protocol is JSON text). Crashed on: list nesting past the recursion limit (about 990 levels when
    called from a shallow stack, fewer from deep in an event loop) fits in the 4 KiB limit and made
    json.loads raise RecursionError, which is not a ProtocolError.
    """
    big = str(10**400)
    ping = '{"type":"ping","seq":1,"t":%s}'
    return (
        *(FuzzMessage("non_finite_t", ping % token) for token in ("NaN", "Infinity", "-Infinity", "1e400")),
        FuzzMessage("non_finite_t", '{"type":"control","key":"w","action":"press","t":NaN}'),
        FuzzMessage("non_finite_t", '{"type":"look","dx":1,"dy":1,"t":-Infinity}'),
        FuzzMessage("huge_seq", '{"type":"ping","seq":' + big + "}"),
        FuzzMessage("huge_seq", '{"type":"control","key":"w","action":"press","seq":-' + big + "}"),
        FuzzMessage("huge_seq", '{"type":"look","dx":1,"dy":1,"seq":' + "9" * 4000 + "}"),
        FuzzMessage("binary_valid", b'{"type":"ping","seq":1}'),
        FuzzMessage("binary_valid", '{"type":"control","key":"w","action":"press"}'.encode("utf-16")),
        FuzzMessage("binary_valid", '{"type":"stop"}'.encode("utf-32")),
        FuzzMessage("binary_valid", '{"type":"look","dx":5,"dy":0}'.encode("utf-8-sig")),
        FuzzMessage("deep_nesting_in_limit", "[" * 2048 + "]" * 2048),  # 4096 bytes: exactly at the limit
        FuzzMessage("deep_nesting_in_limit", "[" * 4096),
        FuzzMessage("deep_nesting_in_limit", '{"type":"ping","x":' + "[" * 1200 + "]" * 1200 + "}"),
        FuzzMessage("deep_nesting_in_limit", '{"type":"control_state","controls":' + "[" * 1500 + "]" * 1500 + "}"),
    )
