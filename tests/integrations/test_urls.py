"""Outbound URL admission: every refused category, IPv6 and numeric spellings, loopback opt-in.

No test touches the network: hosts are IP literals, ``localhost`` (resolved from the hosts
file) or names answered by an injected resolver.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import pytest

from integrations.urls import (
    AdmittedUrl,
    RefusalCategory,
    UrlPolicy,
    UrlRefused,
    classify_address,
    normalize_url,
    same_origin_path,
)

C = RefusalCategory

REFUSED: list[tuple[str, RefusalCategory, str]] = [
    # private
    ("https://10.0.0.5/mcp", C.PRIVATE, "refusing https://10.0.0.5/mcp: 10.0.0.5 is a private address"),
    ("http://172.16.0.1/", C.PRIVATE, "172.16.0.1 is a private address"),
    ("http://172.31.255.255/", C.PRIVATE, "172.31.255.255 is a private address"),
    ("http://192.168.1.10:8080/x", C.PRIVATE, "192.168.1.10 is a private address"),
    ("http://[fd12:3456::1]/", C.PRIVATE, "fd12:3456::1 is a private address"),
    ("http://[fc00::1]/", C.PRIVATE, "fc00::1 is a private address"),
    ("http://[fec0::1]/", C.PRIVATE, "fec0::1"),
    # loopback
    ("http://127.0.0.1/", C.LOOPBACK, "127.0.0.1 is a loopback address"),
    ("http://127.1.2.3:9000/mcp", C.LOOPBACK, "127.1.2.3 is a loopback address"),
    ("http://[::1]/", C.LOOPBACK, "::1 is a loopback address"),
    ("http://[0:0:0:0:0:0:0:1]/", C.LOOPBACK, "::1 is a loopback address"),
    # link-local
    ("http://169.254.1.1/", C.LINK_LOCAL, "169.254.1.1 is a link-local address"),
    ("http://[fe80::1]/", C.LINK_LOCAL, "fe80::1 is a link-local address"),
    # cloud metadata
    ("http://169.254.169.254/latest/meta-data/", C.METADATA, "169.254.169.254 is a cloud metadata address"),
    ("http://[fd00:ec2::254]/", C.METADATA, "fd00:ec2::254 is a cloud metadata address"),
    ("http://100.100.100.200/", C.METADATA, "100.100.100.200 is a cloud metadata address"),
    ("http://169.254.170.2/v2/credentials", C.METADATA, "cloud metadata"),
    # CGNAT
    ("http://100.64.0.1/", C.CGNAT, "100.64.0.1 is a carrier-grade NAT"),
    ("http://100.127.255.254/", C.CGNAT, "carrier-grade NAT"),
    # multicast
    ("http://224.0.0.1/", C.MULTICAST, "224.0.0.1 is a multicast address"),
    ("http://[ff02::1]/", C.MULTICAST, "ff02::1 is a multicast address"),
    # unspecified / reserved
    ("http://0.0.0.0/", C.UNSPECIFIED, "0.0.0.0 is an unspecified address"),
    ("http://0.1.2.3/", C.UNSPECIFIED, "0.1.2.3 is an unspecified address"),
    ("http://[::]/", C.UNSPECIFIED, ":: is an unspecified address"),
    ("http://255.255.255.255/", C.RESERVED, "reserved"),
    ("http://240.0.0.1/", C.RESERVED, "reserved"),
    ("http://192.0.2.1/", C.RESERVED, "reserved"),
    ("http://198.18.0.1/", C.RESERVED, "reserved"),
    ("http://[2001:db8::1]/", C.RESERVED, "reserved"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", C.RESERVED, "reserved"),
    ("http://[::7f00:1]/", C.RESERVED, "reserved"),
    # IPv4 embedded in IPv6
    ("http://[::ffff:127.0.0.1]/", C.LOOPBACK, "is a loopback address (IPv4-mapped 127.0.0.1)"),
    ("http://[::ffff:7f00:1]/", C.LOOPBACK, "IPv4-mapped 127.0.0.1"),
    ("http://[::ffff:10.0.0.5]/", C.PRIVATE, "private address (IPv4-mapped 10.0.0.5)"),
    ("http://[::ffff:169.254.169.254]/", C.METADATA, "IPv4-mapped 169.254.169.254"),
    ("http://[::ffff:192.168.0.1]/", C.PRIVATE, "IPv4-mapped 192.168.0.1"),
    ("http://[::ffff:0.0.0.0]/", C.UNSPECIFIED, "IPv4-mapped 0.0.0.0"),
    ("http://[64:ff9b::a00:1]/", C.PRIVATE, "NAT64 of 10.0.0.1"),
    ("http://[64:ff9b::7f00:1]/", C.LOOPBACK, "NAT64 of 127.0.0.1"),
    ("http://[2002:a9fe:a9fe::]/", C.METADATA, "6to4 of 169.254.169.254"),
    # numeric IPv4 spellings that libc / browsers read as addresses
    (
        "http://2130706433/",
        C.HOST,
        "2130706433 is not a canonical dotted-quad IPv4 address (it would be read as 127.0.0.1)",
    ),
    ("http://0x7f.1/", C.HOST, "(it would be read as 127.0.0.1)"),
    ("http://0x7f000001/", C.HOST, "(it would be read as 127.0.0.1)"),
    ("http://017700000001/", C.HOST, "(it would be read as 127.0.0.1)"),
    ("http://0177.0.0.1/", C.HOST, "(it would be read as 127.0.0.1)"),
    ("http://127.1/", C.HOST, "(it would be read as 127.0.0.1)"),
    ("http://010.0.0.1/", C.HOST, "not a canonical dotted-quad"),
    ("http://3232235777/", C.HOST, "(it would be read as 192.168.1.1)"),
    ("http://127.0.0.1./", C.HOST, "not a canonical dotted-quad"),
    ("http://1.2.3.4.5/", C.HOST, "not a canonical dotted-quad"),
    # userinfo
    ("http://user:pw@93.184.216.34/", C.USERINFO, "refusing http://93.184.216.34/: credentials in the URL"),
    ("http://user@93.184.216.34/", C.USERINFO, "user:password@"),
    ("http://evil.example\\@127.0.0.1/", C.USERINFO, "credentials in the URL"),
    # scheme
    ("ftp://93.184.216.34/file", C.SCHEME, "scheme 'ftp' is not allowed"),
    ("file:///etc/passwd", C.SCHEME, "scheme 'file' is not allowed"),
    ("gopher://93.184.216.34/", C.SCHEME, "scheme 'gopher'"),
    ("javascript:alert(1)", C.SCHEME, "scheme 'javascript'"),
    ("93.184.216.34/mcp", C.SCHEME, "needs an http:// or https:// scheme"),
    # no host
    ("http:///mcp", C.MALFORMED, "has no host"),
    ("https://", C.MALFORMED, "has no host"),
    ("http:example.com", C.MALFORMED, "has no host"),
    ("http://:8080/", C.MALFORMED, "has no host"),
    ("", C.MALFORMED, "empty URL"),
    # bad port
    ("http://93.184.216.34:0/", C.PORT, "port 0 is outside 1..65535"),
    ("http://93.184.216.34:65536/", C.PORT, "port 65536 is outside 1..65535"),
    ("http://93.184.216.34:99999/", C.PORT, "outside 1..65535"),
    ("http://93.184.216.34:-1/", C.PORT, "is not a number"),
    ("http://93.184.216.34:http/", C.PORT, "is not a number"),
    ("http://93.184.216.34:+80/", C.PORT, "is not a number"),
    ("http://93.184.216.34:１２/", C.PORT, "is not a number"),
    # malformed hosts
    ("http://::1/", C.MALFORMED, "must be written in brackets"),
    ("http://[::1/", C.MALFORMED, "refusing"),
    ("http://[not-ipv6]/", C.MALFORMED, "refusing"),
    ("http://[fe80::1%25eth0]/", C.HOST, "zone identifiers"),
    ("http://exa mple.com/", C.MALFORMED, "whitespace"),
    ("http://example.com/\r\nHost: x", C.MALFORMED, "control characters"),
    ("http://ex%61mple.com/", C.HOST, "not a valid host name"),
    ("http://127.0.0.1\\.example.com/", C.HOST, "not a valid host name"),
    ("http://bücher.example/", C.HOST, "punycode"),
    ("http://a..b/", C.HOST, "not a valid host name"),
    ("http://" + "a" * 64 + ".example/", C.HOST, "not a valid host name"),
    ("http://example.com/" + "a" * 3000, C.MALFORMED, "longer than"),
]


@pytest.mark.parametrize(("url", "category", "fragment"), REFUSED, ids=[row[0][:60] or "empty" for row in REFUSED])
async def test_refused_urls_name_the_host_and_the_category(url: str, category: RefusalCategory, fragment: str) -> None:
    policy = UrlPolicy()
    with pytest.raises(UrlRefused) as info:
        await policy.admit(url)
    assert info.value.category is category
    assert fragment in str(info.value)
    assert str(info.value).startswith("refusing")
    assert info.value.reason == str(info.value)
    with pytest.raises(UrlRefused) as sync_info:
        policy.admit_sync(url)
    assert str(sync_info.value) == str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2@10.0.0.5/",
        "https://user:hunter2@93.184.216.34/",
        "https://10.0.0.5/mcp?token=hunter2",
        "ftp://user:hunter2@example.com/",
    ],
)
def test_refusals_never_echo_userinfo_or_query(url: str) -> None:
    with pytest.raises(UrlRefused) as info:
        UrlPolicy().admit_sync(url)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "normalized", "addresses"),
    [
        ("https://93.184.216.34/mcp", "https://93.184.216.34/mcp", ["93.184.216.34"]),
        ("HTTPS://93.184.216.34:443/mcp", "https://93.184.216.34/mcp", ["93.184.216.34"]),
        ("http://93.184.216.34:80", "http://93.184.216.34/", ["93.184.216.34"]),
        ("http://93.184.216.34:8080/a/b/?q=1#frag", "http://93.184.216.34:8080/a/b/?q=1", ["93.184.216.34"]),
        ("https://93.184.216.34:/mcp", "https://93.184.216.34/mcp", ["93.184.216.34"]),
        ("https://93.184.216.34:0443/mcp", "https://93.184.216.34/mcp", ["93.184.216.34"]),
        ("https://8.8.8.8/", "https://8.8.8.8/", ["8.8.8.8"]),
        ("https://100.128.0.1/", "https://100.128.0.1/", ["100.128.0.1"]),
        ("https://172.32.0.1/", "https://172.32.0.1/", ["172.32.0.1"]),
        (
            "https://[2606:2800:0220:0001:0248:1893:25C8:1946]:8443/mcp",
            "https://[2606:2800:220:1:248:1893:25c8:1946]:8443/mcp",
            ["2606:2800:220:1:248:1893:25c8:1946"],
        ),
        ("https://[64:ff9b::5db8:d822]/", "https://[64:ff9b::5db8:d822]/", ["64:ff9b::5db8:d822"]),
    ],
)
async def test_public_literals_are_admitted_without_any_lookup(url: str, normalized: str, addresses: list[str]) -> None:
    def no_lookups(host: str, port: int) -> Iterable[str]:
        raise AssertionError(f"literal {host} must not be resolved")

    policy = UrlPolicy(resolver=no_lookups)
    admitted = await policy.admit(url)
    assert admitted.url == normalized == str(admitted)
    assert admitted.addresses == tuple(ipaddress.ip_address(a) for a in addresses)
    assert policy.admit_sync(url) == admitted
    assert normalize_url(url) == normalized


async def test_admitted_url_exposes_its_parts() -> None:
    admitted = await UrlPolicy().admit("HTTPS://93.184.216.34:8443/Mcp/?x=1")
    assert admitted == AdmittedUrl(
        url="https://93.184.216.34:8443/Mcp/?x=1",
        scheme="https",
        host="93.184.216.34",
        port=8443,
        path="/Mcp/",
        addresses=(ipaddress.IPv4Address("93.184.216.34"),),
    )
    assert admitted.origin == "https://93.184.216.34:8443"
    default_port = await UrlPolicy().admit("http://93.184.216.34/")
    assert default_port.port == 80
    assert default_port.origin == "http://93.184.216.34"


async def test_localhost_is_refused_by_default() -> None:
    with pytest.raises(UrlRefused) as info:
        await UrlPolicy().admit("http://localhost:8080/mcp")
    assert info.value.category is C.LOOPBACK
    assert "refusing http://localhost:8080/mcp: localhost resolves to" in str(info.value)
    assert "a loopback address" in str(info.value)
    with pytest.raises(UrlRefused, match="localhost resolves to"):
        UrlPolicy().admit_sync("http://LOCALHOST/")


async def test_allow_loopback_admits_localhost_and_loopback_literals() -> None:
    policy = UrlPolicy(allow_loopback=True)
    admitted = await policy.admit("http://LocalHost:8080/mcp")
    assert admitted.url == "http://localhost:8080/mcp"
    assert admitted.addresses
    assert all(address.is_loopback for address in admitted.addresses)
    assert policy.admit_sync("http://localhost:8080/mcp").url == admitted.url
    for url in ("http://127.0.0.1:9000/", "http://[::1]:9000/", "http://127.9.9.9/", "http://[::ffff:127.0.0.1]/"):
        assert (await policy.admit(url)).port in (80, 9000)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/",
        "http://10.255.255.255:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://192.168.0.1/",
        "http://172.20.1.1/",
        "http://169.254.10.10/",
        "http://[fe80::1]/",
        "http://[fd00::1]/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:10.0.0.5]/",
        "http://100.100.100.200/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://[::]/",
        "http://2130706433/",
    ],
)
async def test_allow_loopback_still_refuses_everything_but_loopback(url: str) -> None:
    policy = UrlPolicy(allow_loopback=True)
    with pytest.raises(UrlRefused) as info:
        await policy.admit(url)
    assert info.value.category is not C.LOOPBACK
    with pytest.raises(UrlRefused):
        policy.admit_sync(url)


def fixed(answers: dict[str, list[str]]) -> UrlPolicy:
    def resolve(host: str, port: int) -> Iterable[str]:
        if host not in answers:
            raise OSError(f"no such host {host}")
        return answers[host]

    return UrlPolicy(resolver=resolve)


async def test_a_name_is_refused_if_any_of_its_addresses_is_not_public() -> None:
    policy = fixed({"mixed.example": ["93.184.216.34", "10.1.2.3"], "public.example": ["93.184.216.34", "8.8.8.8"]})
    with pytest.raises(UrlRefused) as info:
        await policy.admit("https://mixed.example/mcp")
    assert info.value.category is C.PRIVATE
    assert (
        str(info.value) == "refusing https://mixed.example/mcp: mixed.example resolves to 10.1.2.3, a private address"
    )
    admitted = await policy.admit("https://Public.Example/mcp")
    assert admitted.host == "public.example"
    assert [str(a) for a in admitted.addresses] == ["93.184.216.34", "8.8.8.8"]


@pytest.mark.parametrize(
    ("answer", "category"),
    [
        ("169.254.169.254", C.METADATA),
        ("::ffff:169.254.169.254", C.METADATA),
        ("fe80::1%eth0", C.LINK_LOCAL),
        ("127.0.0.53", C.LOOPBACK),
        ("100.64.1.1", C.CGNAT),
    ],
)
def test_names_resolving_to_forbidden_addresses_are_refused(answer: str, category: RefusalCategory) -> None:
    with pytest.raises(UrlRefused) as info:
        fixed({"rebind.example": [answer]}).admit_sync("http://rebind.example/")
    assert info.value.category is category
    assert "rebind.example resolves to" in str(info.value)


async def test_unresolvable_names_are_refused() -> None:
    policy = fixed({"empty.example": []})
    for url in ("http://nowhere.example/", "http://empty.example/"):
        with pytest.raises(UrlRefused) as info:
            await policy.admit(url)
        assert info.value.category is C.UNRESOLVABLE
        assert "does not resolve" in str(info.value)
        with pytest.raises(UrlRefused, match="does not resolve"):
            policy.admit_sync(url)


async def test_garbage_resolver_answers_are_refused() -> None:
    with pytest.raises(UrlRefused, match="unreadable address") as info:
        await fixed({"odd.example": ["not-an-ip"]}).admit("http://odd.example/")
    assert info.value.category is C.UNRESOLVABLE


async def test_slow_resolution_is_bounded_by_the_timeout() -> None:
    import threading

    release = threading.Event()

    def slow(host: str, port: int) -> Iterable[str]:
        release.wait(5)
        return ["93.184.216.34"]

    policy = UrlPolicy(resolve_timeout=0.05, resolver=slow)
    try:
        with pytest.raises(UrlRefused, match=r"timed out after 0\.05 s") as info:
            await policy.admit("http://slow.example/")
        assert info.value.category is C.UNRESOLVABLE
        with pytest.raises(UrlRefused, match="timed out"):
            policy.admit_sync("http://slow.example/")
    finally:
        release.set()


def test_the_resolver_receives_the_normalized_host_and_effective_port() -> None:
    seen: list[tuple[str, int]] = []

    def record(host: str, port: int) -> Iterable[str]:
        seen.append((host, port))
        return ["93.184.216.34"]

    policy = UrlPolicy(resolver=record)
    policy.admit_sync("HTTPS://MCP.Example.COM/mcp")
    policy.admit_sync("http://mcp.example.com:8080/")
    assert seen == [("mcp.example.com", 443), ("mcp.example.com", 8080)]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp/", True),
        ("https://MCP.example.com:443/mcp", "https://mcp.example.com/mcp", True),
        ("https://mcp.example.com", "https://mcp.example.com/", True),
        ("https://mcp.example.com/mcp?x=1#f", "https://mcp.example.com/mcp", True),
        ("https://mcp.example.com/mcp", "http://mcp.example.com/mcp", False),
        ("https://mcp.example.com/mcp", "https://mcp.example.com:8443/mcp", False),
        ("https://mcp.example.com/mcp", "https://mcp.example.com/MCP", False),
        ("https://mcp.example.com/mcp", "https://other.example.com/mcp", False),
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp/v2", False),
        ("https://[::1]/mcp", "https://[0:0::1]:443/mcp/", True),
        ("not a url", "not a url", False),
        ("ftp://mcp.example.com/", "ftp://mcp.example.com/", False),
    ],
)
def test_same_origin_path_ignores_case_default_port_and_trailing_slash(a: str, b: str, same: bool) -> None:
    assert same_origin_path(a, b) is same
    assert same_origin_path(b, a) is same
    assert AdmittedUrl.same_origin_path(a, b) is same


async def test_same_origin_path_accepts_admitted_urls() -> None:
    admitted = await UrlPolicy().admit("https://93.184.216.34/mcp/")
    assert same_origin_path(admitted, "HTTPS://93.184.216.34:443/mcp")
    assert not same_origin_path(admitted, "https://93.184.216.34/other")


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("93.184.216.34", None),
        ("2606:2800:220:1:248:1893:25c8:1946", None),
        ("127.0.0.1", C.LOOPBACK),
        ("::ffff:127.0.0.1", C.LOOPBACK),
        ("10.0.0.1", C.PRIVATE),
        ("169.254.169.254", C.METADATA),
        ("fd00:ec2::254", C.METADATA),
        ("fe80::1%eth0", C.LINK_LOCAL),
        ("100.64.0.1", C.CGNAT),
        ("239.1.1.1", C.MULTICAST),
        ("0.0.0.0", C.UNSPECIFIED),
        ("::", C.UNSPECIFIED),
        ("2001:db8::1", C.RESERVED),
    ],
)
def test_classify_address(address: str, category: RefusalCategory | None) -> None:
    assert classify_address(address) is category


def test_permits_judges_single_peer_addresses_under_the_policy() -> None:
    assert UrlPolicy().permits("93.184.216.34")
    assert not UrlPolicy().permits("127.0.0.1")
    assert UrlPolicy(allow_loopback=True).permits(ipaddress.ip_address("::1"))
    assert not UrlPolicy(allow_loopback=True).permits("10.0.0.1")
    assert not UrlPolicy().permits("garbage")


def test_refusal_category_values_are_stable_strings() -> None:
    assert C.LINK_LOCAL.value == "link_local"
    assert {c.value for c in C} >= {"private", "loopback", "metadata", "cgnat", "userinfo", "scheme", "port"}
