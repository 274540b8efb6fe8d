"""The SSRF guard against hostile webhook URLs, and signatures checked with the
Standard Webhooks reference library."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from app.db.models.tenants import new_webhook_secret
from app.webhooks import signing
from app.webhooks.delivery import DeliveryConfig, next_delay, parse_retry_after
from app.webhooks.guard import (
    UnsafeUrl,
    check_url,
    check_url_at_submit,
    parse_allow_list,
    resolve_target,
    system_resolver,
)

# Refused by their form alone (what POST /v1/jobs checks, answering 422).
REFUSED_AT_SUBMIT = [
    "http://127.0.0.1/hook",
    "http://127.0.0.1:8080/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:7f00:1]/hook",
    "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",  # Teredo
    "http://[::]/hook",
    "http://0.0.0.0/hook",
    "http://10.0.0.1/hook",
    "http://172.16.5.4/hook",
    "http://192.168.1.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http://100.64.0.1/hook",
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "gopher://example.com/",
    "http://user:pass@example.com/hook",
    "http://example.com@127.0.0.1/hook",
    "http://127.0.0.1#@example.com/hook",
    "http:///hook",
    # Every form the resolver reads as an address is refused at submit too.
    "http://localhost/hook",
    "http://LocalHost:8000/hook",
    "http://localhost./hook",
    "http://api.localhost/hook",
    "http://127.1/hook",
    "http://127.0.1/hook",
    "http://2130706433/hook",  # decimal
    "http://017700000001/hook",  # octal, one part
    "http://0177.0.0.1/hook",  # octal
    "http://0x7f.0.0.1/hook",  # hex
    "http://0x7f.1/hook",
    "http://0x7f000001/hook",
    "http://0/hook",
    "http://127.0.0.1./hook",  # trailing dot
    "http://10.1/hook",
    "http://0xa9.0xfe.0xa9.0xfe/latest/meta-data/",  # 169.254.169.254
    "http://3232235777/hook",  # 192.168.1.1
    "http://999.1/hook",  # numeric but no address: no name either
    "http://[fe80::1%25eth0]/hook",  # link-local with a zone
    "http://[::ffff:a9fe:a9fe]/hook",
    "http://[0:0:0:0:0:ffff:127.0.0.1]/hook",
    "http://[::127.0.0.1]/hook",  # IPv4-compatible
]
# Names the system resolver (libc, no network) turns into loopback or "this host".
REFUSED_AFTER_RESOLVING = [
    "http://localhost/hook",
    "http://127.1/hook",
    "http://0x7f000001/hook",
]
# Names a (fake) DNS server resolves to forbidden addresses.
RESOLVING_TO_FORBIDDEN = [
    ("https://hooks.internal.example/x", {"hooks.internal.example": ["10.1.2.3"]}),
    ("https://127.0.0.1.nip.io/x", {"127.0.0.1.nip.io": ["127.0.0.1"]}),
    ("https://metadata.example/x", {"metadata.example": ["169.254.169.254"]}),
    ("https://v6.example/x", {"v6.example": ["::ffff:10.0.0.1"]}),
    # One public and one private record: a rebinding name may alternate.
    ("https://rebind.example/x", {"rebind.example": ["93.184.215.14", "127.0.0.1"]}),
]


def fake_dns(records: dict[str, list[str]]):
    """DNS for names that would need a real resolver (none is reachable here)."""

    def resolve(host: str, _port: int) -> list[str]:
        if host not in records:
            raise OSError(f"no such host {host}")
        return records[host]

    return resolve


@pytest.mark.parametrize("url", REFUSED_AT_SUBMIT)
def test_refused_by_form_and_literal_address(url):
    with pytest.raises(UnsafeUrl):
        check_url(url)
    with pytest.raises(UnsafeUrl):
        resolve_target(url, resolve=fake_dns({"example.com": ["93.184.215.14"]}))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::1]/hook", "::1 is not a public address (loopback)"),
        ("http://[::]/hook", ":: is not a public address (unspecified)"),
        ("http://127.0.0.1/hook", "127.0.0.1 is not a public address (loopback)"),
        ("http://10.1.2.3/hook", "10.1.2.3 is not a public address (private)"),
        ("http://[fe80::1]/hook", "fe80::1 is not a public address (link-local)"),
        ("http://[::127.0.0.1]/hook", "embeds an IPv4 address"),
        ("http://[::ffff:10.0.0.1]/hook", "IPv4-mapped"),
        ("http://[64:ff9b::a00:1]/hook", "embeds an IPv4 address"),
    ],
)
def test_each_refusal_gives_the_right_reason(url, reason):
    with pytest.raises(UnsafeUrl) as refused:
        check_url(url)
    assert reason in str(refused.value)
    if "loopback" in reason or "unspecified" in reason:
        assert "IPv4" not in str(refused.value)


@pytest.mark.parametrize("url", REFUSED_AFTER_RESOLVING)
def test_refused_once_resolved(url):
    with pytest.raises(UnsafeUrl, match="not a public address"):
        resolve_target(url)


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.1:9000/h", "127.0.0.1"),
        ("http://2130706433:9000/h", "127.0.0.1"),
        ("http://0x7f.1:9000/h", "127.0.0.1"),
        ("http://localhost:9000/h", "127.0.0.1"),
    ],
)
def test_an_allowed_address_in_shorthand_connects_to_that_address(url, address):
    """Submit and delivery read a form the same way: allowed, it goes to that address."""
    allow = parse_allow_list("127.0.0.1/32")
    check_url(url, allow)
    assert resolve_target(url, allow).address == address


@pytest.mark.parametrize(
    "url",
    [
        "https://1password.com/h",  # a name that starts with digits
        "https://123.example/h",
        "https://0x.example/h",
        "https://hooks.example.com/h",
        "https://[2606:4700::1111]/h",
        "https://93.184.215.14/h",
    ],
)
def test_public_names_and_addresses_pass_the_form_check(url):
    check_url(url)


@pytest.mark.parametrize(("url", "records"), RESOLVING_TO_FORBIDDEN)
def test_names_resolving_to_forbidden_addresses_are_refused(url, records):
    with pytest.raises(UnsafeUrl):
        resolve_target(url, resolve=fake_dns(records))


def test_public_addresses_pass_and_the_connection_goes_to_the_checked_one():
    target = resolve_target(
        "https://hooks.example.com:8443/in?x=1",
        resolve=fake_dns({"hooks.example.com": ["93.184.215.14"]}),
    )
    assert (target.address, target.host, target.port) == (
        "93.184.215.14",
        "hooks.example.com",
        8443,
    )
    assert target.path == "/in?x=1"


def test_the_operator_allow_list_opens_only_its_ranges():
    allow = parse_allow_list("127.0.0.1/32, 10.20.0.0/16")
    assert resolve_target("http://127.0.0.1:9000/h", allow).address == "127.0.0.1"
    assert resolve_target("http://10.20.3.4/h", allow).address == "10.20.3.4"
    with pytest.raises(UnsafeUrl):
        resolve_target("http://10.21.0.1/h", allow)
    with pytest.raises(UnsafeUrl):  # an allowed range does not open mapped forms of it
        resolve_target("http://[::ffff:127.0.0.1]/h", allow)


def test_hostile_url_count():
    """Every hostile URL above is put to the guard once more and the refusals counted."""
    records = {name: addrs for _, named in RESOLVING_TO_FORBIDDEN for name, addrs in named.items()}

    def resolve(host: str, port: int) -> list[str]:  # the fake records, else libc
        return records[host] if host in records else system_resolver(host, port)

    hostile = REFUSED_AT_SUBMIT + REFUSED_AFTER_RESOLVING + [u for u, _ in RESOLVING_TO_FORBIDDEN]
    refused = 0
    for url in hostile:
        try:
            resolve_target(url, resolve=resolve)
        except UnsafeUrl:
            refused += 1
    print(f"\n{refused} of {len(hostile)} hostile webhook URLs refused by the guard")
    assert refused == len(hostile)


def test_signatures_verify_with_the_standard_webhooks_library():
    secret = new_webhook_secret()
    body = json.dumps({"type": "job.succeeded", "data": {"id": "x"}}).encode()
    headers = signing.headers([secret], "msg_1", int(time.time()), body)
    assert Webhook(secret).verify(body, headers) == {"type": "job.succeeded", "data": {"id": "x"}}
    with pytest.raises(Exception):  # noqa: B017 - the library's own error type
        Webhook(new_webhook_secret()).verify(body, headers)


def test_during_a_rotation_both_secrets_verify():
    old, new = new_webhook_secret(), new_webhook_secret()
    body = b'{"type":"job.failed"}'
    headers = signing.headers([new, old], "msg_2", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)


def test_retry_schedule_with_jitter_and_retry_after():
    config = DeliveryConfig(schedule=(5.0, 300.0, 1800.0), timeout=10)
    delays = [next_delay(config, n, None) for n in (1, 2, 3)]
    assert 2.5 <= delays[0] <= 5 and 150 <= delays[1] <= 300 and 900 <= delays[2] <= 1800
    assert next_delay(config, 4, None) is None  # schedule exhausted: failed
    assert next_delay(config, 1, 120.0) == 120.0  # Retry-After wins when later
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("soon") is None
    http_date = (datetime.now(UTC) + timedelta(seconds=60)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 50 <= parse_retry_after(http_date) <= 61


@pytest.mark.parametrize(
    "url",
    [
        "http://127\u30020\u30020\u30021/hook",  # ideographic full stops
        "http://127\uff0e0\uff0e0\uff0e1/hook",  # full-width full stops
        "http://\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3/hook",  # circled
        "http://\uff11\uff12\uff17.0.0.1/hook",  # full-width digits
    ],
)
def test_unicode_forms_of_loopback_are_refused_at_submit(url):
    with pytest.raises(UnsafeUrl):
        check_url(url)
    with pytest.raises(UnsafeUrl):
        check_url_at_submit(url, resolve=fake_dns({}))


def test_a_name_resolving_to_a_refused_address_is_refused_at_submit():
    records = {"sneaky.example": ["93.184.215.14", "127.0.0.1"], "fine.example": ["93.184.215.14"]}
    with pytest.raises(UnsafeUrl, match=r"127\.0\.0\.1|loopback"):
        check_url_at_submit("https://sneaky.example/h", resolve=fake_dns(records))
    check_url_at_submit("https://fine.example/h", resolve=fake_dns(records))
    # Not resolvable yet: accepted now, checked again at every delivery.
    check_url_at_submit("https://not-yet.example/h", resolve=fake_dns(records))
