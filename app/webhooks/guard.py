"""The SSRF guard: a webhook may only reach a public address (or one an operator allowed).

Checked twice: the URL's form at submit (scheme, credentials, a literal address), and the
resolved addresses at every delivery, after which the connection goes to the checked
address itself — no second lookup a rebinding DNS server could answer differently.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048
# IPv6 ranges that carry an IPv4 address: reaching one can reach that IPv4 host.
_EMBEDS_IPV4 = [
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64, well-known prefix
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64, local-use
    ipaddress.ip_network("2002::/16"),  # 6to4
    ipaddress.ip_network("2001::/32"),  # Teredo
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated)
]


class UnsafeUrl(ValueError):
    """The URL may not be called; the message says why (safe to show the tenant)."""


class Unresolvable(UnsafeUrl):
    """The host did not resolve: perhaps a passing DNS failure, so worth another try."""


# A host made only of numbers (decimal, 0-octal, 0x-hex) in one to four parts: the
# resolver reads it as an IPv4 address (127.1, 2130706433, 0177.0.0.1, 0x7f000001).
_NUMERIC_HOST = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}\.?", re.I)


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written: the Host header and the TLS server name
    port: int
    path: str  # path and query
    address: str  # the checked address the connection goes to


def parse_allow_list(raw: str | None) -> list[Network]:
    if not raw:
        return []
    try:
        return [
            ipaddress.ip_network(part.strip(), strict=False)
            for part in raw.split(",")
            if part.strip()
        ]
    except ValueError as exc:
        raise ValueError(f"DIFFQ_WEBHOOK_ALLOW_CIDRS: {exc}") from exc


def _kind(address: Address) -> str | None:
    """What makes an address not public, in words, or None when it is public."""
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "not globally routable"
    return None


def check_address(address: Address, allow: Sequence[Network] = ()) -> None:
    if any(address in net for net in allow if net.version == address.version):
        return
    if isinstance(address, ipaddress.IPv6Address):
        # `::1` and `::` lie in ::/96 (IPv4-compatible) but carry no IPv4 address: say
        # what they are.
        if address.is_loopback or address.is_unspecified:
            raise UnsafeUrl(f"{address} is not a public address ({_kind(address)})")
        if address.ipv4_mapped is not None:
            raise UnsafeUrl(f"{address} is an IPv4-mapped address")
        if any(address in net for net in _EMBEDS_IPV4):
            raise UnsafeUrl(f"{address} embeds an IPv4 address (NAT64, 6to4, Teredo)")
    kind = _kind(address)
    if kind is not None:
        raise UnsafeUrl(f"{address} is not a public address ({kind})")


def _literal(host: str) -> Address | None:
    """The address a host names without any lookup, in every form the resolver reads:
    IPv4 shorthand, octal and hex parts, IPv6 with a zone; `localhost` names too."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if "%" in host:  # an IPv6 zone (fe80::1%eth0): the address decides
        try:
            return ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            pass
    if _NUMERIC_HOST.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
        except OSError as exc:
            raise UnsafeUrl(f"{host} is not a valid address") from exc
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
        return ipaddress.IPv4Address("127.0.0.1")
    return None


def check_url(url: str, allow: Sequence[Network] = ()) -> tuple[str, str, int, str]:
    """The form checks made at submit: (scheme, host, port, path); raises UnsafeUrl."""
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeUrl(f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"not a valid URL ({exc})") from exc
    if parts.scheme not in ("https", "http"):
        raise UnsafeUrl("only https and http URLs are allowed")
    if port == 0 or (port is None and re.search(r":\d*$", parts.netloc.rpartition("@")[2])):
        # ":0" names no service, and an empty ":" no port: both refused, never defaulted.
        raise UnsafeUrl("the port must be between 1 and 65535")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UnsafeUrl("credentials in the URL are not allowed")
    host = parts.hostname
    if not host:
        raise UnsafeUrl("the URL has no host")
    if any(ch.isspace() for ch in url) or "\\" in parts.netloc:
        raise UnsafeUrl("the URL contains whitespace or backslashes")
    host = _ascii_host(host)
    literal = _literal(host)
    if literal is not None:
        check_address(literal, allow)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80), path


def _ascii_host(host: str) -> str:
    """The host as the resolver and the connection will see it: IDNA (nameprep maps
    full-width and ideographic dots to ".", circled letters to letters), so `127。0。0。1`
    and `ⓛⓞⓒⓐⓛⓗⓞⓢⓣ` are judged as the loopback addresses they are."""
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError as exc:
        raise UnsafeUrl(f"{host!r} is not a valid host name") from exc


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


def check_url_at_submit(
    url: str, allow: Sequence[Network] = (), resolve: Resolver | None = None
) -> None:
    """At submit: the form checks, and a name resolved as delivery will resolve it, so a
    host that resolves to a refused address is refused now rather than at each delivery.
    A name that does not resolve yet passes (the receiver may not be up); delivery checks
    every address again (a rebinding name may change)."""
    with contextlib.suppress(Unresolvable):
        resolve_target(url, allow, resolve or system_resolver)


def resolve_target(
    url: str, allow: Sequence[Network] = (), resolve: Resolver = system_resolver
) -> Target:
    """At delivery: every address the host resolves to must pass (one bad record is
    enough to refuse: a rebinding name may alternate)."""
    scheme, host, port, path = check_url(url, allow)
    literal = _literal(host)
    if literal is not None:  # connect to the address itself, never to the name's form
        return Target(scheme, host, port, path, str(literal))
    try:
        addresses = resolve(host, port)
    except OSError as exc:
        raise Unresolvable(f"{host} does not resolve ({exc.strerror or exc})") from exc
    if not addresses:
        raise Unresolvable(f"{host} does not resolve")
    checked = []
    for raw in addresses:
        address = ipaddress.ip_address(raw.split("%", 1)[0])
        check_address(address, allow)
        checked.append(address)
    return Target(scheme, host, port, path, str(checked[0]))
