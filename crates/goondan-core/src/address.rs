//! Which IP addresses are public: the one rule the SSRF guard (URLs a model
//! fetches) and the sandbox's network proxy (connections a confined command
//! asks for) both apply to the address they are about to connect to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` is not a public address, or `None` if it is.
///
/// IPv6 addresses that embed an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4
/// `2002:aabb:ccdd::`) are judged by the IPv4 address, since that is where a
/// connection to them ends up.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// True if `ip` is a public (globally routable unicast) address.
pub fn is_public(ip: IpAddr) -> bool {
    non_public_reason(ip).is_none()
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let reason = match (a, b, c) {
        (0, _, _) => "the unspecified / \"this network\" range (0.0.0.0/8)",
        (10, _, _) => "a private address (10.0.0.0/8)",
        (100, 64..=127, _) => "a shared (carrier-grade NAT) address (100.64.0.0/10)",
        (127, _, _) => "a loopback address (127.0.0.0/8)",
        (169, 254, _) => "a link-local address (169.254.0.0/16, incl. the cloud metadata service)",
        (172, 16..=31, _) => "a private address (172.16.0.0/12)",
        (192, 0, 0) => "an IETF protocol assignment (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation address (TEST-NET)",
        (192, 88, 99) => "a 6to4 relay anycast address (192.88.99.0/24)",
        (192, 168, _) => "a private address (192.168.0.0/16)",
        (198, 18..=19, _) => "a benchmarking address (198.18.0.0/15)",
        (224..=239, _, _) => "a multicast address (224.0.0.0/4)",
        _ if ip.is_broadcast() => "the broadcast address",
        (240..=255, _, _) => "a reserved address (240.0.0.0/4)",
        _ => return None,
    };
    Some(reason)
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    // Before the embedded forms: `::` and `::1` also read as IPv4-compatible.
    if ip.is_unspecified() {
        return Some("the unspecified address (::)");
    }
    if ip.is_loopback() {
        return Some("the loopback address (::1)");
    }
    if let Some(v4) = embedded_v4(ip) {
        return v4_reason(v4);
    }
    let segments = ip.segments();
    let reason = match segments[0] {
        0xff00..=0xffff => "a multicast address (ff00::/8)",
        0xfe80..=0xfebf => "a link-local address (fe80::/10)",
        0xfec0..=0xfeff => "a site-local address (fec0::/10)",
        0xfc00..=0xfdff => "a unique-local address (fc00::/7)",
        0x0064 if segments[1] == 0xff9b && segments[2] == 0x0001 => "a local-use NAT64 address (64:ff9b:1::/48)",
        0x0100 if segments[1..4] == [0, 0, 0] => "a discard-only address (100::/64)",
        0x2001 if segments[1] == 0x0db8 => "a documentation address (2001:db8::/32)",
        0x2001 if segments[1] < 0x0200 => "an IETF protocol assignment (2001::/23, incl. Teredo)",
        0x3fff if segments[1] < 0x1000 => "a documentation address (3fff::/20)",
        0x5f00 => "a segment-routing address (5f00::/16)",
        // Only 2000::/3 is allocated for global unicast; everything else is
        // reserved by IANA.
        0x2000..=0x3fff => return None,
        _ => "a reserved IPv6 address (outside 2000::/3)",
    };
    Some(reason)
}

/// The IPv4 address a connection to `ip` really reaches, for the IPv6 forms
/// that embed one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        // IPv4-mapped (::ffff:0:0/96) and the deprecated IPv4-compatible
        // (::/96, which also holds :: and ::1: they map to 0.0.0.0/8).
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        // NAT64 well-known prefix (64:ff9b::/96).
        [0x0064, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        // 6to4 (2002::/16): the IPv4 address is in bits 16..48.
        [0x2002, hi, lo, ..] => Some(low(hi, lo)),
        _ => None,
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) as the IPv4 address they
/// are; every other address unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn public_addresses() {
        for text in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "169.253.1.1",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip(text)), "{text} should be public");
            assert_eq!(non_public_reason(ip(text)), None, "{text}");
        }
    }

    #[test]
    fn non_public_addresses() {
        for text in [
            // IPv4
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "100::1",
            "64:ff9b:1::1",
            "5f00::1",
            "4000::1",
            "1::1",
            // IPv6 forms that embed a non-public IPv4 address
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::10.1.2.3",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ] {
            assert!(!is_public(ip(text)), "{text} should not be public");
        }
    }

    #[test]
    fn reasons_name_the_range() {
        let reason = |text| non_public_reason(ip(text)).unwrap_or("public");
        assert!(reason("127.0.0.1").contains("loopback"));
        assert!(reason("::1").contains("loopback"));
        assert!(reason("::ffff:127.0.0.1").contains("loopback"));
        assert!(reason("10.0.0.1").contains("private"));
        assert!(reason("169.254.169.254").contains("metadata"));
        assert!(reason("fe80::1").contains("link-local"));
        assert!(reason("fd00::1").contains("unique-local"));
        assert!(reason("100.64.0.1").contains("carrier-grade NAT"));
        assert!(reason("255.255.255.255").contains("broadcast"));
        assert!(reason("224.0.0.1").contains("multicast"));
    }

    #[test]
    fn canonical_unwraps_ipv4_mapped_addresses() {
        assert_eq!(canonical(ip("::ffff:127.0.0.1")), ip("127.0.0.1"));
        assert_eq!(canonical(ip("::1")), ip("::1"));
        assert_eq!(canonical(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
